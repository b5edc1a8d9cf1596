"""Text in, text out, shared by the in-process Engine and the server: user input checked into
:class:`GenerateReq` s (``validation``, ``session_args``), token ids streamed back into text
(``detokenizer``: stop strings, UTF-8 safety; ``detokenizer_process``: the server's detokenizer process),
and a token's exact bytes for logprobs (``token_texts``). May import sampling, models, constrained and the
loose runtime modules; never the scheduler, the executor or the server.
"""

from typing import TYPE_CHECKING

from radixrt.lazy import lazy_getattr

if TYPE_CHECKING:
    from radixrt.runtime.tokenizer.detokenizer import Detokenizer
    from radixrt.runtime.tokenizer.token_texts import TokenTexts
    from radixrt.runtime.tokenizer.validation import Limits, build_requests

# Lazy (PEP 562): the server's main process and the detokenizer import single modules of it without torch.
_WHERE = {
    "Detokenizer": "radixrt.runtime.tokenizer.detokenizer",
    "TokenTexts": "radixrt.runtime.tokenizer.token_texts",
    "Limits": "radixrt.runtime.tokenizer.validation",
    "build_requests": "radixrt.runtime.tokenizer.validation",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


__all__ = ["Detokenizer", "Limits", "TokenTexts", "build_requests"]
