"""``resolve_model`` names what is wrong with a model argument (ValueError, one line for ``radixrt serve``)."""

from __future__ import annotations

import pytest

from radixrt.runtime.models.loader import resolve_model

TAIL = ". Supported: the aliases"


def test_each_bad_model_argument_says_what_it_is(tmp_path):
    (tmp_path / "dir.gguf").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"x")
    cases = {
        str(tmp_path / "dir.gguf"): "is a directory without config.json",
        str(tmp_path / "weights.bin"): "is a file whose name does not end in .gguf",
        str(tmp_path / "missing.gguf"): "not found",
    }
    for arg, what in cases.items():
        with pytest.raises(ValueError) as e:
            resolve_model(arg)
        assert str(e.value).startswith(f"model {arg!r} {what}{TAIL}"), str(e.value)
