"""Where the wall time of a bench_spec workload goes, speculation on vs off (issue 27).

    cpuslot --all python benchmarks/spec_breakdown.py [--algos none,suffix] [--workloads a,b] [--warm-system]

The bench's workloads (benchmarks/bench_spec.py) run on in-process Engines whose scheduler methods are
wrapped with timers. A step is a *prefill* step when one of its rows computes prompt tokens (an extend
chunk), else a *decode* step (plain decode rows and draft-carrying rows). Per workload and engine:

    wall        seconds of the whole workload (the bench's denominator)
    prefill     seconds of the prefill steps (their forward and their scheduling)
    dec fwd     seconds in ModelRunner.forward of the decode steps
    dec over    the rest of the decode steps: schedule (drafting included), prepare, sampling/verification,
                caching, output collection
    outside     wall minus all steps: the scheduler thread's inbox/detokenizer work, the client's
                tokenization and result assembly, idle waits between dependent calls
and per-step means of the decode steps (ms): forward, schedule, propose (drafting), prepare, sample
(plain rows), accept (verifying the draft rows), and the forward time of B=1 decode steps by tokens T (the verify cost
curve t(T)).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import bench_spec as B  # noqa: E402
from radixrt import Engine  # noqa: E402
from radixrt.runtime.models.loader import load_tokenizer  # noqa: E402


class Probe:
    """Timers around one Engine's scheduler methods; ``steps`` lists ``(kind, T, rows, seconds, forward
    seconds, {part: seconds})`` per step that ran a batch (``T``: tokens computed, drafts included)."""

    def __init__(self, e: Engine):
        self.acc: dict[str, float] = defaultdict(float)
        self.steps: list[tuple] = []
        self.step_parts: dict[str, float] = {}
        s = e.scheduler
        for obj, name, key in (
            (s, "schedule", "schedule"),
            (s.runner, "prepare", "prepare"),
            (s.runner, "forward", "forward"),
            (s.outputs, "process", "sample"),
            (s.spec, "accept", "accept"),
            (s.spec, "propose", "propose"),
            (s.req_pages, "cache", "cache"),
            (s, "collect_outputs", "collect"),
            (e.detokenizer, "handle_one", "detok"),
        ):
            self._wrap(obj, name, key)
        orig_step, orig_schedule = s.step, s.schedule

        def schedule():
            b = orig_schedule()
            self._kind = "decode" if all(row.req.extend_len == 1 for row in b) else "prefill"
            self._batch = list(b)
            return b

        def step():  # the parts timed while a step runs (the detokenizer's work is outside, in _loop)
            self.step_parts = defaultdict(float)
            self._batch = []
            t0 = time.perf_counter()
            out = orig_step()
            dt = time.perf_counter() - t0
            if self._batch:
                kind = self._kind
                T = sum(row.n for row in self._batch)
                self.steps.append(
                    (kind, T, len(self._batch), dt, self.step_parts.get("forward", 0.0), dict(self.step_parts))
                )
            return out

        s.schedule, s.step = schedule, step

    def _wrap(self, obj, name: str, key: str) -> None:
        f = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                self.acc[key] += dt
                if isinstance(self.step_parts, defaultdict):
                    self.step_parts[key] += dt

        setattr(obj, name, timed)

    def reset(self) -> None:
        self.acc.clear()
        self.steps.clear()


def summarize(name: str, wall: float, tokens: int, p: Probe) -> str:
    pre = [s for s in p.steps if s[0] == "prefill"]
    dec = [s for s in p.steps if s[0] == "decode"]
    steps_t = sum(s[3] for s in p.steps)
    pre_t, dec_t = sum(s[3] for s in pre), sum(s[3] for s in dec)
    dec_f = sum(s[4] for s in dec)
    n = max(1, len(dec))
    part = defaultdict(float)
    for s in dec:
        for k, v in s[5].items():
            part[k] += v
    out = [
        f"  {name:7s} wall {wall:6.2f}s tok {tokens:4d} | prefill {pre_t:5.2f}s ({len(pre)} st) "
        f"{100 * pre_t / wall:4.1f}% | dec fwd {dec_f:5.2f}s {100 * dec_f / wall:4.1f}% | dec over "
        f"{dec_t - dec_f:5.2f}s {100 * (dec_t - dec_f) / wall:4.1f}% ({len(dec)} st) | outside "
        f"{wall - steps_t:5.2f}s {100 * (wall - steps_t) / wall:4.1f}%",
        "          per decode step ms: "
        + " ".join(
            f"{k} {1000 * part[k] / n:.2f}"
            for k in ("forward", "schedule", "propose", "prepare", "sample", "accept", "collect")
        )
        + f" | total {1000 * dec_t / n:.2f} | detok/step {1000 * p.acc['detok'] / max(1, len(p.steps)):.2f}",
    ]
    curve = defaultdict(list)
    for s in dec:
        if s[2] == 1:
            curve[s[1]].append(s[4])
    if curve:
        out.append(
            "          B=1 decode fwd ms by T: "
            + " ".join(f"{T}:{1000 * sorted(v)[len(v) // 2]:.1f}(n{len(v)})" for T, v in sorted(curve.items()))
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", default="none,suffix")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--max-batch", type=int, default=0)
    ap.add_argument("--no-adaptive", action="store_true")
    ap.add_argument("--workloads", default="")
    ap.add_argument(
        "--warm-system", action="store_true", help="prefill each workload's shared system message first (bench_spec.py)"
    )
    a = ap.parse_args()
    wl, systems = B.workloads(load_tokenizer(), a)
    if a.workloads:
        wl = {k: wl[k] for k in a.workloads.split(",")}
    engines = {n: Engine(speculative_algorithm=n, max_total_tokens=32768) for n in a.algos.split(",")}
    probes = {n: Probe(e) for n, e in engines.items()}
    for e in engines.values():
        e.generate("Warm up.", {"temperature": 0, "max_new_tokens": 4})
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at start")
    for w, fn in wl.items():
        print(w)
        for n, e in engines.items():
            e.flush_cache()
            warm = systems.get(w) if a.warm_system else None
            if warm:
                e.generate(warm, {"temperature": 0, "max_new_tokens": 1, "speculative": False})
            probes[n].reset()
            t0 = time.perf_counter()
            outs = fn(e)
            wall = time.perf_counter() - t0
            print(summarize(n, wall, sum(len(o["output_ids"]) for o in outs), probes[n]), flush=True)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at end")
    for e in engines.values():
        e.shutdown()


if __name__ == "__main__":
    main()
