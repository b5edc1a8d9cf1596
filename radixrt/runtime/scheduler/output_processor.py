"""Output processing: from one step's logits to new tokens, finish decisions and ``TokenOut`` messages.

Per step, after ``ModelRunner.forward``:
1. input logprobs: log-softmax of the prompt rows asked for (``ForwardBatch.input_logprob_at``);
2. sampling: penalties, grammar mask (constrained/grammar_step.py), temperature, top-k/p/min-p;
3. the grammar matchers advance by the sampled tokens;
4. finish checks: stop token ids / EOS, grammar termination, stop strings, max_new_tokens, context length;
5. jump-forward: text the grammar forces next is appended at once (jump_forward.py).

Finished requests are returned, not released: the scheduler owns the running list and the pages.
"""

from __future__ import annotations

import torch

from radixrt.runtime.constrained.grammar_step import advance_matchers, build_grammar_mask
from radixrt.runtime.constrained.mask_fill import MaskPrefetcher
from radixrt.runtime.executor.forward_batch import ForwardBatch
from radixrt.runtime.errors import grammar_refusal
from radixrt.runtime.io_struct import FinishLength, FinishReason, FinishStop, TokenOut
from radixrt.runtime.scheduler.jump_forward import try_jump_forward
from radixrt.runtime.scheduler.request import Req
from radixrt.runtime.sampling.params import grammar_of
from radixrt.runtime.sampling.sampler import SampleRow, sample


class OutputProcessor:
    """Turns logits into tokens and finish reasons.

    Args:
        tokenizer: decodes the output tail for stop strings.
        eos_ids: the model's EOS token ids (see :func:`eos_ids`).
        context_length: the longest prompt + output, in tokens.
        jump_forward: append grammar-forced text in one extend step (requests without logprobs or stop
            strings, whose matcher offers ``find_jump_forward_string``).
        grammar_overlap: fill the next step's grammar masks on a worker thread (constrained/mask_fill.py).

    Attributes:
        jump_forward_tokens: output tokens appended by jump-forward so far (not sampled).
    """

    def __init__(
        self,
        tokenizer,
        eos_ids: set[int],
        context_length: int,
        jump_forward: bool = False,
        grammar_overlap: bool = False,
        share_tokens=None,
    ):
        self.tokenizer, self.eos_ids, self.context_length = tokenizer, eos_ids, context_length
        # next-step grammar masks filled on a worker thread while the scheduler runs the next forward
        self.mask_prefetcher = MaskPrefetcher() if grammar_overlap else None
        self.jump_forward = jump_forward
        self.jump_forward_tokens = 0
        self.share_tokens = share_tokens  # under --tp: TPGroup.share_tokens, rank 0's samples on every rank

    def process(self, fb: ForwardBatch, logits: torch.Tensor) -> list[tuple[Req, FinishReason]]:
        """Consume fp32 ``logits [len(fb.logit_rows), vocab]``. Returns ``(req, finished_reason)`` for the
        requests that finished this step, in order; their tokens are already appended."""
        self.record_input_logprobs(logits, fb.input_logprob_at)
        return self.sample(logits, fb.sample_at)

    def record_input_logprobs(self, logits: torch.Tensor, lp_at: list[tuple[Req, int, int]]) -> None:
        if not lp_at:
            return
        rows = torch.tensor([r for _, r, _ in lp_at])
        lps = torch.log_softmax(logits[rows], dim=-1)
        for i, (req, _, p) in enumerate(lp_at):
            tok = req.input_ids[p]
            req.input_logprobs.append((float(lps[i, tok]), tok))
            k = req.top_logprobs_num
            if k:
                v, ix = lps[i].topk(k)
                req.input_top_logprobs.append(list(zip(v.tolist(), ix.tolist())))
            else:
                req.input_top_logprobs.append(None)

    def sample(self, logits: torch.Tensor, sample_at: list[tuple[Req, int]]) -> list[tuple[Req, FinishReason]]:
        finished: list[tuple[Req, FinishReason]] = []
        todo = []
        for req, row in sample_at:
            if req.wants_input_logprobs:
                req.input_logprobs_done = True
                if req.logprob_start_len == 0:
                    req.input_logprobs.insert(0, None)
                    req.input_top_logprobs.insert(0, None)
            if len(req.output_ids) >= req.max_new_tokens:  # max_new_tokens == 0: prefill only
                finished.append((req, FinishLength(req.max_new_tokens)))
            else:
                todo.append((req, row))
        if not todo:
            return finished
        reqs = [req for req, _ in todo]
        at = [r for _, r in todo]
        # every row in order (a decode step): sample from logits itself, which nothing reads afterwards
        sub = logits if at == list(range(logits.shape[0])) else logits[torch.tensor(at)]
        srows = [
            SampleRow(
                req.params,
                req.generator,
                req.input_ids,
                req.output_ids,
                self._blocked(req),
                req.top_logprobs_num if req.return_logprob else 0,
                req.return_logprob,
            )
            for req in reqs
        ]
        out = sample(sub, srows, build_grammar_mask(reqs, sub.shape[-1], self.mask_prefetcher))
        if self.share_tokens is not None:
            out.token_ids = self.share_tokens(out.token_ids)
        advance_matchers(reqs, out.token_ids)
        for i, req in enumerate(reqs):
            tok = out.token_ids[i]
            req.output_ids.append(tok)
            if req.return_logprob:
                req.out_logprobs.append((out.logprobs[i], tok))
                req.out_top_logprobs.append(out.top_logprobs[i] or [])
            reason = self.check_finished(req, tok)
            if reason is None and self.jump_forward and req.grammar is not None:
                reason = self._jump(req)
            if reason is not None:
                finished.append((req, reason))
        if self.mask_prefetcher is not None:  # after jump-forward: the matchers are final for this step
            done = {id(r) for r, _ in finished}
            self.mask_prefetcher.start([r for r in reqs if id(r) not in done], sub.shape[-1])
        return finished

    def _jump(self, req: Req) -> FinishReason | None:
        """Jump forward over forced text; the length limits still end the request."""
        if req.return_logprob or req.params.stop:  # forced tokens have no sampled logprob; stops need a scan
            return None
        room = min(req.max_new_tokens - len(req.output_ids), self.context_length - req.seq_len)
        added = try_jump_forward(req, self.tokenizer, room)
        self.jump_forward_tokens += added
        if added and (len(req.output_ids) >= req.max_new_tokens or req.seq_len >= self.context_length):
            return FinishLength(len(req.output_ids))
        return None

    def _blocked(self, req: Req) -> list[int]:
        """Stop ids and EOS may not end the output before ``min_new_tokens``."""
        if len(req.output_ids) >= req.params.min_new_tokens:
            return []
        return sorted(set(req.params.stop_token_ids) | (set() if req.params.ignore_eos else self.eos_ids))

    def check_finished(self, req: Req, tok: int) -> FinishReason | None:
        """The finish reason after ``tok`` was appended (and the matcher advanced), or None to go on.

        Stop strings are searched in the decoded tail of the output, a few tokens longer than the
        longest stop string (the detokenizer trims the text at the match)."""
        p = req.params
        if req.grammar is not None and (why := req.grammar.dead_end()) is not None:
            # the backend's limit or a grammar no string completes, met before the first token or (lazily
            # built parts, llguidance's lexer) later: the grammar is at fault either way, so a 400 naming its
            # field, not an "abort" with half an object (a stream already under way gets it as its error event)
            return grammar_refusal(grammar_of(req.params), why)
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
            return FinishStop(tok)
        if req.grammar is not None and req.grammar.is_terminated():
            return FinishStop(None)
        if p.stop:
            tail_len = max(len(s) for s in p.stop) + 8
            tail = self.tokenizer.decode(req.output_ids[-tail_len:], skip_special_tokens=p.skip_special_tokens)
            for s in p.stop:
                if s in tail:
                    return FinishStop(s)
        if len(req.output_ids) >= req.max_new_tokens or req.seq_len >= self.context_length:
            return FinishLength(len(req.output_ids))
        return None


def make_out(req: Req, force: bool = False) -> TokenOut | None:
    """The request's new tokens (and logprobs) since the last message, or None when there is nothing to
    send. ``force`` sends even an empty delta (the final message, with ``finished_reason``)."""
    new = req.output_ids[req.sent_ids :]
    send_in = req.input_logprobs_done and not req.input_logprobs_sent and req.input_logprobs is not None
    if not new and not force and not send_in:
        return None
    req.sent_ids = len(req.output_ids)
    out = TokenOut(
        rid=req.rid,
        new_token_ids=new,
        finished_reason=req.finished_reason,
        prompt_tokens=len(req.input_ids),
        completion_tokens=len(req.output_ids),
        cached_tokens=req.cached_tokens,
        output_token_logprobs=req.out_logprobs,
        output_top_logprobs=req.out_top_logprobs,
        stop_strings=list(req.params.stop),
        no_stop_trim=req.params.no_stop_trim,
        skip_special_tokens=req.params.skip_special_tokens,
        spaces_between_special_tokens=req.params.spaces_between_special_tokens,
    )
    req.out_logprobs, req.out_top_logprobs = [], []
    if req.input_logprobs is not None and (send_in or force) and not req.input_logprobs_sent:
        out.input_token_logprobs, out.input_top_logprobs = req.input_logprobs, req.input_top_logprobs
        req.input_logprobs_sent = True
    return out


def eos_ids(tokenizer, config) -> set[int]:
    """EOS token ids from the tokenizer and the model config (an int or a list in either)."""
    ids = set()
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(v)
    return ids
