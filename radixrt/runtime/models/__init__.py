"""The model: ``llama`` (one decoder for the Llama, Mistral, Qwen2 and Qwen3 families, gpt-fast style),
``args`` (per-family switches), ``rope`` (default, linear, llama3 and yarn scaling) and ``loader``
(resolving a ``model`` argument, config, tokenizer and weights from a GGUF file or a Hugging Face
directory). May import layers and kernels; never the runtime's upper layers. The loader and the args
are re-exported here (the decoder itself is imported from :mod:`.llama`, so that a tokenizer-only user
does not build kernels).
"""

from typing import TYPE_CHECKING

from radixrt.lazy import lazy_getattr

if TYPE_CHECKING:
    from radixrt.runtime.models.args import ModelArgs
    from radixrt.runtime.models.loader import ModelSource, load_config, load_tokenizer, resolve_model

# Lazy (PEP 562): the server's main process checks config and tokenizer and must not load torch.
_WHERE = {
    "ModelArgs": "radixrt.runtime.models.args",
    "ModelSource": "radixrt.runtime.models.loader",
    "load_config": "radixrt.runtime.models.loader",
    "load_tokenizer": "radixrt.runtime.models.loader",
    "resolve_model": "radixrt.runtime.models.loader",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


__all__ = ["ModelArgs", "ModelSource", "load_config", "load_tokenizer", "resolve_model"]
