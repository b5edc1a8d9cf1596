"""Text in, text out, shared by the in-process Engine and the server: user input checked into
:class:`GenerateReq` s (``validation``, ``session_args``), token ids streamed back into text
(``detokenizer``: stop strings, UTF-8 safety; ``detokenizer_process``: the server's detokenizer process),
and a token's exact bytes for logprobs (``token_texts``). May import sampling, models, constrained and the
loose runtime modules; never the scheduler, the executor or the server.
"""
from radixrt.runtime.tokenizer.detokenizer import Detokenizer
from radixrt.runtime.tokenizer.token_texts import TokenTexts
from radixrt.runtime.tokenizer.validation import Limits, build_requests

__all__ = ["Detokenizer", "Limits", "TokenTexts", "build_requests"]
