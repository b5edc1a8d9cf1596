"""The profile behind ``radixrt profile LOG`` (the command: ``server/profile_cmd.py``): would a radix cache
help this traffic, and how much memory does it need?

Replays the log through the real radix tree and page allocator (``replay.py``, no model) for every page
size x cache size x eviction policy, and prints per row the hit rate next to the optimal one (the same replay
with a cache that never evicts), the prefill tokens saved and, given a prefill speed (``--prefill-tokens-
per-s``, or ``--measure-prefill`` on this machine's model), the prefill time saved. Writes a PNG of hit rate
against cache size, one line per policy (``--plot``), and the rows as JSON (``--json``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Optional

from tqdm import tqdm

from radixrt.runtime.mem.eviction import POLICIES
from radixrt.runtime.profile.replay import ReplayReq, Replayer, pages_needed, replay

AUTO_SHARES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class Row:
    page_size: int
    cache_tokens: int
    policy: str
    hit_rate: float
    optimal_hit_rate: float
    query_tokens: int
    saved_tokens: int
    saved_seconds: Optional[float]
    overflow: int
    host_hit_rate: Optional[float] = None  # of the hit rate, pages restored from tier 2 (replays with tiers)
    disk_hit_rate: Optional[float] = None  # ... and from tier 3


def parse_ints(s: str, name: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of integers, got {s!r}") from None
    if not out or min(out) < 1:
        raise ValueError(f"{name} must list positive integers, got {s!r}")
    return out


def auto_cache_sizes(reqs: list[ReplayReq], page_size: int) -> list[int]:
    """Token sizes from what the largest request needs to what an unbounded cache ends up holding."""
    r = Replayer(pages_needed(reqs, page_size), page_size)
    r.run(reqs)
    foot = r.tree.total_pages_in_tree if r.tree is not None else 0
    floor = max(-(-(q.prompt_len + q.output_len) // page_size) for q in reqs) + 1
    foot = max(foot, floor)
    return sorted({(floor + int((foot - floor) * s)) * page_size for s in AUTO_SHARES})


def profile(
    reqs: list[ReplayReq],
    page_sizes: list[int],
    cache_sizes: Optional[list[int]] = None,
    policies: Optional[list[str]] = None,
    prefill_tps: Optional[float] = None,
    progress: bool = False,
    tier2_tokens: int = 0,
    tier3_tokens: Optional[int] = None,
) -> list[Row]:
    """One row per page size x cache size (tokens) x policy. ``cache_sizes`` None: ``auto_cache_sizes`` of
    the first page size. ``tier2_tokens`` > 0: each cache has a host tier of that size under it (the
    server's ``--hicache-size``), and with ``tier3_tokens`` files too (0: unbounded); rows then split the
    hit rate by tier. Raises ValueError on an unknown policy, a page size the log cannot express, or tier 3
    without tier 2."""
    if not reqs:
        raise ValueError("the log holds no requests")
    if tier3_tokens is not None and tier2_tokens <= 0:
        raise ValueError("tier3_tokens needs tier2_tokens > 0 (tier 3 sits under tier 2)")
    policies = list(policies or POLICIES)
    sizes = cache_sizes or auto_cache_sizes(reqs, page_sizes[0])
    total = len(page_sizes) * (1 + len(sizes) * len(policies))
    rows: list[Row] = []
    with tqdm(total=total, desc="replay", unit="run", disable=not progress, file=sys.stderr) as bar:
        for ps in page_sizes:
            opt = replay(reqs, pages_needed(reqs, ps), ps).hit_rate
            bar.update()
            for size in sizes:
                for pol in policies:
                    host = max(tier2_tokens // ps, 1) if tier2_tokens > 0 else 0
                    disk = None if tier3_tokens is None else tier3_tokens // ps
                    res = replay(reqs, max(size // ps, 1), ps, pol, host, disk)
                    secs = res.hit_tokens / prefill_tps if prefill_tps else None
                    q = max(res.query_tokens, 1)
                    rows.append(
                        Row(
                            ps,
                            size,
                            pol,
                            res.hit_rate,
                            opt,
                            res.query_tokens,
                            res.hit_tokens,
                            secs,
                            res.overflow,
                            res.host_hit_tokens / q if host else None,
                            res.disk_hit_tokens / q if disk is not None else None,
                        )
                    )
                    bar.update()
    return rows


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'page':>5} {'cache tokens':>13} {'policy':>7} {'hit rate':>9} {'optimal':>8} "
        f"{'prefill tokens saved':>21} {'prefill s saved':>16} {'overflow':>9}"
    )
    tiers = any(r.host_hit_rate is not None for r in rows)
    if tiers:
        head += f" {'from tier 2':>12} {'from tier 3':>12}"
    lines = [head, "-" * len(head)]
    for r in rows:
        secs = f"{r.saved_seconds:.1f}" if r.saved_seconds is not None else "n/a"
        line = (
            f"{r.page_size:>5} {r.cache_tokens:>13} {r.policy:>7} {100 * r.hit_rate:>8.1f}% "
            f"{100 * r.optimal_hit_rate:>7.1f}% {r.saved_tokens:>21} {secs:>16} {r.overflow:>9}"
        )
        if tiers:
            line += "".join(
                f" {100 * v:>11.1f}%" if v is not None else f" {'n/a':>12}" for v in (r.host_hit_rate, r.disk_hit_rate)
            )
        lines.append(line)
    return "\n".join(lines)


def plot(rows: list[Row], path: str, title: str = "") -> None:
    """Hit rate against cache size, one line per policy, one panel per page size; optimum dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pages = sorted({r.page_size for r in rows})
    fig, axes = plt.subplots(1, len(pages), figsize=(5.5 * len(pages), 4), squeeze=False)
    for ax, ps in zip(axes[0], pages):
        sub = [r for r in rows if r.page_size == ps]
        for pol in dict.fromkeys(r.policy for r in sub):
            pts = sorted((r.cache_tokens, 100 * r.hit_rate) for r in sub if r.policy == pol)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=pol)
        ax.axhline(100 * sub[0].optimal_hit_rate, ls="--", color="gray", label="optimal (no eviction)")
        ax.set_xscale("log")
        ax.set_xlabel("cache size (tokens)")
        ax.set_ylabel("hit rate (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"{title} page size {ps}".strip())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure_prefill_tps(model: Optional[str], tokens: int = 512, repeats: int = 3) -> float:
    """Prefill tokens/s of ``model`` on this machine: a ``tokens``-long prompt, one output token, no cache."""
    from radixrt import Engine

    e = Engine(model=model, max_total_tokens=4 * tokens, disable_radix_cache=True)
    try:
        ids = [100 + (i * 7919) % 20000 for i in range(tokens)]
        sp = {"max_new_tokens": 1, "temperature": 0}
        e.generate(input_ids=ids, sampling_params=sp)  # warm-up
        t = time.perf_counter()
        for _ in range(repeats):
            e.generate(input_ids=ids, sampling_params=sp)
        return tokens * repeats / (time.perf_counter() - t)
    finally:
        e.shutdown()
