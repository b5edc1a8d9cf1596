"""A request's state inside the scheduler (plain dataclass; nano-vllm style)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from radixrt.runtime.io_struct import FinishReason, GenerateReq, SamplingParams


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    cache_salt: Optional[str] = None
    arrival: int = 0
    generator: Optional[torch.Generator] = None
    grammar: Any = None  # a GrammarMatcher, or None
    grammar_future: Any = None  # pending compile (request sits in the grammar queue)
    session: Any = None  # the Session that pins this request's KV when it finishes

    output_ids: list[int] = field(default_factory=list)
    # Memory. page_table[i] holds tokens [i*P, (i+1)*P) of fill_ids. The first prefix_len tokens' pages
    # belong to the radix tree (locked through last_node); the rest are the request's own.
    page_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens of fill_ids whose KV is written
    prefix_len: int = 0
    last_node: Any = None
    restore_job: Any = None  # mem/restore_async.RestoreJob bringing its prefix back (admission waits)
    cached_tokens: int = 0  # tokens taken from the tree at first admission (reported)
    hit_counted: bool = False  # its admission counted a hit on the matched nodes (once per request)
    wait_steps: int = 0
    finished_reason: Optional[FinishReason] = None
    # For the request log (request_log.py): Unix times of arrival and first admission, the cacheable
    # prompt tokens at that admission, and (time, tokens computed) after each prefill chunk.
    t_arrival: float = 0.0
    t_admit: Optional[float] = None
    cacheable_len: Optional[int] = None
    prefill_marks: list = field(default_factory=list)

    # Outputs not yet sent.
    sent_ids: int = 0
    out_logprobs: list = field(default_factory=list)
    out_top_logprobs: list = field(default_factory=list)
    input_logprobs: Optional[list] = None
    input_top_logprobs: Optional[list] = None
    input_logprobs_done: bool = False
    input_logprobs_sent: bool = False

    @classmethod
    def from_generate(cls, r: GenerateReq, max_new_tokens: int, arrival: int, seed: int) -> "Req":
        g = torch.Generator()
        g.manual_seed(r.sampling_params.seed if r.sampling_params.seed is not None else seed)
        return cls(
            r.rid,
            list(r.input_ids),
            r.sampling_params,
            max_new_tokens,
            r.return_logprob,
            r.logprob_start_len,
            r.top_logprobs_num,
            r.cache_salt,
            arrival,
            g,
        )

    def advance(self, n: int, now: float, chunk: bool) -> None:
        """``n`` more tokens of ``fill_ids`` have their KV written (at ``now``, Unix seconds); a prefill
        ``chunk``'s end (a row of more than one token of ``fill_ids``) is marked for the request log."""
        self.num_computed += n
        if chunk or not self.prefill_marks:
            self.prefill_marks.append((now, min(self.num_computed, len(self.input_ids))))

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def extend_len(self) -> int:
        """Tokens still to compute before the next sample (1 while decoding)."""
        return self.seq_len - self.num_computed

    @property
    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0 and not self.input_logprobs_done

    def max_cacheable_prefix(self) -> int:
        """Tokens that may come from the tree: never the last one (its logits are needed), nor any
        position whose logits input logprobs need."""
        n = self.seq_len - 1
        if self.wants_input_logprobs:
            n = min(n, max(self.logprob_start_len - 1, 0))
        return n
