"""The soak-and-fault suite's short version (benchmarks/soak.py, issue 31): 2 rounds of 16 concurrent
streams, then one round per fault, each kind once: kill -9 of the scheduler, of the detokenizer and of a
``--tp`` rank, 10 MB bodies, slow-loris headers, 1,000 aborts of unknown ids. One ``--tp 2`` server on a
random-weight Llama (the tp rank needs it; it loads in seconds, so each restart is quick).

Checked: no client that stayed connected lost its request, in any round; the pool adds up and holds
nothing once idle after every round; each fault is followed by a successful request; the server drains
and exits 0 on SIGTERM at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import soak  # noqa: E402
from soak_faults import FAULTS  # noqa: E402

CONCURRENCY = 16
# slowloris sockets drip for 3 s (the benchmark's default is 10): opened 1.5 s into the round, they stay open
# through its streams (about 2 s of load here) and the recovery request
SLOWLORIS_S = 3.0


def test_soak_short(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("soak-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(cfg).save_pretrained(d)
    tokenizer.save_pretrained(d)
    report = soak.run(
        2,
        CONCURRENCY,
        list(FAULTS),
        ["--tp", "2", "--model", str(d), "--max-total-tokens", "8192", "--context-length", "1024"],
        fault_duration_s=SLOWLORIS_S,
    )
    assert report["problems"] == [], report["problems"]
    rows = report["rounds"]
    assert [r["fault"] and r["fault"]["fault"] for r in rows] == [None, None, *FAULTS]
    for r in rows:
        assert r["lost"] == 0, r
        assert r["completed"] + r["hung_up"] + r["aborted"] + r["refused"] == CONCURRENCY, r
        assert r["pages"]["protected_pages"] == r["pages"]["private_pages"] == 0, r
        assert sum(v for k, v in r["pages"].items() if k != "total_pages") == r["pages"]["total_pages"], r
        assert set(r["rss_mb"]) == {"main", "scheduler", "detokenizer", "tp_rank1"}, r
    for r in rows[:2]:
        assert r["refused"] == 0 and r["completed"] >= CONCURRENCY // 2, r
    faults = {r["fault"]["fault"]: r["fault"] for r in rows[2:]}
    assert faults["tp_rank"]["restarts"] == {"scheduler": 1, "detokenizer": 1, "tp_rank": 1}
    assert faults["big_body"]["statuses"] == [413, 413]
    assert faults["aborts"]["ok"] is True and faults["slowloris"]["sockets"] == 32
    assert all(f["recovery_s"] < 120 for f in faults.values()), faults
    assert report["exit_status_after_sigterm"] == 0
