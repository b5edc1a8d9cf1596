"""One special-token rule (radixrt.runtime.constrained.vocab), pinned for the default SmolLM2 tokenizer.

Special = ``all_special_ids`` plus added tokens flagged special. The grammar backends (xgrammar,
outlines-core) never allow them; OpenAI logprobs report their text as written. An added token *not*
flagged special is ordinary byte-level text, as the tokenizer's own decoder reads it.
"""

from __future__ import annotations

import copy

import pytest

from radixrt.runtime.constrained.outlines_backend import build_vocabulary
from radixrt.runtime.constrained.vocab import byte_decoder, piece_bytes, special_token_ids
from radixrt.runtime.constrained.xgrammar_backend import build_tokenizer_info
from radixrt.runtime.tokenizer.token_texts import TokenTexts

SMOLLM2_SPECIAL = {
    0: "<|endoftext|>",
    1: "<|im_start|>",
    2: "<|im_end|>",
    3: "<repo_name>",
    4: "<reponame>",
    5: "<file_sep>",
    6: "<filename>",
    7: "<gh_stars>",
    8: "<issue_start>",
    9: "<issue_comment>",
    10: "<issue_closed>",
    11: "<jupyter_start>",
    12: "<jupyter_text>",
    13: "<jupyter_code>",
    14: "<jupyter_output>",
    15: "<jupyter_script>",
    16: "<empty_output>",
}
VOCAB = 49152
EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def extended(tokenizer):
    """The SmolLM2 tokenizer plus two added, non-special tokens: ids 49152 and 49153."""
    tok = copy.deepcopy(tokenizer)
    assert tok.add_tokens(["<tool_call>", "naïve"]) == 2
    assert tok.convert_tokens_to_ids(["<tool_call>", "naïve"]) == [49152, 49153]
    return tok


def test_byte_table_is_gpt2s():
    table = byte_decoder()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["Ċ"] == 0x0A and table["!"] == 0x21 and table["ï"] == 0xEF
    assert piece_bytes("Ġhello") == b" hello" and piece_bytes("a b") is None


def test_special_ids_of_smollm2(tokenizer):
    assert special_token_ids(tokenizer) == set(SMOLLM2_SPECIAL)
    assert {i: tokenizer.convert_ids_to_tokens(i) for i in SMOLLM2_SPECIAL} == SMOLLM2_SPECIAL
    assert tokenizer.eos_token_id == EOS


def test_grammar_backends_leave_out_exactly_the_special_ids(tokenizer):
    info = build_tokenizer_info(tokenizer, VOCAB, [EOS])
    assert set(info.special_token_ids) == set(SMOLLM2_SPECIAL) - {EOS}
    assert list(info.stop_token_ids) == [EOS]
    vocab = build_vocabulary(tokenizer, VOCAB, EOS, placeholder_id=3)
    for tid, text in SMOLLM2_SPECIAL.items():
        assert vocab.get(text.encode()) is None, text
    assert vocab.get(b" hello") == [tokenizer.convert_tokens_to_ids("Ġhello")] == [33662]


def test_logprob_bytes_of_special_and_ordinary_tokens(tokenizer):
    tt = TokenTexts(tokenizer)
    assert tt.special == set(SMOLLM2_SPECIAL)
    for tid, text in SMOLLM2_SPECIAL.items():
        assert tt.token_bytes(tid) == text.encode() and tt.text(tid) == text
    assert tt.token_bytes(33662) == b" hello"
    # a token that is half of a UTF-8 sequence: its exact byte, and U+FFFD as text
    half = tokenizer.convert_tokens_to_ids("Ã")
    assert tt.token_bytes(half) == b"\xc3" and tt.text(half) == "\ufffd"


def test_added_non_special_tokens_are_ordinary_text(extended):
    assert special_token_ids(extended) == set(SMOLLM2_SPECIAL)
    tt = TokenTexts(extended)
    # Byte-level, as the tokenizer's ByteLevel decoder reads them: "ï" stands for the byte 0xEF.
    assert tt.token_bytes(49152) == b"<tool_call>"
    assert tt.token_bytes(49153) == b"na\xefve"
    assert extended.decode([49153]) == b"na\xefve".decode("utf-8", errors="replace") == tt.text(49153)
    info = build_tokenizer_info(extended, VOCAB + 2, [EOS])
    assert set(info.special_token_ids) == set(SMOLLM2_SPECIAL) - {EOS}
    assert info.decoded_vocab[49152] == b"<tool_call>" and info.decoded_vocab[49153] == b"na\xefve"
    vocab = build_vocabulary(extended, VOCAB + 2, EOS, placeholder_id=3)
    assert vocab.get(b"<tool_call>") == [49152] and vocab.get(b"na\xefve") == [49153]
