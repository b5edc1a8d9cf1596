"""The grammar-constrained decoding interface the scheduler and sampler use.

Flow per request: ``GrammarCache.submit(kind, spec)`` -> ``CompiledGrammar`` -> ``.matcher()`` (one per
request). Per decode step, for each grammar row ``i`` of the batch:

    matcher.fill_next_token_bitmask(bitmask, i)      # CPU int32 [batch, ceil(vocab/32)]
    apply_token_bitmask_(logits, bitmask)             # -inf where the bit is 0 (any device)
    ... sample ...
    matcher.accept_token(token)                       # False: illegal, state unchanged

EOS semantics (both backends): the mask allows the EOS id exactly when the text so far is a complete
match (``can_terminate()``). When the grammar is complete and nothing may follow, the mask holds EOS
alone. ``is_terminated()`` turns True once EOS was accepted; afterwards ``accept_token`` returns False.

Bit layout: token ``t`` is allowed iff ``(bitmask[row, t // 32] >> (t % 32)) & 1`` (little-endian bits in
int32 words; the same layout as xgrammar and outlines-core).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch where bitmasks are built or applied: the main process only compiles grammars
    import torch

from .specs import GRAMMAR_KINDS, JSON_OBJECT_SCHEMA, choices_to_regex, validate_spec

__all__ = [
    "GRAMMAR_KINDS",
    "JSON_OBJECT_SCHEMA",
    "GrammarMatcher",
    "RowMatcher",
    "CompiledGrammar",
    "GrammarBackend",
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "choices_to_regex",
    "validate_spec",
    "checked_spec",
    "compile_error",
    "fill_single_token",
]


class GrammarMatcher(ABC):
    """Per-request grammar state. Not thread-safe: use one matcher from one thread at a time.

    Beyond the mask and the accept, a backend declares what it can do: ``supports_rollback`` (with
    :meth:`rollback`: speculation checks drafts against the grammar), :meth:`forced_tokens` and
    :meth:`find_jump_forward_string` (what the grammar forces next: drafts, jump-forward); the defaults
    say "cannot"."""

    supports_rollback: bool = False

    @abstractmethod
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-token bits of the next step into ``bitmask[row]``; the state is unchanged.

        Args:
            bitmask: int32 ``[batch, ceil(vocab_size/32)]``, on CPU and contiguous
                (see :func:`allocate_token_bitmask`).
            row: the batch row to overwrite.
        """

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False (state unchanged) if the grammar does not allow it."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once EOS was accepted at a point where the grammar could end."""

    def can_terminate(self) -> bool:
        """True if the text accepted so far is a complete match (EOS is allowed now)."""
        raise NotImplementedError(f"{type(self).__name__} cannot tell whether it can terminate")

    def dead_end(self) -> str | None:
        """Why no token can extend the text accepted so far toward a match (a grammar that accepts no string,
        or a limit of the backend hit on the way), or None while generation can go on or end properly.
        Backends whose masks never reach a dead end keep the default (None)."""
        return None

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (an accepted EOS counts as one).

        Raises:
            NotImplementedError: the backend cannot roll back (``supports_rollback`` is False).
            ValueError: ``n`` is negative or exceeds what can be undone.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support rollback")

    def forced_tokens(self) -> list[int]:
        """The token ids the grammar allows alone from here on, one after the other ([]: none, or the
        backend cannot tell in tokens; then :meth:`find_jump_forward_string` may in text)."""
        return []

    def find_jump_forward_string(self) -> str:
        """The text the grammar forces next (xgrammar's jump-forward string; "": none, or cannot tell)."""
        return ""

    def batch_fill_matcher(self):
        """The ``llguidance.LLMatcher`` that fills this row in a batched ``LLExecutor`` call (mask_fill.py),
        or None: another backend, a closed reasoning gate, or EOS accepted (the row is filled alone)."""
        return None


class RowMatcher(GrammarMatcher):
    """A matcher whose library writes a mask row through a raw pointer (llguidance, outlines-core): the row
    checks and the after-EOS row live here, once. Subclasses set ``backend``, ``_eos``, ``_terminated`` (True
    once EOS was accepted) and implement :meth:`_write_row`."""

    backend: str
    _eos: int
    _terminated: bool

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """See :meth:`GrammarMatcher.fill_next_token_bitmask`. After termination the row allows EOS only.

        Raises:
            ValueError: ``bitmask[row]`` is not a contiguous CPU int32 row.
        """
        import torch

        target = bitmask[row]
        if target.device.type != "cpu" or target.dtype != torch.int32 or not target.is_contiguous():
            raise ValueError(
                f"{self.backend}: bitmask must be a contiguous CPU int32 tensor, got {bitmask.dtype} "
                f"on {bitmask.device}"
            )
        if self._terminated:
            fill_single_token(bitmask, row, self._eos)
            return
        self._write_row(target)

    @abstractmethod
    def _write_row(self, target: torch.Tensor) -> None:
        """Write the allowed-token bits into ``target`` (int32 ``[ceil(vocab/32)]``, CPU, contiguous)."""

    def is_terminated(self) -> bool:
        return self._terminated


class CompiledGrammar(ABC):
    """An immutable compiled grammar, shareable between requests and threads."""

    kind: str

    @abstractmethod
    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the grammar's start state."""


class GrammarBackend(ABC):
    """Compiles specs for one tokenizer/vocabulary."""

    name: str
    vocab_size: int
    eos_token_id: int

    @abstractmethod
    def compile(self, kind: str, spec: str, any_whitespace: bool = False) -> CompiledGrammar:
        """Compile ``spec`` of grammar ``kind`` (one of :data:`GRAMMAR_KINDS`).

        ``any_whitespace`` (json_schema only): False (default) allows no whitespace outside strings
        (compact ``{"a":1}``), so generation cannot loop on spaces; True allows any JSON whitespace.

        Raises:
            ValueError: ``"<backend>: cannot compile <kind>: <reason>"``.
        """


_CPP_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\] \S+\.(?:cc|h|cpp):\d+: (?:Check failed: [^:]*: )?")


def compile_error(backend: str, kind: str, reason: object) -> ValueError:
    """The uniform compile error; strips a leading ``"<kind>: "`` already present in ``reason``."""
    text = str(reason).strip() or type(reason).__name__
    # xgrammar's C++ checks prefix "[09:59:26] /project/cpp/json_schema_converter.cc:5088: ": not for users
    text = _CPP_PREFIX.sub("", text)
    if text.startswith(kind + ": "):
        text = text[len(kind) + 2 :]
    return ValueError(f"{backend}: cannot compile {kind}: {text}")


def checked_spec(backend: str, kind: str, spec: str) -> str:
    """``spec`` validated for ``kind`` (see :func:`.specs.validate_spec`): the text a backend compiles.

    Raises:
        ValueError: an unknown ``kind``, or the uniform compile error (:func:`compile_error`) for a bad spec.
    """
    if kind not in GRAMMAR_KINDS:
        raise ValueError(f"{backend}: unknown grammar kind {kind!r}; choose one of {list(GRAMMAR_KINDS)}")
    try:
        return validate_spec(kind, spec)
    except ValueError as e:
        raise compile_error(backend, kind, e) from None


def reraise_fatal(e: BaseException) -> None:
    """Re-raise interpreter-level exceptions; native panics (pyo3 ``PanicException``) are left to wrap."""
    if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        raise e


def allocate_token_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed bitmask: int32 ``[batch, ceil(vocab_size/32)]`` of -1 (all bits set), on CPU."""
    if batch < 0 or vocab_size <= 0:
        raise ValueError(f"allocate_token_bitmask: bad shape batch={batch} vocab_size={vocab_size}")
    import torch

    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


_SHIFTS: dict = {}  # torch.device -> int32 [32]


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set ``logits[i, t] = -inf`` wherever bit ``t`` of ``bitmask[i]`` is 0; in place.

    Args:
        logits: float ``[batch, vocab]`` (fp32, or fp16/bf16), on CPU or CUDA. Columns beyond
            ``32 * bitmask.shape[1]`` (padded vocab) are set to -inf. CPU fp32 uses xgrammar's C++
            kernel; otherwise a few torch ops (one fused pass on CUDA).
        bitmask: int32 ``[batch, ceil(vocab/32)]`` on any device; moved to ``logits.device``.

    Raises:
        ValueError: wrong ranks, dtype, or batch sizes that differ.
    """
    import torch

    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError(
            f"apply_token_bitmask_: need 2-D logits and bitmask, got {tuple(logits.shape)} and {tuple(bitmask.shape)}"
        )
    if bitmask.dtype != torch.int32:
        raise ValueError(f"apply_token_bitmask_: bitmask must be int32, got {bitmask.dtype}")
    if logits.shape[0] != bitmask.shape[0]:
        raise ValueError(
            f"apply_token_bitmask_: batch mismatch, logits {logits.shape[0]} vs bitmask {bitmask.shape[0]}"
        )
    dev = logits.device
    batch, vocab = logits.shape
    covered = 32 * bitmask.shape[1]
    n = min(vocab, covered)
    if vocab > covered:
        logits[:, covered:] = float("-inf")
    if (
        dev.type == "cpu"
        and logits.dtype == torch.float32
        and logits.is_contiguous()
        and _cpu_kernel(logits, bitmask.to("cpu").contiguous(), n)
    ):
        return
    mask = bitmask.to(dev, non_blocking=True)
    shifts = _SHIFTS.get(dev)
    if shifts is None:
        shifts = _SHIFTS[dev] = torch.arange(32, dtype=torch.int32, device=dev)
    allowed = ((mask.unsqueeze(-1) >> shifts) & 1).view(batch, covered)[:, :n].bool()
    logits[:, :n].masked_fill_(~allowed, float("-inf"))


_XGR_APPLY: list = []  # [xgrammar.apply_token_bitmask_inplace or None], resolved once


def load_cpu_kernel():
    """xgrammar's C++ CPU bitmask kernel, or None when xgrammar is not installed. Importing xgrammar is
    slow (docs/measurements.md), so the scheduler calls this at start-up (:func:`.grammar_step.warm_up`)
    instead of stalling the first constrained decode step (and every request in its batch) on the import."""
    if not _XGR_APPLY:
        try:
            import xgrammar

            _XGR_APPLY.append(xgrammar.apply_token_bitmask_inplace)
        except Exception:  # not installed / broken: the torch ops serve
            _XGR_APPLY.append(None)
    return _XGR_APPLY[0]


def _cpu_kernel(logits: torch.Tensor, bitmask: torch.Tensor, n: int) -> bool:
    """xgrammar's C++ CPU kernel (far faster than the torch ops below on a busy CPU: docs/measurements.md)."""
    fn = load_cpu_kernel()
    if fn is None:
        return False
    try:
        fn(logits, bitmask, vocab_size=n, backend="cpu")
        return True
    except Exception:  # an unsupported shape/dtype: fall back to torch ops
        return False


def fill_single_token(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    """Make ``bitmask[row]`` allow ``token_id`` only (used after termination: EOS only)."""
    bitmask[row].zero_()
    bit = 1 << (token_id % 32)
    bitmask[row, token_id // 32] = bit - (1 << 32) if bit >= 1 << 31 else bit
