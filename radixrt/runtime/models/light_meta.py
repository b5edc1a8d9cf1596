"""A GGUF's converted config and its tokenizer's EOS id read without transformers; a tokenizer loaded later.

The server's scheduler process needs, before its first token, only the decoder's shape, its rope and the
EOS ids. transformers gives them through ``AutoConfig`` and ``AutoTokenizer``, whose imports and set-up (a
fast tokenizer built from a 128k-entry ``tokenizer.json``) are seconds of CPU on a cold start, on a 2-core
box shared with the other two processes. Here they come from the files of the verified converted directory
(:mod:`.meta_cache`) instead, and the transformers tokenizer (stop strings, jump-forward, the grammar
backend) loads on a thread once the process has reported ready (:class:`DeferredTokenizer`).

Only a ``config.json`` written by transformers 5 is read this way: its ``save_pretrained`` writes every
attribute of the model's config class (it drops only keys of the base ``PreTrainedConfig`` that equal their
default, and radixrt reads none of those), so each attribute read here has the value ``AutoConfig`` would
give. An older writer, or a rope type whose frequencies :func:`.rope.inv_freq` takes from transformers
(``yarn``), is left to ``AutoConfig``.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future
from typing import Any, Callable

from radixrt.runtime.models.rope_params import rope_parameters

OWN_ROPE = ("default", "linear", "llama3")  # the rope types rope.inv_freq computes without transformers


class JsonConfig:
    """A ``config.json``'s keys as attributes (``getattr(cfg, "sliding_window", None)`` as on a transformers
    config). Read-only by convention; ``to_dict()`` gives the keys back."""

    def __init__(self, d: dict):
        self.__dict__.update(d)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"JsonConfig(model_type={getattr(self, 'model_type', None)!r})"


def light_config(directory: str) -> JsonConfig | None:
    """``directory``'s ``config.json`` as a :class:`JsonConfig`, or None where transformers must read it (not
    written by transformers >= 5, or a rope outside :data:`OWN_ROPE`). OSError / ValueError: an unreadable
    file."""
    with open(os.path.join(directory, "config.json")) as f:
        d = json.load(f)
    version = str(d.get("transformers_version", ""))
    if not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 5:
        return None
    cfg = JsonConfig(d)
    if rope_parameters(cfg)["rope_type"] not in OWN_ROPE:
        return None
    return cfg


def eos_token_id(directory: str) -> int | None:
    """The id of ``tokenizer_config.json``'s ``eos_token`` in ``tokenizer.json`` (what a transformers fast
    tokenizer's ``eos_token_id`` is: the token's id, else the unknown token's), read with ``tokenizers``
    alone; None where the EOS token is null.

    Raises:
        KeyError: ``tokenizer_config.json`` names no ``eos_token`` (transformers may find it elsewhere).
        OSError, ValueError: an unreadable file.
    """
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        tc = json.load(f)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))

    def token_id(key: str) -> int | None:
        t = tc[key]
        t = t.get("content") if isinstance(t, dict) else t
        return tok.token_to_id(t) if isinstance(t, str) else None

    eos = tc["eos_token"]
    if eos is None:
        return None
    i = token_id("eos_token")
    return i if i is not None else (token_id("unk_token") if "unk_token" in tc else None)


class DeferredTokenizer:
    """Stands for a transformers tokenizer loaded on a thread once :meth:`start` is called: every attribute
    and call waits for it (the first use before ``start`` starts it). ``eos_token_id`` is known at once
    (given), so the scheduler's EOS check needs no wait. ``future``: the tokenizer, for the grammar backend."""

    def __init__(self, load: Callable[[], Any], eos_token_id: int | None):
        self.__dict__.update(
            _load=load, eos_token_id=eos_token_id, future=Future(), _started=False, _lock=threading.Lock()
        )

    def start(self) -> None:
        """Load on a daemon thread (once)."""
        with self._lock:
            if self._started:
                return
            self.__dict__["_started"] = True
        threading.Thread(target=self._run, name="tokenizer-load", daemon=True).start()

    def _run(self) -> None:
        try:
            self.future.set_result(self._load())
        except BaseException as e:  # noqa: BLE001 - every user of the tokenizer then raises it
            self.future.set_exception(e)

    def result(self):
        """The tokenizer (waits for it; raises its load's exception)."""
        self.start()
        return self.future.result()

    def __getattr__(self, name: str):
        return getattr(self.result(), name)

    def __call__(self, *args, **kwargs):
        return self.result()(*args, **kwargs)
