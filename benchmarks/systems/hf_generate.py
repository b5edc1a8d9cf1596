"""``hf-generate``: transformers ``generate`` in this process, static batches of ``batch_size`` programs run in
lockstep (left padding, greedy).

JSON calls are constrained with xgrammar's HF logits processor. ``select`` scores options from prompt logprobs
(one forward over the contexts when every option is a single appended token, else over every ``context +
option``). Timing: a batch's requests are sent when its ``generate`` starts; a token arrives at its decoding
step (a logits processor stamps each step); every request ends when ``generate`` returns, which is when a
caller gets it."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Optional

from .base import (
    Gen,
    Record,
    Select,
    System,
    Workload,
    call_key,
    decide,
    eos_ids_of,
    now,
    prompt_ids,
    select_boundaries,
)


class HFGenerate(System):
    name = "hf-generate"
    has_cache_report = True  # it caches nothing between calls: 0 cached tokens, truthfully

    def __init__(self, tokenizer: Any, batch_size: int = 16, threads: Optional[int] = None):
        self.tok, self.batch_size, self.threads = tokenizer, batch_size, threads
        self.model = None
        self.eos_ids = eos_ids_of(tokenizer)
        self._compiler = None
        self._compiled: dict[str, Any] = {}

    def describe(self) -> dict:
        import torch
        import transformers

        return {
            "api": "LlamaForCausalLM.generate, greedy, static batches (left padding)",
            "batch_size": self.batch_size,
            "dtype": "float32",
            "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__,
        }

    def start(self, context_length: int, model: Any = None) -> None:
        """``model``: the ``load_hf_model()`` model when the caller has it loaded already (the tests share one;
        loading it from the GGUF takes ~20 s on 2 cores); it is only read."""
        from transformers.utils import logging as hf_logging

        from radixrt.runtime.models.loader import load_hf_model
        import torch

        hf_logging.set_verbosity_error()
        if self.threads:
            torch.set_num_threads(self.threads)
        self.model = model if model is not None else load_hf_model()
        gc = self.model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else self.tok.eos_token_id
        self.eos_ids |= set(eos if isinstance(eos, list) else [eos])
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else min(self.eos_ids)

    def stop(self) -> None:
        self.model = None

    def warmup(self) -> None:
        self._gen([Gen("Hello, how are you today?", 8)])

    def compiled(self, schema: dict) -> Any:
        key = json.dumps(schema, sort_keys=True)
        if key not in self._compiled:
            import xgrammar as xgr

            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self.tok, vocab_size=self.model.config.vocab_size)
                self._compiler = xgr.GrammarCompiler(info)
            # compact JSON (no whitespace outside strings), as radixrt's grammar backend compiles it
            self._compiled[key] = self._compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":")
            )
        return self._compiled[key]

    def run(self, wl: Workload, programs: list, pbar: Any, concurrency: int = 0) -> list[Record]:
        out: list[Record] = []
        for b0 in range(0, len(programs), self.batch_size):
            active: dict[int, list] = {}
            for pid in range(b0, min(b0 + self.batch_size, len(programs))):
                try:
                    active[pid] = [programs[pid], next(programs[pid]), 0]
                except StopIteration:
                    pass
            while active:  # lockstep: every live program of the batch makes its next call together
                groups: dict[tuple, list[int]] = defaultdict(list)
                for pid, (_, call, _) in active.items():
                    groups[call_key(call)].append(pid)
                for key, pids in groups.items():
                    calls = [active[p][1] for p in pids]
                    try:
                        recs = self._select(calls) if key[0] == "select" else self._gen(calls)
                        err = None
                    except Exception as e:
                        t = now()
                        recs = [Record("", "", 0, 0, c.kind, t, t) for c in calls]
                        err = f"{type(e).__name__}: {e}"
                    for pid, rec, call in zip(pids, recs, calls):
                        rec.workload, rec.system, rec.program, rec.step = wl.name, self.name, pid, active[pid][2]
                        rec.call = call  # type: ignore[attr-defined]
                        rec.error = err
                        out.append(rec)
                        pbar.update(1)
                        prog = active[pid][0]
                        if err is not None:
                            prog.close()
                            del active[pid]
                            continue
                        try:
                            active[pid][1] = prog.send(rec)
                            active[pid][2] += 1
                        except StopIteration:
                            del active[pid]
        return out

    def _gen(self, calls: list[Gen]) -> list[Record]:
        """One static batch: left-padded, greedy, run to the longest ``max_new_tokens`` of the batch; each row is
        cut at its own limit or its first EOS."""
        import torch
        from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

        class StepTimer(LogitsProcessor):
            def __init__(self):
                self.times: list[float] = []

            def __call__(self, input_ids, scores):
                self.times.append(now())
                return scores

        c0 = calls[0]
        t0 = now()
        rows = [prompt_ids(self.tok, c, self.eos_ids) for c in calls]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        procs = LogitsProcessorList()
        if c0.json_schema is not None:
            import xgrammar as xgr
            import xgrammar.contrib.hf  # noqa: F401

            procs.append(xgr.contrib.hf.LogitsProcessor(self.compiled(c0.json_schema)))
        timer = StepTimer()
        procs.append(timer)
        n = max(c.max_new_tokens for c in calls)
        gc = GenerationConfig(
            max_new_tokens=n,
            min_new_tokens=n if c0.ignore_eos else 0,
            do_sample=False,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
        )
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, logits_processor=procs)
        t1 = now()
        recs = []
        for i, c in enumerate(calls):
            new = out[i, width:].tolist()[: c.max_new_tokens]
            k = None if c0.ignore_eos else next((j for j, t in enumerate(new) if t in self.eos_ids), None)
            n_i = len(new) if k is None else k + 1
            r = Record("", "", 0, 0, "gen", t_send=t0, t_end=t1)
            r.sent_ids, r.output_ids = rows[i], new[:n_i]
            r.chunk_times = timer.times[:n_i]
            r.t_first = r.chunk_times[0] if r.chunk_times else None
            r.output_tokens = n_i
            r.output_text = self.tok.decode(new[:n_i], skip_special_tokens=True)
            r.finish_reason = "stop" if k is not None else "length"
            r.reported_prompt_tokens = len(rows[i])
            r.cached_tokens = 0
            recs.append(r)
        return recs

    def _select(self, calls: list[Select], fast: bool = True) -> list[Record]:
        import torch

        t0 = now()
        bounds = [select_boundaries(self.tok, c.context, c.choices) for c in calls]
        ctxs = [self.tok.encode(c.context, add_special_tokens=False) for c in calls]
        single = fast and all(
            len(f) == len(ctx) + 1 and f[: len(ctx)] == ctx for ctx, (fulls, _, _) in zip(ctxs, bounds) for f in fulls
        )
        # rows to run, and per (call, option): (row, [(position from the end, token id), ...])
        rows: list[list[int]] = []
        where: list[list[tuple[int, list[tuple[int, int]]]]] = []
        if single:  # every option is one token after the context: one forward over the contexts
            for ctx, (fulls, _, _) in zip(ctxs, bounds):
                rows.append(ctx)
                where.append([(len(rows) - 1, [(1, f[-1])]) for f in fulls])
        else:
            for fulls, starts, _ in bounds:
                w = []
                for f, s in zip(fulls, starts):
                    rows.append(f)
                    m = len(f) - s
                    w.append((len(rows) - 1, [(m + 1 - j, f[s + j]) for j in range(m)]))
                where.append(w)
        keep = max(p for w in where for _, ps in w for p, _ in ps)
        lps_rows: list[Any] = []
        with torch.inference_mode():
            for b in range(0, len(rows), self.batch_size):
                chunk = rows[b : b + self.batch_size]
                width = max(len(r) for r in chunk)
                ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in chunk])
                mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in chunk])
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits
                lps_rows.extend(torch.log_softmax(logits.float(), -1))
        t1 = now()
        recs = []
        for c, w, (fulls, _, _) in zip(calls, where, bounds):
            # logits at index keep - p predict the token p - 1 places before the end
            input_lps = [[[float(lps_rows[row][keep - p, tid]), tid] for p, tid in ps] for row, ps in w]
            r = Record("", "", 0, 0, "select", t_send=t0, t_end=t1)
            r.decision = decide(c.choices, input_lps)
            r.output_text, r.label, r.finish_reason = r.decision, c.label, "select"
            r.scores = [sum(t[0] for t in lps) / len(lps) for lps in input_lps]  # type: ignore[attr-defined]
            r.reported_prompt_tokens = sum(len(f) for f in fulls)
            r.cached_tokens = 0
            recs.append(r)
        return recs
