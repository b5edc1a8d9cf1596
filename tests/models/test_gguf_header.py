"""The GGUF header parser (issue 26's load time): the same tensors as ``gguf.GGUFReader`` without parsing
the vocabulary, and a metadata cache keyed on the file's header bytes, not its name and mtime alone."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from radixrt.runtime.models import loader
from radixrt.runtime.models.gguf_header import read_header
from radixrt.runtime.models.gguf_weights import GGUF_TYPES, GGUFWeights
from radixrt.runtime.models.loader import ModelSource, default_gguf_path


def test_tensors_equal_ggufreaders():
    from gguf import GGUFReader

    path = default_gguf_path()
    ours = GGUFWeights(path, 9, 3, GGUF_TYPES)
    ref = GGUFReader(path)
    assert len(ours.tensors) == len(ref.tensors) == 272
    for t in ref.tensors:
        mine = ours.tensors[t.name].data
        assert mine.shape == t.data.shape and mine.dtype == t.data.dtype, t.name
        assert np.array_equal(np.asarray(mine), np.asarray(t.data)), t.name
    h = read_header(path)
    assert h.metadata["general.architecture"] == "llama" and h.metadata["tokenizer.ggml.tokens"] == ("array", 49152)
    assert h.data_offset % 32 == 0 and h.header_bytes <= h.data_offset


def test_meta_cache_key_follows_the_header(tmp_path):
    path = tmp_path / "m.gguf"
    shutil.copyfile(default_gguf_path(), path)
    src = ModelSource(str(tmp_path), "m.gguf", "m")
    before = loader._cache_dir(src)
    st = os.stat(path)
    raw = bytearray(path.read_bytes()[:4096])
    at = raw.index(b"general.architecture") + len("general.architecture") + 4 + 8  # the value "llama"
    with open(path, "r+b") as f:  # same size, same mtime: only the header's bytes differ
        f.seek(at)
        f.write(b"L")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = loader._cache_dir(src)
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and after != before


def test_truncated_header_is_named(tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(default_gguf_path(), "rb").read(100_000))  # inside the vocabulary arrays
    with pytest.raises(ValueError, match=r"cut\.gguf: not a readable GGUF file \(truncated or corrupt"):
        read_header(str(cut))


def test_meta_cache_is_used_only_when_its_manifest_checks(tmp_path, monkeypatch):
    """The converted tokenizer/config are written with a manifest of their hashes; a file altered by hand
    (or a directory without a manifest) is never read: the metadata is converted again, in a child process
    (``in_child``, as the server's torch-free main process does) or in this one. Each conversion takes ~8 s,
    so there are three: the first in a child, the altered file and the missing manifest in this process (the
    manifest is checked, and a failing directory removed, before either way converts)."""
    from radixrt.runtime.models.meta_cache import MANIFEST, ensure_converted, verified

    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "m.gguf"
    shutil.copyfile(default_gguf_path(), path)
    d = ensure_converted(str(path), in_child=True)
    files = sorted(os.listdir(d))
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", MANIFEST} <= set(files) and verified(d)
    tok = os.path.join(d, "tokenizer.json")
    original = open(tok, "rb").read()
    with open(tok, "ab") as f:
        f.write(b" ")
    assert not verified(d)
    assert ensure_converted(str(path), in_child=False) == d and open(tok, "rb").read() == original
    assert ensure_converted(str(path), in_child=True) == d  # verified now: used as it is, no conversion
    os.remove(os.path.join(d, MANIFEST))  # a directory this code did not finish is not used either
    assert not verified(d) and ensure_converted(str(path), in_child=False) == d and verified(d)
    assert sorted(os.listdir(d)) == files
