"""One set-up for the offline Engine and the scheduler process: tokenizer, runner, grammar cache, Scheduler."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from radixrt.runtime.config import ServerArgs
from radixrt.runtime.models.loader import load_tokenizer

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # the HTTP process imports make_grammar_cache from here: the runner (torch) stays out of it
    from radixrt.runtime.scheduler.scheduler import Scheduler


def make_grammar_cache(
    args: ServerArgs, tokenizer, vocab_size: int, masks: bool = True, deferred: bool = False, start: bool = True
):
    """The compiled-grammar cache for ``args.grammar_backend`` (None when ``none``), warmed up
    (:func:`~radixrt.runtime.constrained.grammar_step.warm_up`; ``masks``: the mask kernels too, which only
    the process that samples needs). ``deferred``: the backend is built and warmed up on the cache's own
    thread (:meth:`GrammarCache.building`) and this returns at once (``tokenizer`` may then be a Future of
    it); a failed set-up then fails each constrained request with its ValueError instead of this call.
    ``start=False`` (with ``deferred``): the build waits for the cache's ``start()``.

    Raises:
        ValueError: an unknown grammar backend (before any thread starts, ``deferred`` or not).
    """
    from radixrt.runtime.constrained import BACKEND_CHOICES, GrammarCache, create_backend
    from radixrt.runtime.constrained.grammar_step import warm_up

    name = "llguidance" if args.grammar_backend is None else str(args.grammar_backend).strip().lower()
    if name == "none":
        return None

    def build():
        from radixrt.runtime.models.light_meta import DeferredTokenizer

        tok = tokenizer.result() if isinstance(tokenizer, (Future, DeferredTokenizer)) else tokenizer
        backend = create_backend(name, tok, vocab_size)
        warm_up(backend, masks)
        return backend

    if deferred and name in BACKEND_CHOICES:
        return GrammarCache.building(build, name, start=start)
    return GrammarCache(build())


def build_scheduler(args: ServerArgs, tp=None, defer_grammar: bool = False) -> Scheduler:
    """Load the tokenizer, make the grammar cache, load the model (weights + KV pool), build the Scheduler.
    ``tp``: this rank's TPGroup under ``--tp`` (the model is sharded; sampled ids come from rank 0).
    ``defer_grammar`` (the server's scheduler process): what the first token does not need waits for
    :func:`start_deferred` (the process calls it once idle after ready, or a use starts it): the grammar
    backend's build and, where a GGUF's converted files give its EOS id, the transformers tokenizer
    (:func:`~radixrt.runtime.models.loader.deferred_tokenizer`; else it loads beside the weights): on few
    cores both take their CPU time from the first token (docs/measurements.md). The backend's transient
    then peaks over the weights. The Engine keeps the serial order
    (the grammar backend before the weights: the lowest peak).

    The parts are reachable as ``scheduler.tokenizer``, ``.runner`` and ``.grammar_cache``.

    Raises:
        ValueError: a bad argument or an unsupported model.
    """
    from radixrt.runtime.models.args import ModelArgs
    from radixrt.runtime.models.loader import deferred_tokenizer, load_model_config, resolve_model
    from radixrt.runtime.models.readahead import readahead

    t0 = time.perf_counter()
    src = resolve_model(args.model)
    readahead(src.directory, src.gguf_file)  # read while torch and the rest are imported
    from radixrt.runtime.scheduler.scheduler import Scheduler

    vocab_size = ModelArgs.from_hf(load_model_config(args.model)).vocab_size
    if defer_grammar:
        tokenizer = deferred_tokenizer(args.model)  # None: loaded beside the weights (their copies drop the GIL)
        with ThreadPoolExecutor(1, thread_name_prefix="tokenizer-load") as pool:
            tok = pool.submit(load_tokenizer, args.model) if tokenizer is None else tokenizer
            grammar_cache = make_grammar_cache(args, tok, vocab_size, deferred=True, start=False)
            runner = _runner(args, tp, grammar_cache)
            t1 = time.perf_counter()
            tokenizer = tok.result() if tokenizer is None else tokenizer
        logger.info(
            "set up in %.1f s: weights and KV pool %.1f s, tokenizer %.1f s more (grammar backend after ready)",
            time.perf_counter() - t0,
            t1 - t0,
            time.perf_counter() - t1,
        )
    else:
        tokenizer = load_tokenizer(args.model)
        t1 = time.perf_counter()
        # the grammar backend before the weights: its set-up's transient (llguidance serializes the tokenizer
        # to JSON) then peaks over no weights, not over all of them
        grammar_cache = make_grammar_cache(args, tokenizer, vocab_size)
        t2 = time.perf_counter()
        runner = _runner(args, tp, grammar_cache)
        logger.info(
            "set up in %.1f s: tokenizer %.1f s, grammar backend %.1f s, weights and KV pool %.1f s",
            time.perf_counter() - t0,
            t1 - t0,
            t2 - t1,
            time.perf_counter() - t2,
        )
    return Scheduler(args, runner, tokenizer, grammar_cache, tp)


def start_deferred(sched: Scheduler) -> None:
    """What ``build_scheduler(defer_grammar=True)`` left for after ready, each on its own thread: the
    tokenizer's load (where deferred), then the grammar backend's build (which waits for it)."""
    from radixrt.runtime.models.light_meta import DeferredTokenizer

    if isinstance(sched.tokenizer, DeferredTokenizer):
        sched.tokenizer.start()
    if sched.grammar_cache is not None:
        sched.grammar_cache.start()


def _runner(args, tp, grammar_cache):
    """The model runner; a failed load shuts the grammar cache's thread down before the error goes on."""
    from radixrt.runtime.executor.model_runner import ModelRunner

    try:
        return ModelRunner(args, tp)
    except BaseException:
        if grammar_cache is not None:
            grammar_cache.shutdown(wait=False)
        raise
