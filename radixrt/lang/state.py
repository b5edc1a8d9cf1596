"""What a program sees: :class:`ProgramState` (``s``) and :class:`ProgramStateGroup` (``s.fork(n)``).

``s += expr`` queues ``expr`` on the state's executor (:mod:`radixrt.lang.interpreter`) and returns at
once; ``s["name"]``, ``s.text()``, ``s.messages()`` and ``s.error()`` wait for what was queued before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional

from radixrt.lang.ir import SglConcateAndAppend, SglExpr, SglExprList, SglRoleBegin, SglRoleEnd, to_expr

if TYPE_CHECKING:
    from radixrt.lang.interpreter import StreamExecutor


class ProgramState:
    """What a program sees as ``s``: append with ``+=``, read with ``s["name"]``, ``s.text()``..."""

    def __init__(self, stream_executor: StreamExecutor) -> None:
        self.stream_executor = stream_executor
        self.ret_value: Any = None

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            self.stream_executor.submit(SglExprList([SglRoleBegin(role), to_expr(expr), SglRoleEnd(role)]))
            return None

        @contextmanager
        def scope() -> Iterator[None]:
            self.stream_executor.submit(SglRoleBegin(role))
            yield
            self.stream_executor.submit(SglRoleEnd(role))

        return scope()

    def system(self, expr: Any = None) -> Any:
        """``s.system("...")`` appends a system message; ``with s.system(): ...`` wraps appends in one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    def fork(self, size: int = 1) -> "ProgramStateGroup":
        """``size`` states continuing from this one's text (its shared text is prefilled once)."""
        return ProgramStateGroup([ProgramState(x) for x in self.stream_executor.fork(size)], self)

    @contextmanager
    def copy(self) -> Iterator["ProgramState"]:
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def text(self) -> str:
        self.stream_executor.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict]:
        """The conversation as OpenAI-style messages (complete messages only)."""
        self.stream_executor.sync()
        return list(self.stream_executor.messages_)

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> Optional[Exception]:
        """The exception that stopped this program (None when it ran through)."""
        self.stream_executor.sync()
        return self.stream_executor.error_

    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        """Yield text as it is produced (the whole text, or one variable) until it is complete.

        Without ``stream=True`` yields the final text (or value) once.
        """
        exe = self.stream_executor
        if not exe.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        prev = 0
        while True:
            with exe.cond:
                while True:
                    ev = exe.variable_event.get(var_name) if var_name is not None else None
                    done = exe.is_finished or exe.error_ is not None or (ev is not None and ev.is_set())
                    cur = exe.text_ if var_name is None else str(exe.variables.get(var_name, ""))
                    if len(cur) > prev or done:
                        break
                    exe.cond.wait(1.0)
            if len(cur) > prev:
                yield cur[prev:]
                prev = len(cur)
            if done:
                return

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.variables[name] = value

    def get_meta_info(self, name: str) -> Any:
        """The backend's meta info of ``gen``/``select`` ``name`` (cached_tokens, e2e_latency, finish_reason,
        prompt_tokens, completion_tokens; for select: scores per choice)."""
        return self.stream_executor.get_meta_info(name)

    def __iadd__(self, other: Any) -> "ProgramState":
        if other is None:
            raise ValueError("cannot append None to a program state")
        self.stream_executor.submit(other)
        return self

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The states of a ``fork``: ``forks += expr`` (or a list, or ``lambda i: expr``) appends to each."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState) -> None:
        self.states, self.src_state = states, src_state

    def join(self, mode: str = "gather_variable") -> None:
        """``gather_variable``: each new child variable becomes a list on the parent, one value per child.
        ``concate_and_append``: the children's new text is appended to the parent, in order.

        Raises:
            the first child's error, if a child failed (the parent program then fails with it).
        """
        for st in self.states:
            st.stream_executor.sync()
        failed = [st.stream_executor.error_ for st in self.states if st.stream_executor.error_ is not None]
        if failed:
            raise failed[0]
        if mode == "gather_variable":
            src = self.src_state.stream_executor
            src.sync()
            known = set(src.variables)
            for st in self.states:
                for k in [k for k in st.stream_executor.variables if k not in known]:
                    src.variables.setdefault(k, []).append(st.stream_executor.variables[k])
                    src.meta_info.setdefault(k, []).append(st.stream_executor.meta_info.get(k))
        elif mode == "concate_and_append":
            self.src_state += SglConcateAndAppend(self.states)
            self.src_state.sync()
        else:
            raise ValueError(f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}")

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """Makes ``forks[i] += expr`` work (``+=`` appends in place and assigns the same state back)."""
        if value is not self.states[i]:
            raise ValueError("a fork group's states cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} expressions for {len(self.states)} forks")
            items: list[Any] = list(other)
        elif callable(other) and not isinstance(other, SglExpr):
            items = [other(i) for i in range(len(self.states))]
        else:
            items = [other] * len(self.states)
        for st, x in zip(self.states, items):
            st += x
        return self
