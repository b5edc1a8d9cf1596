"""One PNG per workload (matplotlib, Agg): throughput bars per system, the TTFT and ITL distributions
(empirical CDFs, log time axis), and the hit rate next to the optimal one."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"radixrt": "#1f77b4", "radixrt-nocache": "#9ecae1", "hf-generate": "#ff7f0e", "llama.cpp": "#2ca02c"}


def _cdf(ax: Any, xs: list[float], label: str, color: str) -> None:
    if not xs:
        return
    s = sorted(x * 1000 for x in xs)
    s = [max(x, 1e-3) for x in s]
    ys = [(i + 1) / len(s) for i in range(len(s))]
    ax.step(s, ys, where="post", label=label, color=color)


def plot_workload(path: str, workload: str, description: str, runs: dict[str, dict], machine: str) -> str:
    """``runs``: system -> {"summary": ..., "ttfts": [...], "itls": [...]}; writes ``path`` and returns it."""
    systems = list(runs)
    colors = [COLORS.get(s, "#7f7f7f") for s in systems]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    headline = next(iter(runs.values()))["summary"].get("headline", "request_throughput")

    ax = axes[0][0]
    vals = [runs[s]["summary"].get(headline) or 0 for s in systems]
    bars = ax.bar(systems, vals, color=colors)
    unit = "req/s" if headline == "request_throughput" else "output tok/s"
    ax.set_title(f"throughput ({unit}, higher is better)")
    base = runs.get("radixrt", {}).get("summary", {}).get(headline)
    for b, v, s in zip(bars, vals, systems):
        txt = f"{v:.2f}"
        if base and v and s != "radixrt":
            txt += f"\nradixrt / this: {base / v:.2g}x"
        ax.annotate(txt, (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(vals + [1e-9]) * 1.3)
    ax.tick_params(axis="x", labelsize=8)

    ax = axes[0][1]
    for s, c in zip(systems, colors):
        _cdf(ax, runs[s]["ttfts"], s, c)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT distribution (CDF)")
    ax.legend(fontsize=8)

    ax = axes[1][0]
    for s, c in zip(systems, colors):
        _cdf(ax, runs[s]["itls"], s, c)
    ax.set_xscale("log")
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("share of gaps")
    ax.set_title("ITL distribution (CDF)")
    if any(runs[s]["itls"] for s in systems):
        ax.legend(fontsize=8)

    ax = axes[1][1]
    hits = [runs[s]["summary"].get("hit_rate") for s in systems]
    opt = [runs[s]["summary"].get("optimal_hit_rate") for s in systems]
    paged = [runs[s]["summary"].get("optimal_hit_rate_paged") for s in systems]
    bars = ax.bar(systems, [h or 0 for h in hits], color=colors)
    for b, h, o, p in zip(bars, hits, opt, paged):
        x = b.get_x()
        if o is not None:
            ax.hlines(o, x, x + b.get_width(), colors="k", linestyles="--")
        if p is not None:
            ax.hlines(p, x, x + b.get_width(), colors="k", linestyles=":")
        ax.annotate(
            "n/a" if h is None else f"{h:.1%}", (x + b.get_width() / 2, h or 0), ha="center", va="bottom", fontsize=8
        )
    ax.set_ylim(0, 1.05)
    ax.set_title("hit rate (dashed: optimal, dotted: in 16-token pages)", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)

    fig.suptitle(f"{workload}: {description}\n{machine}", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
