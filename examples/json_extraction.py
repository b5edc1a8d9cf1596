"""Structured records from free text: a pydantic model is the JSON schema every output is generated under.

python examples/json_extraction.py [--backend tcp://127.0.0.1:30001 | http://... | engine] [--small]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pydantic import BaseModel, Field, ValidationError  # noqa: E402

import radixrt as rt  # noqa: E402
from _util import add_backend_arg, make_backend, token_usage  # noqa: E402

WORD = "[A-Z][a-z]{1,15}"


class Person(BaseModel):
    """Every string is bounded by its pattern, so a record always fits in ``MAX_TOKENS``."""

    name: str = Field(pattern=f"^{WORD}( {WORD}){{0,2}}$")
    age: int = Field(ge=0, le=120)
    city: str = Field(pattern=f"^{WORD}( {WORD})?$")
    occupation: str = Field(pattern="^[a-z]{1,15}( [a-z]{1,15})?$")


_W = "X" * 16
_LONGEST = {"name": " ".join([_W] * 3), "age": 120, "city": f"{_W} {_W}", "occupation": "x" * 15 + " " + "x" * 15}
# The longest record in characters (each token is >= 1 character, nothing needs escaping) + end of turn.
MAX_TOKENS = len(json.dumps(_LONGEST, separators=(",", ":"))) + 1
TEXTS = [
    "Maria Lopez is a 34 year old nurse who lives in Madrid.",
    "At 52, Kenji Tanaka still works as a carpenter in Osaka.",
    "Our new neighbour, Paul Martin (29), is a teacher from Lyon.",
    "Aisha Bello, a software engineer, moved to Lagos when she turned 41.",
    "The baker in Vienna, Hans Gruber, celebrated his 60th birthday yesterday.",
    "Priya Sharma is 23 and studies law in Mumbai.",
    "Retired pilot Tom Walsh, 71, lives quietly in Dublin.",
    "Lucia Rossi, 38, runs a small restaurant in Rome as its chef.",
]
EXAMPLE_IN = "John Smith is a 45 year old plumber from Boston."
EXAMPLE_OUT = '{"name":"John Smith","age":45,"city":"Boston","occupation":"plumber"}'


@rt.function
def extract(s: Any, text: str) -> None:
    s += rt.system("Extract the person described in the text as a JSON object with name, age, city and occupation.")
    s += rt.user(EXAMPLE_IN)
    s += rt.assistant(EXAMPLE_OUT)
    s += rt.user(text)
    s += rt.assistant(rt.gen("record", json_schema=Person, max_tokens=MAX_TOKENS, temperature=0))


def main(argv: Optional[list[str]] = None, backend: Any = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_backend_arg(p)
    p.add_argument("--small", action="store_true", help="3 texts (for tests)")
    a = p.parse_args(argv)
    texts = TEXTS[:3] if a.small else TEXTS
    b = make_backend(backend if backend is not None else a.backend)
    t0 = time.perf_counter()
    states = extract.run_batch([{"text": t} for t in texts], backend=b, progress_bar=True)
    wall = time.perf_counter() - t0
    valid = 0
    print(f"{'name':<20} {'age':>4}  {'city':<12} {'occupation':<18} source")
    for t, st in zip(texts, states):
        if st.error() is not None:
            print(f"error: {st.error()}  <- {t}")
            continue
        try:
            r = Person.model_validate_json(st["record"])
            valid += 1
            print(f"{r.name:<20} {r.age:>4}  {r.city:<12} {r.occupation:<18} {t}")
        except ValidationError as e:
            print(f"INVALID {st['record']!r}: {e.errors()[0]['msg']}  <- {t}")
    u = token_usage(states)
    print(
        f"\nvalid records: {valid}/{len(texts)}; cached-token share {100 * u['cached_share']:.1f} %; "
        f"{u['completion_tokens']} tokens in {wall:.1f} s"
    )
    return {
        "texts": len(texts),
        "valid": valid,
        "cached_share": u["cached_share"],
        "wall_s": wall,
        "records": [st["record"] if st.error() is None else None for st in states],
    }


if __name__ == "__main__":
    main()
