"""Program states: ``s += ...`` queues an expression; a worker thread per state executes them in order.

``s += expr`` (:mod:`radixrt.lang.state`) returns at once, so the children of a ``fork`` (and the
programs of a batch) send their requests concurrently and the server batches them. Reading a variable
(``s["x"]``), ``s.text()`` or ``s.messages()`` waits for what was queued before it. An exception while
executing is kept on the state (``state.error()``); later expressions of that state are skipped and
every variable wait is released.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import Any, Optional

from radixrt.lang.backend.base import BackendConnectionError, BackendError, RequestError
from radixrt.lang.ir import (
    SglArgument,
    SglConcateAndAppend,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
    dtype_regex,
    to_expr,
)
from radixrt.lang.tracer import StopTrace

_END = object()


def _named(e: Exception, what: str) -> Exception:
    """Re-raise a backend error with the primitive (and its variable name) that caused it."""
    for cls in (RequestError, BackendConnectionError, BackendError):
        if isinstance(e, cls):
            return cls(f"{what}: {e}")
    return e


class StreamExecutor:
    """Executes one state's expressions. ``trace=True`` executes inline and stops at the first dynamic step."""

    def __init__(
        self,
        backend: Any,
        arguments: dict,
        default_sp: SglSamplingParams,
        chat_template: Any = None,
        stream: bool = False,
        trace: bool = False,
    ) -> None:
        self.sid = uuid.uuid4().hex
        self.session_id: Optional[str] = None  # the runtime session pinning this program's KV (program.py)
        self.backend, self.arguments, self.default_sp = backend, arguments, default_sp
        self.stream, self.trace = stream, trace
        self.variables: dict[Optional[str], Any] = {}
        self.variable_event: dict[Optional[str], threading.Event] = {}
        self.meta_info: dict[Optional[str], Any] = {}
        self.error_: Optional[Exception] = None
        self.text_ = ""
        self.messages_: list[dict] = []
        self.chat_template = chat_template or backend.get_chat_template()
        self.cur_role: Optional[str] = None
        self.cur_role_begin_pos: Optional[int] = None
        self.fork_start_text_pos: Optional[int] = None
        self.is_finished = False
        self.cond = threading.Condition()  # guards the queue and text/variable updates; notified on change
        self._queue: deque = deque()
        self._pending = 0
        self._worker: Optional[threading.Thread] = None

    # ---- queueing ------------------------------------------------------------------------------------
    def submit(self, expr: Any) -> None:
        if expr is not _END:
            expr = to_expr(expr)
        if self.trace:
            if expr is not _END:
                self._init_var_event(expr)
                self._execute(expr)
            return
        with self.cond:
            if expr is not _END:
                self._init_var_event(expr)
                if self.error_ is not None:  # it will be skipped: never let a reader wait for it
                    for ev in self.variable_event.values():
                        ev.set()
            self._queue.append(expr)
            self._pending += 1
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name=f"radixrt-state-{self.sid[:6]}", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        while True:
            with self.cond:
                if not self._queue:
                    self._worker = None
                    return
                expr = self._queue.popleft()
            try:
                if expr is _END:
                    self.is_finished = True
                elif self.error_ is None:
                    self._execute(expr)
            except Exception as e:  # noqa: BLE001 - kept on the state, see the module docstring
                self.set_error(e)
            finally:
                with self.cond:
                    self._pending -= 1
                    self.cond.notify_all()

    def set_error(self, e: Exception) -> None:
        with self.cond:
            if self.error_ is None:
                self.error_ = e
            for ev in self.variable_event.values():
                ev.set()
            self.cond.notify_all()

    def sync(self) -> None:
        """Wait until everything queued so far has run."""
        with self.cond:
            while self._pending:
                self.cond.wait()

    def end(self) -> None:
        """The program function returned: mark the state finished once its queue drains."""
        if self.trace:
            self.is_finished = True
        else:
            self.submit(_END)

    # ---- reading -------------------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:
        if self.trace:
            raise StopTrace(name)
        ev = self.variable_event.get(name)
        if ev is not None:
            ev.wait()
        if name not in self.variables:
            if self.error_ is not None:
                raise RuntimeError(f"variable {name!r} is missing: the program failed: {self.error_}") from self.error_
            raise KeyError(f"no variable {name!r}; variables: {sorted(str(k) for k in self.variables)}")
        return self.variables[name]

    def get_meta_info(self, name: str) -> Any:
        ev = self.variable_event.get(name)
        if ev is not None:
            ev.wait()
        return self.meta_info.get(name)

    def fork(self, size: int) -> list["StreamExecutor"]:
        """Children that start from this state's text. The shared text is prefilled once first."""
        if self.trace:
            raise StopTrace("fork")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"fork size must be a positive integer, got {size!r}")
        self.sync()
        if self.error_ is not None:
            raise RuntimeError(f"cannot fork a failed state: {self.error_}") from self.error_
        if size > 1 and self.text_:
            self.backend.cache_prefix(self.text_)
        kids = [
            StreamExecutor(self.backend, self.arguments, self.default_sp, self.chat_template, self.stream)
            for _ in range(size)
        ]
        for k in kids:
            k.variables, k.meta_info = dict(self.variables), dict(self.meta_info)
            k.text_, k.messages_ = self.text_, list(self.messages_)
            k.cur_role, k.cur_role_begin_pos = self.cur_role, self.cur_role_begin_pos
            k.fork_start_text_pos = len(self.text_)
            k.session_id = self.session_id
        return kids

    # ---- execution -----------------------------------------------------------------------------------
    def _init_var_event(self, expr: SglExpr) -> None:
        if isinstance(expr, (SglGen, SglSelect)):
            self.variable_event[expr.name] = threading.Event()
        elif isinstance(expr, SglExprList):
            for e in expr.exprs:
                self._init_var_event(e)

    def _fill(self, value: str) -> None:
        with self.cond:
            self.text_ += value
            self.cond.notify_all()

    def _execute(self, e: SglExpr) -> None:
        if isinstance(e, SglConstantText):
            self._fill(e.value)
        elif isinstance(e, SglExprList):
            for x in e.exprs:
                self._execute(x)
        elif isinstance(e, SglRoleBegin):
            self._role_begin(e.role)
        elif isinstance(e, SglRoleEnd):
            self._role_end(e.role)
        elif self.trace or isinstance(e, SglArgument):
            raise StopTrace(type(e).__name__)
        elif isinstance(e, SglGen):
            self._gen(e)
        elif isinstance(e, SglSelect):
            self._select(e)
        elif isinstance(e, SglConcateAndAppend):
            new = ""
            for st in e.states:
                st.stream_executor.sync()
                new += st.stream_executor.text_[st.stream_executor.fork_start_text_pos :]
            self._fill(new)
        else:
            raise ValueError(f"unknown expression {e!r}")

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"cannot begin a {role!r} message inside an open {self.cur_role!r} message")
        if not self.messages_ and role != "system" and self.chat_template.default_system_prompt:
            self._role_begin("system")
            self._fill(self.chat_template.default_system_prompt)
            self._role_end("system")
        prefix, _ = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self.cur_role = role
        self._fill(prefix)
        self.cur_role_begin_pos = len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"{role}_end without a matching {role}_begin (open message: {self.cur_role!r})")
        content = self.text_[self.cur_role_begin_pos :]
        _, suffix = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self.cur_role = None
        self._fill(suffix)
        self.messages_.append({"role": role, "content": content})

    def _set(self, name: Optional[str], value: Any, meta: Any) -> None:
        with self.cond:
            self.variables[name] = value
            self.meta_info[name] = meta
            self.cond.notify_all()
        self.variable_event[name].set()

    def _gen(self, e: SglGen) -> None:
        what = f"gen({e.name!r})"
        sp = self.default_sp.merged(e.sampling_params)
        if e.dtype is not None and sp.regex is None and sp.json_schema is None:
            sp.regex = dtype_regex(e.dtype)
        if not self.text_:
            raise ValueError(f"{what}: nothing to continue: the state has no text yet")
        try:
            if not self.stream:
                comp, meta = self.backend.generate(self, sp)
                self._fill(comp)
                self._set(e.name, comp, meta)
                return
            with self.cond:
                self.variables[e.name] = ""
            meta: dict = {}
            for delta, meta in self.backend.generate_stream(self, sp):
                with self.cond:
                    self.text_ += delta
                    self.variables[e.name] += delta
                    self.cond.notify_all()
            self._set(e.name, self.variables[e.name], meta)
        except Exception as ex:
            raise _named(ex, what) from ex

    def _select(self, e: SglSelect) -> None:
        try:
            d = self.backend.select(self, e.choices, e.temperature, e.choices_method)
        except Exception as ex:
            raise _named(ex, f"select({e.name!r})") from ex
        self._fill(d.decision)
        self._set(e.name, d.decision, d.meta_info)
