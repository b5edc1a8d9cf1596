"""Model-free generation under a grammar: random walks through the token mask, for soundness checks.

A walk asks the matcher for its mask, picks an allowed token at random, accepts it and repeats until it
accepts EOS (a *finished* output) or reaches ``max_tokens``. Every output a walk finishes is one the grammar
let through, so validating it against the JSON schema measures soundness without a model; the masks are
timed on the way (the per-token mask cost of the backend). The choice is biased toward short structural
tokens (quotes, brackets, digits, literals) and toward EOS so that most walks finish within a few hundred
tokens; it is seeded, so a failure reproduces.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

import numpy as np

from .base import allocate_token_bitmask

_CLOSERS = ('"', "}", "]", ",", ":", "0", "1", "7", "true", "false", "null", '",', '"}', "}}", '":', "]}")


@dataclass
class Walk:
    """One walk: the output ``text``, whether EOS ended it, and each mask fill's time in microseconds."""

    text: str
    finished: bool
    mask_us: list[float] = field(default_factory=list)


def closer_ids(tokenizer) -> np.ndarray:
    """Ids of the tokens whose text is one of the short structural pieces the walk prefers."""
    ids = set()
    for piece in _CLOSERS:
        enc = tokenizer.encode(piece, add_special_tokens=False)
        if len(enc) == 1:
            ids.add(enc[0])
    return np.array(sorted(ids), dtype=np.int64)


def random_walk(
    compiled, tokenizer, vocab_size: int, eos_id: int, rnd: random.Random, closers: np.ndarray, max_tokens: int = 256
) -> Walk:
    """Generate one output of ``compiled`` (a :class:`~.base.CompiledGrammar`) by a seeded random walk.

    Raises:
        AssertionError: the matcher refused a token its own mask allowed.
    """
    m = compiled.matcher()
    bm = allocate_token_bitmask(1, vocab_size)
    ids: list[int] = []
    walk = Walk("", False)
    for step in range(max_tokens + 1):
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bm, 0)
        walk.mask_us.append((time.perf_counter() - t0) * 1e6)
        bits = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[:vocab_size]
        if bits[eos_id] and (rnd.random() < 0.5 or step >= max_tokens // 2):
            assert m.accept_token(eos_id), "EOS allowed by the mask but refused"
            walk.finished = True
            break
        if step == max_tokens:
            break
        bits[eos_id] = 0
        pref = closers[bits[closers] == 1] if len(closers) else closers
        if len(pref) and rnd.random() < (0.9 if step >= max_tokens // 2 else 0.4):
            tok = int(pref[rnd.randrange(len(pref))])
        else:
            allowed = np.flatnonzero(bits)
            if not len(allowed):
                break  # nothing allowed and EOS not either: a dead end (reported as unfinished)
            tok = int(allowed[rnd.randrange(len(allowed))])
        assert m.accept_token(tok), f"token {tok} allowed by the mask but refused"
        ids.append(tok)
    walk.text = tokenizer.decode(ids, skip_special_tokens=False)
    return walk


def schema_violation(text: str, schema) -> str | None:
    """Why ``text`` is not a JSON instance of ``schema`` (jsonschema, the schema's draft or 2020-12;
    ``format`` as an annotation, as the drafts specify), or None when it is one."""
    from jsonschema import validators
    from jsonschema.exceptions import ValidationError

    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not JSON: {e}"
    cls = (
        validators.validator_for(schema, default=validators.Draft202012Validator)
        if isinstance(schema, dict)
        else validators.Draft202012Validator
    )
    try:
        cls(schema).validate(value)
    except ValidationError as e:
        return f"{e.message[:200]} at {'/'.join(map(str, e.absolute_path))}"
    return None
