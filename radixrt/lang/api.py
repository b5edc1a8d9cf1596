"""The public DSL, SGLang's frontend spelling: ``import radixrt as rt`` then ``@rt.function``,
``rt.gen``, ``rt.select``, ``rt.system/user/assistant``, ``rt.set_default_backend``...

    @rt.function
    def qa(s, question):
        s += rt.system("You are terse.")
        s += rt.user(question)
        s += rt.assistant(rt.gen("answer", max_tokens=32))

    rt.set_default_backend(rt.RuntimeEndpoint("tcp://127.0.0.1:30001"))
    state = qa.run(question="Capital of France?", temperature=0)
    state["answer"], state.get_meta_info("answer")["cached_tokens"]
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from radixrt.lang.backend import BackendConnectionError, BackendError, BaseBackend, RequestError, RuntimeEndpoint
from radixrt.lang.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    check_choices,
    greedy_token_selection,
    resolve_method,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixrt.lang.state import ProgramState, ProgramStateGroup
from radixrt.lang.sampling_check import check_sampling
from radixrt.lang.ir import (
    SglExpr,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
    dtype_regex,
    role_expr,
    schema_to_str,
)
from radixrt.lang.program import SglFunction, get_default_backend, set_default_backend

# Also here, imported lazily (so that a ZMQ/HTTP client never imports torch or openai): Engine, EngineBackend,
# OpenAI.
__all__ = [
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "select",
    "system",
    "user",
    "assistant",
    "system_begin",
    "system_end",
    "user_begin",
    "user_end",
    "assistant_begin",
    "assistant_end",
    "set_default_backend",
    "get_default_backend",
    "flush_cache",
    "get_server_info",
    "RuntimeEndpoint",
    "ProgramState",
    "ProgramStateGroup",
    "SglFunction",
    "BaseBackend",
    "BackendError",
    "BackendConnectionError",
    "RequestError",
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "token_length_normalized",
    "greedy_token_selection",
    "unconditional_likelihood_normalized",
]


def function(func: Optional[Callable] = None, **kwargs: Any) -> Any:
    """Decorator: ``@function`` or ``@function()`` turns ``def prog(s, ...)`` into a runnable program."""
    if func is not None:
        return SglFunction(func)
    return lambda f: SglFunction(f)


def _check_name(name: Any, what: str) -> None:
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{what}: name must be a string, got {name!r}")


def gen(
    name: Optional[str] = None,
    max_tokens: Optional[int] = None,
    min_tokens: Optional[int] = None,
    stop: Optional[Union[str, list[str]]] = None,
    stop_token_ids: Optional[list[int]] = None,
    temperature: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    ignore_eos: Optional[bool] = None,
    return_logprob: Optional[bool] = None,
    logprob_start_len: Optional[int] = None,
    top_logprobs_num: Optional[int] = None,
    return_text_in_logprobs: Optional[bool] = None,
    dtype: Any = None,
    choices: Optional[list[str]] = None,
    choices_method: Any = None,
    regex: Optional[str] = None,
    json_schema: Any = None,
    seed: Optional[int] = None,
    repetition_penalty: Optional[float] = None,
    speculative: Optional[bool] = None,
) -> SglExpr:
    """Generate into variable ``name``. ``max_tokens`` etc. override ``run(...)``'s defaults.

    ``json_schema``: a dict, a JSON string or a pydantic model class; ``regex``: a regex the output must
    fullmatch; ``dtype``: int, float, bool or str (becomes a regex; the value stays a string);
    ``choices``: the same as :func:`select`; ``speculative=False``: this call decodes without the server's
    speculative decoding (``--speculative-algorithm``; the same tokens, greedy or seeded, either way).

    Raises:
        ValueError: two grammars, a bad dtype, a json_schema of the wrong kind, a speculative that is not a
            bool, a sampling argument outside the server's range (``sampling_check``), naming the variable.
            A regex or schema the server cannot compile fails when the gen runs, on ``state.error()``,
            with the variable's name.
    """
    what = f"gen({name!r})"
    _check_name(name, what)
    if choices is not None:
        if regex is not None or json_schema is not None or dtype is not None:
            raise ValueError(f"{what}: give choices or one of regex, json_schema and dtype, not both")
        return select(
            name,
            choices,
            temperature=0.0 if temperature is None else temperature,
            choices_method=choices_method or token_length_normalized,
        )
    try:
        schema = None if json_schema is None else schema_to_str(json_schema)
        if dtype is not None:
            dtype_regex(dtype)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    if sum(x is not None for x in (regex, schema, dtype)) > 1:
        raise ValueError(f"{what}: give at most one of regex, json_schema and dtype")
    if regex is not None and not isinstance(regex, str):
        raise ValueError(f"{what}: regex must be a string, got {regex!r}")
    if speculative is not None and not isinstance(speculative, bool):
        raise ValueError(f"{what}: speculative must be a bool, got {speculative!r}")
    try:
        sp = SglSamplingParams(
            max_new_tokens=max_tokens,
            min_new_tokens=min_tokens,
            stop=stop,
            stop_token_ids=stop_token_ids,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            repetition_penalty=repetition_penalty,
            ignore_eos=ignore_eos,
            seed=seed,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            regex=regex,
            json_schema=schema,
            speculative=speculative,
        )
    except ValueError as e:  # in gen's own words: max_tokens, min_tokens
        raise ValueError(f"{what}: {str(e).replace('_new_tokens', '_tokens')}") from None
    return SglGen(name, sp, dtype)


def gen_int(name: Optional[str] = None, **kwargs: Any) -> SglExpr:
    """``gen(name, dtype=int, ...)``."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: Optional[str] = None, **kwargs: Any) -> SglExpr:
    """``gen(name, dtype=str, ...)``."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: Optional[str] = None,
    choices: Optional[list[str]] = None,
    temperature: float = 0.0,
    choices_method: Any = token_length_normalized,
) -> SglExpr:
    """Append the best of ``choices`` and store it in ``name``; see :mod:`radixrt.lang.choices`.

    ``choices_method``: ``token_length_normalized`` (default), ``greedy_token_selection``,
    ``unconditional_likelihood_normalized`` (objects or names). Meta info holds every choice's score.
    ``temperature`` is accepted for SGLang compatibility; the choice is always the method's argmax.

    Raises:
        ValueError: no/empty/repeated choices, an unknown method or a temperature below 0.
    """
    what = f"select({name!r})"
    _check_name(name, what)
    try:
        check_sampling({"temperature": temperature})
        return SglSelect(name, check_choices(choices), temperature, resolve_method(choices_method))
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def system(expr: Any = None) -> SglExpr:
    return role_expr("system", expr)


def user(expr: Any = None) -> SglExpr:
    return role_expr("user", expr)


def assistant(expr: Any = None) -> SglExpr:
    return role_expr("assistant", expr)


def system_begin() -> SglExpr:
    return SglRoleBegin("system")


def system_end() -> SglExpr:
    return SglRoleEnd("system")


def user_begin() -> SglExpr:
    return SglRoleBegin("user")


def user_end() -> SglExpr:
    return SglRoleEnd("user")


def assistant_begin() -> SglExpr:
    return SglRoleBegin("assistant")


def assistant_end() -> SglExpr:
    return SglRoleEnd("assistant")


def flush_cache(backend: Any = None) -> bool:
    """Free the backend's cached prefixes (False while requests run)."""
    from radixrt.lang.program import as_backend

    return (as_backend(backend) if backend is not None else get_default_backend()).flush_cache()


def get_server_info(backend: Any = None) -> dict:
    from radixrt.lang.program import as_backend

    return (as_backend(backend) if backend is not None else get_default_backend()).get_server_info()


def __getattr__(name: str) -> Any:  # lazy, so that a ZMQ/HTTP client never imports torch or openai
    if name == "Engine":
        from radixrt.runtime.engine import Engine

        return Engine
    if name == "EngineBackend":
        from radixrt.lang.backend.engine import EngineBackend

        return EngineBackend
    if name == "OpenAI":
        from radixrt.lang.backend.openai import OpenAI

        return OpenAI
    raise AttributeError(f"module 'radixrt.lang.api' has no attribute {name!r}")
