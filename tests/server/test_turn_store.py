"""Turn continuity without a server: the store (bounded LRU, keys that ignore argument formatting and
separate salts) and ``encode_turn`` on the SmolLM2 tokenizer, with its own template and with a thinking
template, under ``--reasoning-history keep`` and ``strip``."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixrt.runtime.io_struct import FinishStop
from radixrt.runtime.server.openai.chat_format import ChatFormat, prepare_turn
from radixrt.runtime.server.openai.continuity import encode_turn, remember
from radixrt.runtime.tokenizer.turn_store import TurnStore, splice_encode, turn_key

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1,"b":[2]}'}}


def test_store_is_a_bounded_lru():
    s = TurnStore(2)
    for k in (b"a", b"b"):
        s.put(k, [1])
    s.get(b"a")  # a is now the most recent: b goes first
    s.put(b"c", [2])
    assert (s.get(b"a").ids, s.get(b"b"), s.get(b"c").ids, len(s)) == ((1,), None, (2,), 2)
    off = TurnStore(0)
    off.put(b"a", [1])
    assert len(off) == 0
    with pytest.raises(ValueError, match="turn_store_size"):
        TurnStore(-1)


def test_key_ignores_argument_formatting_not_salt_or_prefix():
    re = {**CALL, "function": {"name": "f", "arguments": '{"b": [2], "a": 1}'}}
    k = turn_key(None, "P", None, [CALL])
    assert (
        k
        == turn_key(None, "P", "", [re])
        == turn_key(None, "P", "  ", [{"name": "f", "arguments": {"a": 1, "b": [2]}}])
    )
    assert k != turn_key("tenant", "P", None, [CALL]) and k != turn_key(None, "Q", None, [CALL])


def test_splice_encode(tokenizer):
    text = "Hello world. Bye"
    ids = splice_encode(tokenizer, text, [(6, 12, (7, 8))])
    assert ids == tokenizer.encode("Hello ", add_special_tokens=False) + [7, 8] + tokenizer.encode(
        " Bye", add_special_tokens=False
    )
    with pytest.raises(ValueError, match="sorted"):
        splice_encode(tokenizer, text, [(6, 12, (1,)), (3, 4, (2,))])


def _turn(tok, msgs):
    cf = ChatFormat.for_model(tok, "llama", None, "qwen3" if "<think>" in (tok.chat_template or "") else None)
    return prepare_turn(cf, tok, msgs, None, {}, None)


def _generate(tok, store, msgs, out_text, out_ids, reasoning=""):
    """Pretend the model answered ``msgs`` with ``out_ids`` (ending on <|im_end|>); remember it."""
    turn = _turn(tok, msgs)
    out = SimpleNamespace(finished_reason=FinishStop(out_ids[-1]), output_ids=out_ids)
    remember(store, turn, None, out, {"role": "assistant", "content": out_text, "reasoning_content": reasoning})


def test_smollm_turn_spliced(tokenizer):
    store = TurnStore(8)
    first = [{"role": "user", "content": "Hi"}]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    gen = tokenizer.encode("Hel", add_special_tokens=False) + tokenizer.encode("lo!", add_special_tokens=False) + [end]
    _generate(tokenizer, store, first, "Hello!", gen)
    nxt = first + [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again"}]
    turn = _turn(tokenizer, nxt)
    ids, n = encode_turn(tokenizer, store, turn, None, False)
    prev = tokenizer.encode(_turn(tokenizer, first).prompt, add_special_tokens=False)
    assert n == 1 and ids[: len(prev) + len(gen)] == prev + gen  # the earlier prompt, then the ids as generated
    assert tokenizer.decode(ids) == tokenizer.decode(tokenizer.encode(turn.prompt, add_special_tokens=False))
    other = encode_turn(tokenizer, store, turn, "another-tenant", False)
    assert other == (tokenizer.encode(turn.prompt, add_special_tokens=False), 0)


def test_thinking_template_keep_and_strip(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = (TEMPLATES / "qwen3_thinking.jinja").read_text()
    store = TurnStore(8)
    first = [{"role": "user", "content": "Hi"}]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    gen = tok.encode("hmm</think>\n\nHello!", add_special_tokens=False) + [end]
    _generate(tok, store, first, "Hello!", gen, reasoning="hmm")
    nxt = first + [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again"}]
    turn = _turn(tok, nxt)
    plain = tok.encode(turn.prompt, add_special_tokens=False)
    assert "hmm" not in turn.prompt  # the template drops the reasoning and the opened <think>
    assert encode_turn(tok, store, turn, None, False) == (plain, 0)  # strip: the template's text
    ids, n = encode_turn(tok, store, turn, None, True)  # keep: the earlier prompt, then what was generated
    prev = tok.encode(_turn(tok, first).prompt, add_special_tokens=False)
    assert n == 1 and ids[: len(prev) + len(gen)] == prev + gen
