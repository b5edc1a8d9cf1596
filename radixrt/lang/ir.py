"""The DSL's intermediate representation: what ``s += ...`` appends to a program state.

Expressions are plain data. ``"text" + gen("x")`` builds an :class:`SglExprList`; roles wrap their
content in :class:`SglRoleBegin` / :class:`SglRoleEnd`. The interpreter executes them in order.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from radixrt.lang.sampling_check import check_sampling
from radixrt.lang.tracer import Placeholder, argument_name

# dtype -> regex (SGLang's definitions, minus the trailing whitespace that lets a small model ramble).
REGEX_INT = r"[-+]?[0-9]+"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""
_DTYPE_REGEX = {
    int: REGEX_INT,
    float: REGEX_FLOAT,
    bool: REGEX_BOOL,
    str: REGEX_STR,
    "int": REGEX_INT,
    "float": REGEX_FLOAT,
    "bool": REGEX_BOOL,
    "str": REGEX_STR,
}


def dtype_regex(dtype: Any) -> str:
    """The regex a ``dtype`` (int, float, bool, str or their names) constrains generation to.

    Raises:
        ValueError: any other dtype.
    """
    try:
        return _DTYPE_REGEX[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be one of int, float, bool, str; got {dtype!r}") from None


def schema_to_str(schema: Any) -> str:
    """A ``json_schema`` given as a dict, a JSON string or a pydantic model class -> JSON text.

    Raises:
        ValueError: anything else, or a string that is not JSON.
    """
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
        return schema
    if isinstance(schema, (dict, bool)):
        return json.dumps(schema)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise ValueError(f"json_schema must be a dict, a JSON string or a pydantic model class, got {schema!r}")


@dataclass
class SglSamplingParams:
    """Sampling parameters; ``None`` means "inherit" (from ``run(...)`` defaults, then the server's).
    Raises ValueError naming a field out of the server's range (``sampling_check.check_sampling``)."""

    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    seed: Optional[int] = None
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None
    regex: Optional[str] = None
    json_schema: Optional[str] = None
    speculative: Optional[bool] = None  # False: this call without speculative decoding

    def __post_init__(self) -> None:
        check_sampling(vars(self))  # a ValueError naming the field, where the call is written

    def merged(self, override: "SglSamplingParams") -> "SglSamplingParams":
        """A copy of ``self`` with every non-None field of ``override`` taken over."""
        return dataclasses.replace(self, **{k: v for k, v in vars(override).items() if v is not None})

    def to_srt(self) -> dict:
        """The ``sampling_params`` dict of ``POST /generate`` (only the fields that are set)."""
        keys = (
            "max_new_tokens",
            "min_new_tokens",
            "stop",
            "stop_token_ids",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "ignore_eos",
            "seed",
            "regex",
            "json_schema",
            "speculative",
        )
        fields = vars(self)
        return {k: fields[k] for k in keys if fields[k] is not None}


DEFAULT_RUN_PARAMS = SglSamplingParams(max_new_tokens=128, temperature=1.0, top_p=1.0, top_k=-1)


class SglExpr:
    """Base of every expression. ``a + b`` concatenates into an :class:`SglExprList`."""

    def __add__(self, other: Any) -> "SglExprList":
        return SglExprList([self, to_expr(other)])

    def __radd__(self, other: Any) -> "SglExprList":
        return SglExprList([to_expr(other), self])


@dataclass(eq=False)
class SglConstantText(SglExpr):
    value: str


@dataclass(eq=False)
class SglExprList(SglExpr):
    exprs: list = field(default_factory=list)

    def __post_init__(self) -> None:  # flatten nested lists
        flat: list = []
        for e in self.exprs:
            flat.extend(e.exprs if isinstance(e, SglExprList) else [e])
        self.exprs = flat


@dataclass(eq=False)
class SglGen(SglExpr):
    name: Optional[str]
    sampling_params: SglSamplingParams
    dtype: Any = None


@dataclass(eq=False)
class SglSelect(SglExpr):
    name: Optional[str]
    choices: list[str]
    temperature: float
    choices_method: Any


@dataclass(eq=False)
class SglRoleBegin(SglExpr):
    role: str


@dataclass(eq=False)
class SglRoleEnd(SglExpr):
    role: str


@dataclass(eq=False)
class SglArgument(SglExpr):
    """A program argument during tracing (never reaches a real executor)."""

    name: str


@dataclass(eq=False)
class SglConcateAndAppend(SglExpr):
    """``forks.join("concate_and_append")``: append each child's new text to the parent."""

    states: list


def to_expr(x: Any) -> SglExpr:
    """Turn a string (or a tracing placeholder) into an expression; expressions pass through.

    Raises:
        ValueError: ``None`` or a non-text value.
    """
    if isinstance(x, SglExpr):
        return x
    if isinstance(x, Placeholder):
        return SglArgument(argument_name(x))
    if isinstance(x, str):
        return SglConstantText(x)
    if x is None:
        raise ValueError("cannot append None to a program state")
    if isinstance(x, (int, float)):
        return SglConstantText(str(x))
    raise ValueError(f"cannot append a {type(x).__name__} to a program state (use a string or a primitive)")


def role_expr(role: str, content: Any = None) -> SglExpr:
    """``user("...")``: begin, content, end. ``user()`` with no content is an empty message."""
    if content is None:
        return SglExprList([SglRoleBegin(role), SglRoleEnd(role)])
    return SglExprList([SglRoleBegin(role), to_expr(content), SglRoleEnd(role)])


ChoicesMethod = Callable[..., Any]
