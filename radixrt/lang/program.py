"""``@function`` programs: ``run``, ``run_batch`` (with prefix pre-caching) and the default backend."""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Union

from radixrt.lang.backend.base import BaseBackend
from radixrt.lang.interpreter import StreamExecutor
from radixrt.lang.ir import DEFAULT_RUN_PARAMS, SglSamplingParams
from radixrt.lang.state import ProgramState
from radixrt.lang.tracer import placeholders

logger = logging.getLogger(__name__)
DEFAULT_ENDPOINT = "tcp://127.0.0.1:30001"
_default_backend: Optional[BaseBackend] = None
_default_lock = threading.Lock()
_wrapped: "weakref.WeakKeyDictionary[Any, BaseBackend]" = weakref.WeakKeyDictionary()


def as_backend(backend: Any) -> BaseBackend:
    """A DSL backend from a backend, an in-process ``radixrt.Engine``, or an endpoint URL string.

    Raises:
        ValueError: anything else.
    """
    if isinstance(backend, BaseBackend):
        return backend
    if isinstance(backend, str):
        from radixrt.lang.backend import RuntimeEndpoint

        return RuntimeEndpoint(backend)
    engine = sys.modules.get("radixrt.runtime.engine")  # an Engine exists only once its module is loaded
    if engine is not None and isinstance(backend, engine.Engine):
        with _default_lock:
            if backend not in _wrapped:
                from radixrt.lang.backend.engine import EngineBackend

                _wrapped[backend] = EngineBackend(backend)
            return _wrapped[backend]
    raise ValueError(f"not a backend: {backend!r} (use RuntimeEndpoint, OpenAI or Engine)")


def extract_prefix(func: Any, backend: Any, bound: dict[str, Any]) -> str:
    """The constant text ``func`` renders before its first argument-dependent step ("" if none).

    Runs ``func`` once on a tracing state with :class:`radixrt.lang.tracer.Placeholder` arguments.
    """
    exe = StreamExecutor(backend, {}, DEFAULT_RUN_PARAMS, trace=True)
    try:
        func(ProgramState(exe), **placeholders(func, bound))
    except Exception:  # noqa: BLE001 - StopTrace, or anything else: the text so far is still constant
        pass
    return exe.text_


def set_default_backend(backend: Any) -> None:
    """The backend programs use when ``run`` gets none."""
    global _default_backend
    _default_backend = as_backend(backend)


def get_default_backend() -> BaseBackend:
    """The default backend; without one set, ``RuntimeEndpoint("tcp://127.0.0.1:30001")`` (ZMQ)."""
    global _default_backend
    with _default_lock:
        if _default_backend is None:
            from radixrt.lang.backend import RuntimeEndpoint

            _default_backend = RuntimeEndpoint(DEFAULT_ENDPOINT)
        return _default_backend


def _run_params(
    max_new_tokens: Optional[int],
    stop: Any,
    stop_token_ids: Any,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    frequency_penalty: float,
    presence_penalty: float,
    ignore_eos: bool,
    return_logprob: bool,
    logprob_start_len: Optional[int],
    top_logprobs_num: Optional[int],
    return_text_in_logprobs: Optional[bool],
    seed: Optional[int],
) -> SglSamplingParams:
    return DEFAULT_RUN_PARAMS.merged(
        SglSamplingParams(
            max_new_tokens=max_new_tokens,
            stop=stop,
            stop_token_ids=stop_token_ids,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            ignore_eos=ignore_eos,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            seed=seed,
        )
    )


def run_program(
    func: Callable, backend: BaseBackend, kwargs: dict, sp: SglSamplingParams, stream: bool, use_session: bool = True
) -> ProgramState:
    """Run ``func(state, **kwargs)``. Never raises for an error inside the program: see ``state.error()``.
    With ``stream=True`` the function runs in a background thread and the state is returned at once.

    With ``use_session`` the run opens a runtime session (runtime/scheduler/session.py) that pins the program's KV
    between its calls, so other traffic cannot evict it while the program's own Python code runs; it is
    closed when the program ends. A backend without sessions runs the program without one."""
    exe = StreamExecutor(backend, kwargs, sp, stream=stream)
    state = ProgramState(exe)
    if use_session:
        exe.session_id = _open_session(backend)

    def body() -> None:
        try:
            state.ret_value = func(state, **kwargs)
        except Exception as e:  # noqa: BLE001 - returned on the state
            exe.set_error(e)
        finally:
            exe.end()
            if exe.session_id is not None:
                exe.sync()  # the queued gens still use the session: close it once they have run
                _close_session(backend, exe.session_id)

    if stream:
        threading.Thread(target=body, name="radixrt-program", daemon=True).start()
    else:
        body()
        exe.sync()
    return state


def _open_session(backend: BaseBackend) -> Optional[str]:
    try:
        return backend.open_session()
    except Exception as e:  # noqa: BLE001 - a server without sessions still runs the program
        logger.warning("no session for this program run (%s); its KV is not pinned", e)
        return None


def _close_session(backend: BaseBackend, session_id: str) -> None:
    try:
        backend.close_session(session_id)
    except Exception as e:  # noqa: BLE001 - the server's TTL or its exit releases the pin anyway
        logger.warning("closing session %s failed: %s", session_id, e)


class SglFunction:
    """A program: ``prog.run(**kwargs)``, ``prog.run_batch([...])``; inside another program,
    ``prog(s, ...)`` runs it on that state."""

    def __init__(self, func: Callable, bind_arguments: Optional[dict] = None) -> None:
        self.func = func
        self.bind_arguments = dict(bind_arguments or {})
        params = list(inspect.signature(func).parameters)
        if not params:
            raise ValueError(f"@function {func.__name__}: the first parameter must be the state (s)")
        self.arg_names = params[1:]

    def bind(self, **kwargs: Any) -> "SglFunction":
        return SglFunction(self.func, {**self.bind_arguments, **kwargs})

    def _kwargs(self, args: tuple, kwargs: dict) -> dict:
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.func.__name__} takes {len(self.arg_names)} arguments, got {len(args)}")
        return {**self.bind_arguments, **dict(zip(self.arg_names, args)), **kwargs}

    def run(
        self,
        *args: Any,
        max_new_tokens: Optional[int] = 128,
        stop: Any = None,
        stop_token_ids: Any = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool = False,
        logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None,
        seed: Optional[int] = None,
        stream: bool = False,
        backend: Any = None,
        use_session: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run once. Sampling arguments are defaults for every ``gen`` (which may override them).
        ``use_session=False`` runs without a runtime session (see :func:`run_program`).

        Returns the final state (with ``stream=True``: at once, while it runs; read it with
        ``state.text_iter()``). Errors inside the program are on ``state.error()``.
        """
        sp = _run_params(
            max_new_tokens,
            stop,
            stop_token_ids,
            temperature,
            top_p,
            top_k,
            min_p,
            frequency_penalty,
            presence_penalty,
            ignore_eos,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            return_text_in_logprobs,
            seed,
        )
        b = as_backend(backend) if backend is not None else get_default_backend()
        return run_program(self.func, b, self._kwargs(args, kwargs), sp, stream, use_session)

    def run_batch(
        self,
        batch_kwargs: list[dict],
        *,
        max_new_tokens: Optional[int] = 128,
        stop: Any = None,
        stop_token_ids: Any = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool = False,
        logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None,
        return_text_in_logprobs: Optional[bool] = None,
        seed: Optional[int] = None,
        backend: Any = None,
        num_threads: Union[int, str] = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        use_session: bool = True,
    ) -> Any:
        """Run once per kwargs dict, concurrently (``num_threads``; "auto": one per program, up to 128).

        First the program is traced and its constant prefix (the text before anything argument-dependent)
        is prefilled once, so every program's first request hits the radix cache. A failing program
        does not stop the others: its state carries ``state.error()``. ``progress_bar`` shows a tqdm bar.
        Returns the states in input order (or, with ``generator_style``, an iterator over them). Each
        program runs in its own runtime session unless ``use_session=False`` (see :func:`run_program`).

        Raises:
            ValueError: ``batch_kwargs`` is not a list of dicts; connection errors of the pre-caching.
        """
        if not isinstance(batch_kwargs, list) or not all(isinstance(k, dict) for k in batch_kwargs):
            raise ValueError("run_batch takes a list of keyword-argument dicts")
        sp = _run_params(
            max_new_tokens,
            stop,
            stop_token_ids,
            temperature,
            top_p,
            top_k,
            min_p,
            frequency_penalty,
            presence_penalty,
            ignore_eos,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            return_text_in_logprobs,
            seed,
        )
        b = as_backend(backend) if backend is not None else get_default_backend()
        if len(batch_kwargs) > 1:
            self.precache(b)
        n = len(batch_kwargs)
        threads = min(n, 128) if num_threads == "auto" else max(1, min(int(num_threads), n or 1))
        it = self._iter_batch(b, [self._kwargs((), k) for k in batch_kwargs], sp, threads, progress_bar, use_session)
        return it if generator_style else list(it)

    def _iter_batch(
        self,
        b: BaseBackend,
        kws: list[dict],
        sp: SglSamplingParams,
        threads: int,
        progress_bar: bool,
        use_session: bool = True,
    ) -> Iterator[ProgramState]:
        bar = None
        if progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(kws), desc=self.func.__name__)
        try:
            with ThreadPoolExecutor(max(threads, 1)) as pool:
                futs = [pool.submit(run_program, self.func, b, k, sp, False, use_session) for k in kws]
                if bar is not None:
                    for f in futs:
                        f.add_done_callback(lambda _: bar.update())
                for f in futs:
                    yield f.result()
        finally:
            if bar is not None:
                bar.close()

    def trace_prefix(self, backend: Any = None) -> str:
        """The constant text every run of this program starts with (see :mod:`radixrt.lang.tracer`)."""
        b = as_backend(backend) if backend is not None else get_default_backend()
        return extract_prefix(self.func, b, self.bind_arguments)

    def precache(self, backend: Any = None) -> Optional[dict]:
        """Prefill the traced constant prefix once (prefill-only). Returns its meta_info, None if empty."""
        b = as_backend(backend) if backend is not None else get_default_backend()
        prefix = extract_prefix(self.func, b, self.bind_arguments)
        return b.cache_prefix(prefix) if prefix else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], ProgramState):
            return self.func(*args, **kwargs)
        return self.run(*args, **kwargs)
