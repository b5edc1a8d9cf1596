"""From logits to tokens: sampling parameters checked and normalized (``params``: SGLang's and OpenAI's
names, logit bias, the grammar a request asks for) and the sampler (``sampler``: penalties, grammar mask,
temperature, top-k/top-p/min-p, logprobs). May import constrained, kernels and the loose runtime modules.
"""

from typing import TYPE_CHECKING

from radixrt.lazy import lazy_getattr

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


__getattr__ = lazy_getattr(__name__, _WHERE)


__all__ = ["SampleOut", "SampleRow", "grammar_of", "normalize", "sample"]
