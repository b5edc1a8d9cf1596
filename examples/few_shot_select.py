"""Classification with a long few-shot prefix and ``select``, over many inputs.

The few-shot prefix (instructions + labelled examples) is identical for every input: ``run_batch`` traces
it and prefills it once, and each ``select`` scores all labels in one prefill-only request whose context
comes from the radix cache. The report shows each prediction with its per-label scores, the accuracy
against the gold labels and how many prompt tokens came from the cache.

    python examples/few_shot_select.py [--backend tcp://127.0.0.1:30001 | http://... | engine] [--small]
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

LABELS = ["positive", "negative", "neutral"]
SHOTS = [
    ("I loved this film, the acting was wonderful.", "positive"),
    ("The food was cold and the waiter was rude.", "negative"),
    ("The package arrived on Tuesday.", "neutral"),
    ("What a fantastic concert, I would go again!", "positive"),
    ("This phone broke after two days. Terrible.", "negative"),
    ("The meeting is scheduled for 3 pm.", "neutral"),
    ("Best holiday of my life, everything was perfect.", "positive"),
    ("I want a refund, this is the worst service ever.", "negative"),
    ("The store opens at nine in the morning.", "neutral"),
    ("The new update made the app so much faster, great job.", "positive"),
    ("The hotel room was dirty and smelled bad.", "negative"),
    ("The report has twelve pages.", "neutral"),
]
INPUTS = [
    ("This book was a delight from start to finish.", "positive"),
    ("The train was late again, so annoying.", "negative"),
    ("The museum is on Main Street.", "neutral"),
    ("Amazing pizza, friendly staff!", "positive"),
    ("My order never arrived and nobody answers.", "negative"),
    ("The bus leaves every 20 minutes.", "neutral"),
    ("I am so happy with my new bike.", "positive"),
    ("The movie was boring and far too long.", "negative"),
    ("The library has three floors.", "neutral"),
    ("Wonderful weather for the picnic today!", "positive"),
    ("The software keeps crashing, awful.", "negative"),
    ("The class starts in September.", "neutral"),
    ("Thank you, this gift is perfect.", "positive"),
    ("The coffee tasted burnt and bitter.", "negative"),
    ("The form asks for your address.", "neutral"),
    ("Great service, I will come back.", "positive"),
    ("The seats were broken and uncomfortable.", "negative"),
    ("The river flows to the sea.", "neutral"),
    ("Such a beautiful and moving story.", "positive"),
    ("I regret buying this, total waste of money.", "negative"),
    ("The shop sells fruit and vegetables.", "neutral"),
    ("Brilliant performance by the whole team!", "positive"),
    ("The instructions were confusing and wrong.", "negative"),
    ("The office is closed on Sundays.", "neutral"),
]
PREFIX = "Classify the sentiment of each review as positive, negative or neutral.\n\n" + "".join(
    f"Review: {t}\nSentiment: {y}\n\n" for t, y in SHOTS
)


@rt.function
def classify(s: Any, review: str) -> None:
    s += PREFIX
    s += "Review: " + review + "\nSentiment: "
    s += rt.select("label", LABELS)


def main(argv: Optional[list[str]] = None, backend: Any = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_backend_arg(p)
    p.add_argument("--small", action="store_true", help="6 inputs (for tests)")
    a = p.parse_args(argv)
    items = INPUTS[:6] if a.small else INPUTS
    b = make_backend(backend if backend is not None else a.backend)
    t0 = time.perf_counter()
    states = classify.run_batch([{"review": t} for t, _ in items], backend=b, progress_bar=True)
    wall = time.perf_counter() - t0
    correct = 0
    print(f"{'prediction':<10} {'gold':<10} " + " ".join(f"{x[:8]:>8}" for x in LABELS) + "  review")
    for (text, gold), st in zip(items, states):
        if st.error() is not None:
            print(f"error: {st.error()}  <- {text}")
            continue
        scores = st.get_meta_info("label")["scores"]
        correct += st["label"] == gold
        print(f"{st['label']:<10} {gold:<10} " + " ".join(f"{x:8.3f}" for x in scores) + f"  {text}")
    u = token_usage(states)
    print(
        f"\naccuracy {correct}/{len(items)}; cached-token share {100 * u['cached_share']:.1f} % "
        f"({u['cached_tokens']} of {u['prompt_tokens']} prompt tokens); {len(items) / wall:.2f} inputs/s"
    )
    return {
        "inputs": len(items),
        "correct": correct,
        "errors": sum(st.error() is not None for st in states),
        "cached_share": u["cached_share"],
        "labels": [st["label"] for st in states if st.error() is None],
    }


if __name__ == "__main__":
    main()
