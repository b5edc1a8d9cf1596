"""From logits to tokens: sampling parameters checked and normalized (``params``: SGLang's and OpenAI's
names, logit bias, the grammar a request asks for) and the sampler (``sampler``: penalties, grammar mask,
temperature, top-k/top-p/min-p, logprobs). May import constrained, kernels and the loose runtime modules.
"""
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixrt.runtime.sampling.params import grammar_of, normalize
    from radixrt.runtime.sampling.sampler import SampleOut, SampleRow, sample

# Lazy (PEP 562): the server's main process checks sampling parameters (``params``) without torch.
_WHERE = {
    "grammar_of": "radixrt.runtime.sampling.params",
    "normalize": "radixrt.runtime.sampling.params",
    "SampleOut": "radixrt.runtime.sampling.sampler",
    "SampleRow": "radixrt.runtime.sampling.sampler",
    "sample": "radixrt.runtime.sampling.sampler",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SampleOut", "SampleRow", "grammar_of", "normalize", "sample"]
