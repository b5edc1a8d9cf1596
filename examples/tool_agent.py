"""A ReAct-style agent with real Python tools, run as a batch on the prefix cache.

Every step the model emits ONE tool call, generated under the tools' JSON schema (so it always parses),
the call is executed and its observation appended as the next user message. The loop ends with a
``final_answer`` call or at the step bound (the last step, and the step after a repeated call, may only
answer). The system prompt and the
few-shot turns are the same for every question: ``run_batch`` prefills them once, and every later step
reuses all earlier turns of its own conversation from the radix cache.

Tools: a calculator on ``ast`` (numbers and + - * / ** % ( ) only), a unit converter, and a lookup
over ``examples/data/knowledge.json``.

    radixrt serve &                      # HTTP on :30000, the DSL's ZMQ socket on :30001
    python examples/tool_agent.py        # --backend http://127.0.0.1:30000 | engine, --small
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jsonschema  # noqa: E402

import radixrt as rt  # noqa: E402
from _util import add_backend_arg, make_backend, token_usage  # noqa: E402

KNOWLEDGE: dict = json.loads((Path(__file__).resolve().parent / "data" / "knowledge.json").read_text())

# ---- tools -------------------------------------------------------------------------------------------
_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UN = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> float:
    """Evaluate arithmetic safely (no names, calls or attributes). Raises ValueError on anything else."""

    def ev(n: ast.AST) -> float:
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _BIN:
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Pow) and abs(b) > 64:
                raise ValueError("exponent too large")
            return _BIN[type(n.op)](a, b)
        if isinstance(n, ast.UnaryOp) and type(n.op) in _UN:
            return _UN[type(n.op)](ev(n.operand))
        raise ValueError(f"not allowed in an expression: {type(n).__name__}")

    try:
        return ev(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ZeroDivisionError, OverflowError) as e:
        raise ValueError(f"cannot evaluate {expression!r}: {e}") from None


_FACTORS = {
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "cm": ("length", 0.01),
    "mi": ("length", 1609.344),
    "ft": ("length", 0.3048),
    "in": ("length", 0.0254),
    "kg": ("mass", 1.0),
    "g": ("mass", 0.001),
    "lb": ("mass", 0.45359237),
    "s": ("time", 1.0),
    "min": ("time", 60.0),
    "h": ("time", 3600.0),
    "day": ("time", 86400.0),
}
_TEMPS = ("c", "f", "k")
UNITS = list(_FACTORS) + list(_TEMPS)


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Convert between units of one kind (length, mass, time, temperature). Raises ValueError otherwise."""
    if from_unit in _TEMPS and to_unit in _TEMPS:
        c = {"c": value, "f": (value - 32) * 5 / 9, "k": value - 273.15}[from_unit]
        return {"c": c, "f": c * 9 / 5 + 32, "k": c + 273.15}[to_unit]
    (k1, f1), (k2, f2) = _FACTORS.get(from_unit, ("?", 0)), _FACTORS.get(to_unit, ("!", 0))
    if k1 != k2:
        raise ValueError(f"cannot convert {from_unit} to {to_unit}")
    return value * f1 / f2


def _fmt(x: float) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def run_tool(call: dict) -> str:
    """Execute a parsed tool call; the observation text (errors become observations too)."""
    try:
        if call["tool"] == "calculator":
            return _fmt(calculator(call["expression"]))
        if call["tool"] == "convert":
            v = float(call["value"])
            a, b = call["from_unit"], call["to_unit"]
            return f"{call['value']} {a} = {_fmt(convert(v, a, b))} {b}"
        if call["tool"] == "lookup":
            return KNOWLEDGE[call["key"]]["fact"]
    except (ValueError, KeyError) as e:
        return f"error: {e}"
    return f"error: unknown tool {call.get('tool')!r}"


# ---- the schema every call is generated under ---------------------------------------------------------
EXPR_MAX, NUM_MAX, ANSWER_MAX = 40, 12, 48


def _tool(name: str, **props: Any) -> dict:
    return {
        "type": "object",
        "properties": {"tool": {"const": name}, **props},
        "required": ["tool", *props],
        "additionalProperties": False,
    }


FINAL = _tool(
    "final_answer",
    answer={"type": "string", "maxLength": ANSWER_MAX, "pattern": f"^[A-Za-z0-9 .,:%()/+-]{{1,{ANSWER_MAX}}}$"},
)
CALL_SCHEMA = {
    "anyOf": [
        _tool(
            "calculator",
            expression={"type": "string", "maxLength": EXPR_MAX, "pattern": f"^[0-9+*/%(). -]{{1,{EXPR_MAX}}}$"},
        ),
        _tool(
            "convert",
            value={"type": "string", "maxLength": NUM_MAX, "pattern": r"^-?[0-9]{1,7}(\.[0-9]{1,3})?$"},
            from_unit={"enum": UNITS},
            to_unit={"enum": UNITS},
        ),
        _tool("lookup", key={"enum": sorted(KNOWLEDGE)}),
        FINAL,
    ]
}
_LONGEST = [
    {"tool": "calculator", "expression": "x" * EXPR_MAX},
    {"tool": "convert", "value": "x" * NUM_MAX, "from_unit": max(UNITS, key=len), "to_unit": max(UNITS, key=len)},
    {"tool": "lookup", "key": max(KNOWLEDGE, key=len)},
    {"tool": "final_answer", "answer": "x" * ANSWER_MAX},
]
# The patterns admit no character JSON must escape and every token is >= 1 character, so this many tokens
# always completes the longest call (+1 for the end-of-turn token): a call can never be cut off.
CALL_MAX_TOKENS = max(len(json.dumps(c, separators=(",", ":"))) for c in _LONGEST) + 1

KEYS, UNIT_LIST = ", ".join(sorted(KNOWLEDGE)), " ".join(UNITS) + " (c f k are degrees)"
SYSTEM = f"""You answer questions by calling tools. Reply with exactly one JSON tool call per message.
Tools:
- lookup: a fact from the knowledge base. {{"tool":"lookup","key":"KEY"}} with KEY one of: {KEYS}.
- convert: unit conversion. {{"tool":"convert","value":"330","from_unit":"m","to_unit":"ft"}}. Units: {UNIT_LIST}.
- calculator: arithmetic with + - * / ( ). {{"tool":"calculator","expression":"17*23"}}
- final_answer: {{"tool":"final_answer","answer":"..."}} once you know the answer.
Each call is answered with an Observation."""
FEW_SHOT = [
    ("What is 12 * 12 + 1?", '{"tool":"calculator","expression":"12*12+1"}'),
    ("Observation: 145", '{"tool":"final_answer","answer":"12 * 12 + 1 = 145"}'),
    ("How many meters are in 3 km?", '{"tool":"convert","value":"3","from_unit":"km","to_unit":"m"}'),
    ("Observation: 3 km = 3000 m", '{"tool":"final_answer","answer":"3 km is 3000 m."}'),
    ("How tall is Mount Everest in kilometers?", '{"tool":"lookup","key":"mount_everest_height"}'),
    ("Observation: Mount Everest is 8849 m high.", '{"tool":"convert","value":"8849","from_unit":"m","to_unit":"km"}'),
    ("Observation: 8849 m = 8.849 km", '{"tool":"final_answer","answer":"Mount Everest is 8.849 km high."}'),
]
QUESTIONS = [
    "How tall is the Eiffel Tower in feet?",
    "What is 17 * 23?",
    "Convert 100 km to miles.",
    "How long is a marathon in miles?",
    "What is the boiling point of water in Fahrenheit?",
    "How many seconds are in 3 hours?",
    "What is (125 + 375) / 4?",
    "How high is Mount Everest in feet?",
    "How many kilograms is 200 pounds?",
    "What is the capital of Japan?",
    "How far away is the Moon in miles?",
    "What is 2 to the power of 10?",
    "How many hours are in a leap year?",
    "What is 15% of 240?",
    "How heavy is a blue whale in pounds?",
    "When was Python first released?",
    "What is normal human body temperature in Fahrenheit?",
    "How long is a football pitch in feet?",
]


@rt.function
def agent(s: Any, question: str, max_steps: int) -> list[dict]:
    """One conversation; returns the calls: {raw, parsed, call, observation}. Sets s["answer"]."""
    s += rt.system(SYSTEM)
    for u, a in FEW_SHOT:
        s += rt.user(u)
        s += rt.assistant(a)
    s += rt.user(question)
    calls: list[dict] = []
    for step in range(max_steps):
        # The last step may only answer; so may the step after a call that repeats the one before it.
        repeated = len(calls) >= 2 and calls[-1]["raw"] == calls[-2]["raw"]
        schema = FINAL if step == max_steps - 1 or repeated else CALL_SCHEMA
        name = f"call_{step}"
        s += rt.assistant(rt.gen(name, json_schema=schema, max_tokens=CALL_MAX_TOKENS, temperature=0))
        rec: dict = {"raw": s[name], "parsed": False}
        calls.append(rec)
        try:
            rec["call"] = json.loads(rec["raw"])
            jsonschema.validate(rec["call"], CALL_SCHEMA)
            rec["parsed"] = True
        except (ValueError, jsonschema.ValidationError):
            break
        if rec["call"]["tool"] == "final_answer":
            s["answer"] = rec["call"]["answer"]
            break
        rec["observation"] = run_tool(rec["call"])
        s += rt.user(f"Observation: {rec['observation']}")
    return calls


def main(argv: Optional[list[str]] = None, backend: Any = None) -> dict:
    """Run the batch and print the report; returns the summary numbers."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_backend_arg(p)
    p.add_argument("--small", action="store_true", help="4 questions, 2 steps (for tests)")
    p.add_argument("--max-steps", type=int, default=None, help="step bound per question (default 4; --small: 2)")
    p.add_argument("--num-questions", type=int, default=None, help="default all 18 (--small: 4)")
    a = p.parse_args(argv)
    steps = a.max_steps or (2 if a.small else 4)
    questions = QUESTIONS[: a.num_questions or (4 if a.small else len(QUESTIONS))]
    b = make_backend(backend if backend is not None else a.backend)
    t0 = time.perf_counter()
    states = agent.run_batch([{"question": q, "max_steps": steps} for q in questions], backend=b, progress_bar=True)
    wall = time.perf_counter() - t0
    all_calls, failed = [], 0
    for q, st in zip(questions, states):
        if st.error() is not None:
            failed += 1
            print(f"Q: {q}\n   error: {st.error()}")
            continue
        calls = st.ret_value
        all_calls += calls
        tools = " -> ".join(c["call"]["tool"] if c["parsed"] else "UNPARSED" for c in calls)
        answer = st["answer"] if "answer" in st else "(no final answer)"
        print(f"Q: {q}\n   A: {answer}\n   calls: {tools}")
        for c in calls:
            if "observation" in c:
                print(f"      {c['raw']}  ->  {c['observation']}")
    u = token_usage(states)
    parsed = sum(c["parsed"] for c in all_calls)
    tool_calls = sum(1 for c in all_calls if c["parsed"] and c["call"]["tool"] != "final_answer")
    answered = sum("answer" in st for st in states)
    summary = {
        "questions": len(questions),
        "failed_programs": failed,
        "calls": len(all_calls),
        "tool_calls": tool_calls,
        "parsed": parsed,
        "parsed_share": parsed / max(len(all_calls), 1),
        "answered": answered,
        "cached_share": u["cached_share"],
        "prompt_tokens": u["prompt_tokens"],
        "cached_tokens": u["cached_tokens"],
        "completion_tokens": u["completion_tokens"],
        "wall_s": wall,
        "tokens_per_s": u["completion_tokens"] / wall,
        "questions_per_s": len(questions) / wall,
    }
    print(f"\n== {len(questions)} questions, {steps} steps max, {failed} failed programs ==")
    print(
        f"tool calls made: {tool_calls} (+ {len(all_calls) - tool_calls} final answers); "
        f"final answers: {answered}/{len(questions)}"
    )
    print(f"calls that parsed: {parsed}/{len(all_calls)} ({100 * summary['parsed_share']:.1f} %)")
    print(
        f"cached-token share: {100 * u['cached_share']:.1f} % ({u['cached_tokens']} of {u['prompt_tokens']} "
        f"prompt tokens, {u['requests']} requests)"
    )
    print(
        f"throughput: {summary['tokens_per_s']:.1f} generated tokens/s, {summary['questions_per_s']:.2f} "
        f"questions/s ({u['completion_tokens']} tokens in {wall:.1f} s)"
    )
    return summary


if __name__ == "__main__":
    main()
