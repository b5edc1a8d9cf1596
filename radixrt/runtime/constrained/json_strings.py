"""Make xgrammar's JSON-schema grammars accept JSON escapes inside constrained strings.

xgrammar 0.2.9 lowers a string that carries ``maxLength``/``minLength`` to ``"\\"" chars{m,n} "\\""`` with
``chars ::= [^\\"\\\\\\r\\n]``: no escape sequence is allowed (``{"s":"a\\"b"}`` is rejected) while raw
control characters such as TAB are (invalid JSON). A ``pattern`` becomes ``Regex("...", json_string=true)``,
which also refuses every escape, so a pattern string can never contain ``"`` or a newline.

:func:`fix_json_string_rules` rewrites the grammar text (``str(xgrammar.Grammar)``):

- ``chars{m,n}`` of such a bounded class becomes ``Regex(U{m,n})`` where ``U`` is one *decoded* character:
  an unescaped char other than ``"``, ``\\`` and U+0000..U+001F, a short escape, a non-surrogate
  ``\\uXXXX`` or a ``\\uD8xx\\uDCxx`` pair; so bounds count decoded characters, as JSON Schema does.
  Regex rules become FSMs with precomputed masks (fast per token) but cost compile time per unit of
  bound (docs/measurements.md), so bounds above ``EXACT_MAX`` are spelled
  ``Regex(U{min(m,64),64}) [plain]{...}``: escapes are allowed among the first ``WINDOW`` characters,
  plain characters after (a sound subset).
- every ``Regex(p, json_string=true)`` is replaced by ``p`` converted to EBNF (xgrammar's own regex
  converter), each character class / literal widened so that a character the class matches may appear
  raw if JSON allows it raw, else as its escape (``\\"``, ``\\\\``, ``\\n``, ``\\u0001``...); ``\\/`` is
  accepted for ``/``; other ``\\uXXXX`` spellings of ordinary characters are not (a sound subset); ``.``
  does not match line terminators (ECMA-262). The result goes back as EBNF, not as a ``Regex(...)`` rule:
  xgrammar 0.2.9's regex FSM is unsound for an optional group that starts with a loop (``(1+y)?`` accepts
  ``1``; a dev-corpus duration pattern produced ``"112612"``), and the EBNF masks are as fast here
  (docs/measurements.md). tests/test_constrained.py checks patterns against Python's ``re``.

A pattern this module cannot convert (lookaround, backreferences) is refused (ValueError): xgrammar's own rule
for it would not enforce the lookaround.
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger(__name__)
_SHORT = {0x22: '"', 0x5C: "\\", 0x2F: "/", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_BOUNDED_CLASS = '[^\\"\\\\\\r\\n]'
# One decoded character: a raw char, a short escape, a non-surrogate \uXXXX or a \uD8xx\uDCxx pair. As a
# regex: xgrammar compiles Regex(...) rules to FSMs with precomputed masks, far cheaper per mask than a
# repeated EBNF alternation (docs/measurements.md).
_UNIT_RE = (
    '([^"\\\\\\x00-\\x1f]|\\\\(["\\\\/bfnrt]|u([0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|'
    "[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2})))"
)
_PLAIN = '[^\\0-\\x1f\\"\\\\]'  # one unescaped JSON string character (EBNF)
EXACT_MAX = 64  # bounds up to this are exact (compile time grows per unit; xgrammar's FSM stops near 200)
WINDOW = 64  # longer bounds: escapes may appear among the first WINDOW characters, plain ones after
_REGEX_CALL = re.compile(r'Regex\(("(?:[^"\\]|\\.)*")\s*,\s*json_string\s*=\s*true\s*\)')
_SIMPLE_ESC = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B, "0": 0x00, "b": 0x08, "a": 0x07, "e": 0x1B}


def _read_escape(s: str, i: int) -> tuple[int, int]:
    """Decode the escape starting at ``s[i] == '\\\\'``; returns (code point, next index)."""
    c = s[i + 1]
    for letter, width in (("u", 4), ("U", 8), ("x", 2)):
        if c == letter:
            return int(s[i + 2 : i + 2 + width], 16), i + 2 + width
    if c in _SIMPLE_ESC:
        return _SIMPLE_ESC[c], i + 2
    return ord(c), i + 2


def _decode_literal(s: str, i: int) -> tuple[str, int]:
    """Decode the EBNF string literal starting at ``s[i] == '"'``; returns (text, next index)."""
    out, i = [], i + 1
    while s[i] != '"':
        if s[i] == "\\":
            cp, i = _read_escape(s, i)
            out.append(chr(cp))
        else:
            out.append(s[i])
            i += 1
    return "".join(out), i + 1


def _parse_class(s: str, i: int) -> tuple[bool, list[tuple[int, int]], int]:
    """Parse the EBNF class at ``s[i] == '['``; returns (negated, ranges, next index)."""
    i += 1
    negated = s[i] == "^"
    if negated:
        i += 1
    points: list[int] = []
    ranges: list[tuple[int, int]] = []
    pending_dash = False
    while s[i] != "]":
        if s[i] == "\\":
            cp, i = _read_escape(s, i)
        elif s[i] == "-" and points and s[i + 1] != "]":
            pending_dash, i = True, i + 1
            continue
        else:
            cp, i = ord(s[i]), i + 1
        if pending_dash:
            ranges.append((points.pop(), cp))
            pending_dash = False
        else:
            points.append(cp)
    ranges += [(p, p) for p in points]
    return negated, ranges, i + 1


def _cp(c: int) -> str:
    return f"\\u{c:04x}" if c <= 0xFFFF else f"\\U{c:08x}"


def _lit(text: str) -> str:
    """An EBNF string literal matching ``text`` exactly."""
    body = "".join(ch if 0x20 <= ord(ch) < 0x7F and ch not in '"\\' else _cp(ord(ch)) for ch in text)
    return f'"{body}"'


def _hex_ci(text: str) -> str:
    """EBNF for hex digits ``text`` in either case, e.g. ``"1" [fF]``."""
    return " ".join(f"[{ch.lower()}{ch.upper()}]" if ch.isalpha() else f'"{ch}"' for ch in text)


def _escaped_forms(c: int) -> list[str]:
    """EBNF alternatives for a code point that JSON forbids raw or lets escape (``/``)."""
    if c in _SHORT:
        return [_lit("\\" + _SHORT[c])]
    return ['"\\\\u00" ' + _hex_ci(f"{c:02x}")]


def _contains(negated: bool, ranges: list[tuple[int, int]], c: int) -> bool:
    inside = any(lo <= c <= hi for lo, hi in ranges)
    return inside != negated


def _class_to_json(negated: bool, ranges: list[tuple[int, int]]) -> str:
    """EBNF for one JSON-string character that the regex class matches (raw or escaped)."""
    forbidden = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
    alts = []
    if negated:
        alts.append("[^" + "".join(f"{_cp(lo)}-{_cp(hi)}" for lo, hi in ranges + forbidden) + "]")
    else:
        kept: list[tuple[int, int]] = []
        for lo, hi in ranges:
            segs = [(lo, hi)]
            for flo, fhi in forbidden:
                segs = [p for a, b in segs for p in ((a, min(b, flo - 1)), (max(a, fhi + 1), b)) if p[0] <= p[1]]
            kept += segs
        if kept:
            alts.append("[" + "".join(f"{_cp(lo)}-{_cp(hi)}" for lo, hi in kept) + "]")
    specials = [c for c in list(range(0x20)) + [0x22, 0x2F, 0x5C] if _contains(negated, ranges, c)]
    if all(c in specials for c in range(0x20)):  # every control char: one \u00XX rule covers them
        alts.append('"\\\\u00" [01] [0-9a-fA-F]')
        specials = [c for c in specials if c in _SHORT]
    for c in specials:
        alts += _escaped_forms(c)
    if not alts:
        raise ValueError("empty character class")
    return "(" + " | ".join(alts) + ")"


def _literal_to_json(text: str) -> str:
    parts = []
    for ch in text:
        c = ord(ch)
        if c < 0x20 or c in (0x22, 0x5C):
            forms = _escaped_forms(c)
            parts.append(forms[0] if len(forms) == 1 else "(" + " | ".join(forms) + ")")
        elif c == 0x2F:
            parts.append('("/" | "\\\\/")')
        else:
            parts.append(_lit(ch))
    return "(" + " ".join(parts) + ")" if parts else '""'


def _dot_excludes_newlines(pattern: str) -> str:
    """Spell each ``.`` outside a class as ``[^\\n\\r\\u2028\\u2029]`` (ECMA-262/Python meaning);
    xgrammar's converter lets ``.`` match line terminators too."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or out[-1] in ("[", "[^")
        elif ch == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
        elif ch == ".":
            ch = "[^\\n\\r\\u2028\\u2029]"
        out.append(ch)
        i += 1
    return "".join(out)


def _pattern_ebnf(pattern: str) -> str:
    from xgrammar.testing import _regex_to_ebnf  # the installed converter (0.2.9); import errors surface

    try:
        return _regex_to_ebnf(_dot_excludes_newlines(pattern), False).strip()
    except Exception as e:
        raise ValueError(f"pattern {pattern!r}: {e}") from None


def enforceable_pattern(pattern: str) -> str:
    """``pattern`` itself when the grammar can enforce it.

    Raises:
        ValueError: lookaround, backreferences or other syntax xgrammar's regex converter refuses.
    """
    _pattern_ebnf(pattern)
    return pattern


def regex_ebnf_to_json_string(body: str) -> str:
    """Rewrite the EBNF of a regex (xgrammar's converter output) to match its JSON-escaped spelling."""
    out, i, n = [], 0, len(body)
    while i < n:
        ch = body[i]
        if ch == '"':
            text, i = _decode_literal(body, i)
            out.append(_literal_to_json(text))
        elif ch == "[":
            negated, ranges, i = _parse_class(body, i)
            out.append(_class_to_json(negated, ranges))
        elif ch in " \t\n()|*+?":
            out.append(ch)
            i += 1
        elif ch == "{":
            j = body.index("}", i)
            if not re.fullmatch(r"\{\d+(,\s*\d*)?\}", body[i : j + 1]):
                raise ValueError(f"unexpected repetition {body[i : j + 1]!r}")
            out.append(body[i : j + 1])
            i = j + 1
        else:
            raise ValueError(f"unexpected {ch!r} in regex EBNF")
    return "".join(out)


def _ebnf_to_regex(ebnf: str) -> str:
    """Turn the EBNF made by :func:`regex_ebnf_to_json_string` back into a regex (Rust/Python syntax), for
    outlines-core."""
    out, i, n = [], 0, len(ebnf)
    while i < n:
        ch = ebnf[i]
        if ch == '"':
            text, i = _decode_literal(ebnf, i)
            out.append(
                "".join(
                    c if c.isalnum() or c in " _-,:;'\"<>=!@#%&~`/" else (f"\\x{ord(c):02x}" if ord(c) < 0x80 else c)
                    for c in text
                )
            )
        elif ch == "[":
            j = ebnf.index("]", i + 1)  # our classes hold only \uXXXX escapes, so no "\]" inside
            out.append(ebnf[i : j + 1])
            i = j + 1
        elif ch == "{":
            j = ebnf.index("}", i)
            out.append(ebnf[i : j + 1].replace(" ", ""))
            i = j + 1
        elif ch in "()|*+?":
            out.append(ch)
            i += 1
        elif ch in " \t\n":
            i += 1
        else:
            raise ValueError(f"unexpected {ch!r} in EBNF")
    return "".join(out)


def pattern_to_json_regex(pattern: str) -> str:
    """A regex over the JSON-escaped text of the strings that fully match ``pattern`` (anchors dropped).

    Used by the outlines backend, which splices a schema's ``pattern`` between the quotes verbatim.

    Raises:
        ValueError: xgrammar's regex converter or this module cannot handle ``pattern``.
    """
    return "(" + _ebnf_to_regex(regex_ebnf_to_json_string(_pattern_ebnf(pattern))) + ")"


def _ebnf_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _regex_rule(regex: str) -> str:
    """``Regex("...")`` for xgrammar, which spells code points above U+FFFF ``\\u{...}``."""
    regex = re.sub(r"\\U([0-9a-fA-F]{8})", lambda m: "\\u{%x}" % int(m.group(1), 16), regex)
    return f"Regex({_ebnf_string(regex)})"


def _bounded(lo: int, hi: int, rules: dict[str, str]) -> str:
    """EBNF for ``lo..hi`` decoded characters (``hi < 0``: unbounded), adding shared Regex rules to ``rules``.

    The Regex parts are shared rules (xgrammar compiles each rule once) referenced inline (a rule holding
    both parts makes xgrammar's masks orders of magnitude slower: docs/measurements.md).
    """

    def rule(a: int, b: int | None) -> str:
        name = f"radixrt_json_chars_{a}_{'inf' if b is None else b}"
        rules.setdefault(name, _regex_rule(_UNIT_RE + "{%d,%s}" % (a, "" if b is None else b)))
        return name

    if max(lo, hi) <= EXACT_MAX:
        return rule(lo, None if hi < 0 else hi)
    head_lo = min(lo, WINDOW)
    rest = f"{{{lo - head_lo},}}" if hi < 0 else f"{{{lo - head_lo},{hi - WINDOW}}}"
    return f"({rule(head_lo, WINDOW)} {_PLAIN}{rest})"


def fix_json_string_rules(grammar_text: str) -> str:
    """Rewrite a JSON-schema grammar's bounded strings and patterns to accept escapes (see module doc).

    Raises:
        ValueError: a construct this rewriter does not understand.
    """
    names = re.findall(r"^(\S+) ::= \(\(" + re.escape(_BOUNDED_CLASS) + r"\)\)$", grammar_text, flags=re.M)
    text = grammar_text.replace(_BOUNDED_CLASS, _regex_rule(_UNIT_RE))
    rules: dict[str, str] = {}

    def bounded(m: re.Match) -> str:
        lo = int(m.group(2))
        return _bounded(lo, lo if m.group(3) is None else int(m.group(3)), rules)

    for name in names:
        text = re.sub(rf"(?<![\w.-])({re.escape(name)})\{{(\d+)(?:,\s*(-?\d+))?\}}", bounded, text)

    def convert(m: re.Match) -> str:
        pattern, _ = _decode_literal(m.group(1), 0)
        # A pattern the converter refuses (lookaround, backreferences) is refused: xgrammar's own rule for
        # it accepts what the lookahead forbids ("^(?!l)[a-z]{3}$" generated "let").
        return "(" + regex_ebnf_to_json_string(_pattern_ebnf(pattern)) + ")"

    text = _REGEX_CALL.sub(convert, text)
    return text + "".join(f"\n{name} ::= {body}" for name, body in rules.items())
