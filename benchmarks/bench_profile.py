"""``radixrt profile`` against the live server: does replaying a request log reproduce the hit rate the
server reported? (issue 16: within 1 point on the benchmark suite's own logs.)

    python benchmarks/bench_profile.py                       # every workload, radixrt only, default sizes
    python benchmarks/bench_profile.py --workloads shared-prefix --preset tiny

Runs ``run_all.py --systems radixrt`` once with ``--request-log``, then splits the log at its
``flush_cache`` markers (the suite flushes the cache before each workload, so the first segment is the
warm-up and each later one a workload, in order), replays each segment through the tree at the server's pool
size and page size with its eviction policy, and prints the live and replayed hit rates side by side. Writes
``benchmarks/results/profile_vs_live.json`` and, for docs/cache.md, the ``radixrt profile`` table of one log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from radixrt.runtime.profile.logs import read_request_log  # noqa: E402
from radixrt.runtime.profile.replay import replay  # noqa: E402


def segments(path: str) -> list[list]:
    """The log's requests split at each flush marker."""
    out: list[list] = [[]]
    for r in read_request_log(path):
        if r.flush:
            out.append([])
        else:
            out[-1].append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="shared-prefix,agent-loop,multi-turn-chat,few-shot-select,json-decode")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--policy", default="gdsf", help="the server's --eviction-policy (and the replay's)")
    ap.add_argument("--out", default=str(HERE / "results" / "profile_vs_live.json"))
    ap.add_argument("--work-dir", default=None, help="where the run's log and bench.json go (default: a temp dir)")
    a = ap.parse_args()
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="radixrt-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "requests.jsonl"
    if log.exists():
        log.unlink()
    cmd = [
        sys.executable,
        str(HERE / "run_all.py"),
        "--systems",
        "radixrt",
        "--workloads",
        a.workloads,
        "--preset",
        a.preset,
        "--out-dir",
        str(work),
        "--radixrt-args",
        f"--request-log {log} --eviction-policy {a.policy}",
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    bench = json.loads((work / "bench.json").read_text())
    pool = int(bench["systems"]["radixrt"]["describe"]["max_total_tokens"])
    names = [w for w in bench["workloads"] if "radixrt" in bench["workloads"][w]]
    segs = segments(str(log))[1:]  # the first segment is the warm-up
    if len(segs) != len(names):
        raise SystemExit(f"{len(segs)} log segments for {len(names)} workloads: {names}")
    rows = []
    for name, reqs in zip(names, segs):
        live = bench["workloads"][name]["radixrt"]["summary"]["hit_rate"]
        res = replay(reqs, pool // 16, 16, a.policy)
        seq = replay([type(r)(**{**r.__dict__, "start": None}) for r in reqs], pool // 16, 16, a.policy)
        rows.append(
            {
                "workload": name,
                "requests": len(reqs),
                "live_hit_rate": live,
                "profile_hit_rate": res.hit_rate,
                "profile_sequential_hit_rate": seq.hit_rate,
                "diff_points": 100 * (res.hit_rate - live),
            }
        )
        print(
            f"{name:<18} live {100 * live:5.1f}%  profile {100 * res.hit_rate:5.1f}%  "
            f"(diff {100 * (res.hit_rate - live):+.1f} points; one-at-a-time replay {100 * seq.hit_rate:5.1f}%)",
            flush=True,
        )
    worst = max(abs(r["diff_points"]) for r in rows)
    print(f"worst |profile - live| = {worst:.2f} points -> {'within' if worst <= 1 else 'NOT within'} 1 point")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(
            {"pool_tokens": pool, "policy": a.policy, "rows": rows, "worst_points": worst, "log": str(log)}, f, indent=1
        )


if __name__ == "__main__":
    main()
