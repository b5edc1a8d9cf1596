"""The model shape x format table of docs/models.md, from ``results/real_models.json`` and ``results/real_serve.jsonl``.

Per file: size, radixrt's peak RSS in process (``Engine``) and as ``radixrt serve`` (every process, sum of
``VmHWM``), each against issue 26's bound (file x 1.15 + KV pool + 500 MB; serve: + 600 MB more; MB = 10^6
bytes, figures printed in MiB), batch-1 decode and 512-token prefill tok/s beside ``llama-bench`` (tg64,
pp512) and the ratio, and the cold load to first token beside ``llama-server``'s. Decode/prefill figures
come from one ``real_models.py measure`` run per file (radixrt, then llama-bench right after); the serve
figures from the last ``real_serve.py`` run per file.

    python benchmarks/real_table.py          # prints markdown
"""

from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2**20


def rows() -> list[str]:
    models = json.load(open(os.path.join(HERE, "results", "real_models.json")))["files"]
    serve: dict = {}
    path = os.path.join(HERE, "results", "real_serve.jsonl")
    for line in open(path) if os.path.exists(path) else ():
        r = json.loads(line)
        if "error" not in r:
            serve.setdefault(r["file"], {})[r["system"]] = r
    out = [
        "| file | size MiB | Engine peak RSS MiB (bound) | serve peak RSS MiB (bound) "
        "| decode tok/s: radixrt / llama.cpp = ratio | prefill 512 tok/s: radixrt / llama.cpp = ratio "
        "| cold load to 1st token s: radixrt / llama-server | load avg | commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = ["llama-3.2-1b", "qwen2.5-1.5b", "llama-3.2-3b", "llama-3.1-8b"]
    types = ["F16", "Q8_0", "Q4_K_M", "Q4_0"]
    key = lambda f: (
        next((i for i, s in enumerate(order) if f.startswith(s)), 9),  # noqa: E731
        next((i for i, t in enumerate(types) if f.endswith(t + ".gguf")), 9),
    )
    for f in sorted(set(models) | set(serve), key=key):
        m, s = models.get(f, {}), serve.get(f, {})
        r, lb = m.get("radixrt"), m.get("llama_bench")
        size = m.get("file_bytes") or next(iter(s.values()))["file_bytes"]
        cells = [f.removesuffix(".gguf"), f"{size / MIB:.0f}"]
        if r:
            bound = size * 1.15 + r["kv_pool_bytes"] + 500e6
            ok = "ok" if r["peak_rss_bytes"] <= bound else "**over**"
            cells.append(f"{r['peak_rss_bytes'] / MIB:.0f} ({bound / MIB:.0f}, {ok})")
        else:
            cells.append("-")
        rs = s.get("radixrt")
        if rs and rs.get("server_info_memory"):
            kv = rs["server_info_memory"]["kv_pool_bytes"]
            bound = size * 1.15 + kv + 1100e6
            ok = "ok" if rs["peak_rss_total_bytes"] <= bound else "**over**"
            cells.append(f"{rs['peak_rss_total_bytes'] / MIB:.0f} ({bound / MIB:.0f}, {ok}; KV {kv / MIB:.0f})")
        else:
            cells.append("-")
        if r and lb:
            tg = next(v for k, v in lb.items() if k.startswith("tg") and k.endswith("_tok_s"))  # tg64 or tg32
            cells.append(f"{r['decode_tok_s']:.2f} / {tg:.2f} = {m['decode_ratio']:.2f}x")
            cells.append(f"{r['prefill_tok_s']:.1f} / {lb['pp512_tok_s']:.1f} = {m['prefill_ratio']:.2f}x")
        else:
            cells += ["-", "-"]
        ls = s.get("llama.cpp")
        if rs and ls:
            cells.append(
                f"{rs['load_to_first_token_s']:.1f} / {ls['load_to_first_token_s']:.1f} = "
                f"{rs['load_to_first_token_s'] / ls['load_to_first_token_s']:.1f}x"
                + ("" if rs["cold"] and ls["cold"] else " (warm)")
            )
        else:
            cells.append("-")
        loads = [m["load_before"][0]] if m else []
        loads += [x["load_before"][0] for x in s.values()]
        cells.append("/".join(f"{x:.1f}" for x in loads))
        commits = sorted({c for c in [m.get("commit")] + [x.get("commit") for x in s.values()] if c})
        cells.append(", ".join(commits))
        out.append("| " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
