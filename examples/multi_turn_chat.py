"""A multi-turn conversation: every turn resends the whole history, which the radix cache already holds.

The report prints, per turn, the prompt length and how many of its tokens came from the cache: from the
second turn on, nearly the whole prompt (everything up to the last page boundary of the earlier turns).

    python examples/multi_turn_chat.py [--backend tcp://127.0.0.1:30001 | http://... | engine] [--small]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import radixrt as rt  # noqa: E402
from _util import add_backend_arg, make_backend  # noqa: E402

TURNS = [
    "Hi! I'm planning a trip to Japan in spring. What city should I start in?",
    "How many days would you spend there?",
    "What food should I try first?",
    "Is it easy to travel by train between cities?",
    "Thanks! Can you summarize the plan in one sentence?",
]


@rt.function
def chat(s: Any, turns: list[str], max_tokens: int) -> None:
    s += rt.system("You are a friendly travel assistant. Keep answers short.")
    for i, t in enumerate(turns):
        s += rt.user(t)
        s += rt.assistant(rt.gen(f"turn_{i}", max_tokens=max_tokens, temperature=0))


def main(argv: Optional[list[str]] = None, backend: Any = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_backend_arg(p)
    p.add_argument("--small", action="store_true", help="3 turns of at most 16 tokens (for tests)")
    a = p.parse_args(argv)
    turns, mt = (TURNS[:3], 16) if a.small else (TURNS, 64)
    b = make_backend(backend if backend is not None else a.backend)
    t0 = time.perf_counter()
    st = chat.run(turns=turns, max_tokens=mt, backend=b)
    wall = time.perf_counter() - t0
    if st.error() is not None:
        print(f"error: {st.error()}")
        return {"error": st.error()}
    rows = []
    for i, t in enumerate(turns):
        m = st.get_meta_info(f"turn_{i}")
        rows.append(
            {
                "prompt_tokens": m["prompt_tokens"],
                "cached_tokens": m["cached_tokens"],
                "completion_tokens": m["completion_tokens"],
            }
        )
        print(f"[turn {i + 1}] user: {t}\n          assistant: {st[f'turn_{i}'].strip()}")
        print(
            f"          prompt {m['prompt_tokens']} tokens, cached {m['cached_tokens']} "
            f"({100 * m['cached_tokens'] / m['prompt_tokens']:.0f} %), "
            f"{m['e2e_latency'] * 1000:.0f} ms"
        )
    total_p = sum(r["prompt_tokens"] for r in rows)
    total_c = sum(r["cached_tokens"] for r in rows)
    print(
        f"\n{len(turns)} turns in {wall:.1f} s; {total_c} of {total_p} prompt tokens came from the cache "
        f"({100 * total_c / total_p:.1f} %)"
    )
    return {"turns": rows, "messages": st.messages(), "error": None}


if __name__ == "__main__":
    main()
