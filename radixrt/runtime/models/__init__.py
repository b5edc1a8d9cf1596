"""The model: ``llama`` (one decoder for the Llama, Mistral, Qwen2 and Qwen3 families, gpt-fast style),
``args`` (per-family switches), ``rope`` (default, linear, llama3 and yarn scaling) and ``loader``
(resolving a ``model`` argument, config, tokenizer and weights from a GGUF file or a Hugging Face
directory). May import layers and kernels; never the runtime's upper layers. The loader and the args
are re-exported here (the decoder itself is imported from :mod:`.llama`, so that a tokenizer-only user
does not build kernels).
"""
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.loader import ModelSource, load_config, load_tokenizer, resolve_model

__all__ = ["ModelArgs", "ModelSource", "load_config", "load_tokenizer", "resolve_model"]
