"""From logits to tokens: sampling parameters checked and normalized (``params``: SGLang's and OpenAI's
names, logit bias, the grammar a request asks for) and the sampler (``sampler``: penalties, grammar mask,
temperature, top-k/top-p/min-p, logprobs). May import constrained, kernels and the loose runtime modules.
"""
from radixrt.runtime.sampling.params import grammar_of, normalize
from radixrt.runtime.sampling.sampler import SampleOut, SampleRow, sample

__all__ = ["SampleOut", "SampleRow", "grammar_of", "normalize", "sample"]
