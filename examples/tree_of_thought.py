"""Tree of thought: nested ``fork`` to grow branches, ``select`` to judge them.

For each question the assistant proposes ``--width`` approaches (first fork); each approach is carried
out ``--depth`` ways (a nested fork); every leaf is judged with ``select(["correct", "wrong"])`` and the
leaf with the best "correct" score becomes the answer. Every fork prefills its shared text once, so the
siblings' requests reuse it from the radix cache.

    python examples/tree_of_thought.py [--backend tcp://127.0.0.1:30001 | http://... | engine] [--small]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import radixrt as rt  # noqa: E402
from _util import add_backend_arg, make_backend, token_usage  # noqa: E402

QUESTIONS = [
    "A farmer has 17 sheep and buys 5 more, then sells 8. How many sheep are left?",
    "What is the sum of the angles of a triangle, in degrees?",
    "If a train travels 60 km in one hour, how far does it go in 3 hours?",
]
OPENERS = ["Let's count step by step.", "Let's write it as arithmetic.", "Let's think about it simply."]


@rt.function
def tree(s: Any, question: str, width: int, depth: int, max_tokens: int) -> dict:
    """Returns {"leaves": [(approach, answer, score)], "best": (approach, answer, score)}."""
    s += rt.system("You solve short math questions. Be brief.")
    s += rt.user(question)
    s += rt.assistant_begin()
    approaches = s.fork(width)
    approaches += (
        lambda i: OPENERS[i % len(OPENERS)] + " " + rt.gen("approach", max_tokens=max_tokens, stop="\n", temperature=0)
    )
    groups = []
    for a in approaches:  # every approach branches again; all leaves run concurrently
        outcomes = a.fork(depth)
        outcomes += lambda j: ("\nSo the answer is" if j == 0 else "\nTherefore the answer is") + rt.gen(
            "answer", max_tokens=max_tokens // 2, stop="\n", temperature=0
        )
        outcomes += (
            rt.assistant_end()
            + rt.user("Is that answer correct?")
            + rt.assistant_begin()
            + rt.select("verdict", ["correct", "wrong"])
        )
        groups.append((a, outcomes))
    leaves = []
    for a, outcomes in groups:
        for o in outcomes:
            scores = o.get_meta_info("verdict")["scores"]
            leaves.append((a["approach"].strip(), o["answer"].strip(), scores[0] - scores[1]))
        outcomes.join()
    approaches.join()
    best = max(leaves, key=lambda x: x[2])
    s += best[0] + " The answer is " + best[1] + "."
    s += rt.assistant_end()
    return {"leaves": leaves, "best": best}


def main(argv: Optional[list[str]] = None, backend: Any = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_backend_arg(p)
    p.add_argument("--small", action="store_true", help="1 question, 2x2 tree, short branches (for tests)")
    a = p.parse_args(argv)
    width, depth, mt = (2, 2, 12) if a.small else (3, 2, 32)
    questions = QUESTIONS[:1] if a.small else QUESTIONS
    b = make_backend(backend if backend is not None else a.backend)
    t0 = time.perf_counter()
    states = tree.run_batch(
        [{"question": q, "width": width, "depth": depth, "max_tokens": mt} for q in questions],
        backend=b,
        progress_bar=True,
    )
    wall = time.perf_counter() - t0
    for q, st in zip(questions, states):
        print(f"\nQ: {q}")
        if st.error() is not None:
            print(f"   error: {st.error()}")
            continue
        r = st.ret_value
        for approach, answer, score in r["leaves"]:
            mark = "*" if (approach, answer, score) == r["best"] else " "
            print(f" {mark} [{score:+.2f}] {approach[:60]!r} -> answer: {answer[:40]!r}")
        print(f"   best: {r['best'][1].strip()}")
    u = token_usage(states)
    print(
        f"\n{len(questions)} trees of {width}x{depth} leaves; cached-token share {100 * u['cached_share']:.1f} % "
        f"over {u['requests']} requests; {wall:.1f} s"
    )
    return {
        "questions": len(questions),
        "errors": sum(st.error() is not None for st in states),
        "leaves": [len(st.ret_value["leaves"]) if st.error() is None else 0 for st in states],
        "cached_share": u["cached_share"],
        "states": states,
    }


if __name__ == "__main__":
    main()
