"""Assemble benchmarks/data/jsonschemabench_sample.jsonl from a JSONSchemaBench snapshot (issue 29).

Source: GitHub guidance-ai/jsonschemabench (Geng et al. 2025, arXiv:2501.10868), ``data/<subset>/<name>.json``;
the license situation is the one tests/data/jsonschema/README.md describes (MIT on the dataset card).
Per subset (Github_easy/medium/hard, Kubernetes, Snowplow, Glaiveai2K) 50 schemas are drawn at random
(seed 29) among the files under 10,000 bytes that parse as strict JSON objects, excluding the dev corpus
(tests/data/jsonschema/dev). Each line: ``{"subset", "name", "schema"}`` (the schema re-serialized compact).

    git clone https://github.com/guidance-ai/jsonschemabench /tmp/jsb    # or any snapshot of it
    python benchmarks/make_schema_set.py /tmp/jsb [--per-subset 50]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
from pathlib import Path

SUBSETS = ("Github_easy", "Github_medium", "Github_hard", "Kubernetes", "Snowplow", "Glaiveai2K")
OUT = Path(__file__).parent / "data" / "jsonschemabench_sample.jsonl"
DEV = Path(__file__).resolve().parents[2] / "shared" / "cases" / "jsonschema" / "dev"


def _strict(text: str):
    def bad(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=bad)


def _files(repo: str, subset: str) -> dict[str, bytes]:
    """``name -> bytes`` of ``data/<subset>/*.json``, read from a work tree or a bare git directory."""
    root = Path(repo) / "data" / subset
    if root.is_dir():
        return {p.name: p.read_bytes() for p in sorted(root.glob("*.json"))}
    names = subprocess.run(
        ["git", "--git-dir", repo, "ls-tree", "--name-only", "HEAD", f"data/{subset}/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        Path(n).name: subprocess.run(
            ["git", "--git-dir", repo, "show", f"HEAD:{n}"], capture_output=True, check=True
        ).stdout
        for n in names
        if n.endswith(".json")
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", help="a JSONSchemaBench work tree or bare git directory")
    ap.add_argument("--per-subset", type=int, default=50)
    a = ap.parse_args()
    dev = {p.name for p in DEV.glob("*.json")} if DEV.is_dir() else set()
    rnd = random.Random(29)
    lines = []
    for subset in SUBSETS:
        ok = []
        for name, raw in _files(a.repo, subset).items():
            if len(raw) >= 10_000 or f"{subset}__{name}" in dev:
                continue
            try:
                schema = _strict(raw.decode("utf-8"))
            except ValueError:
                continue
            if isinstance(schema, dict):
                ok.append((name, schema))
        for name, schema in rnd.sample(ok, min(a.per_subset, len(ok))):
            lines.append(
                json.dumps(
                    {"subset": subset, "name": name[:-5], "schema": schema}, ensure_ascii=False, separators=(",", ":")
                )
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} schemas -> {OUT}")


if __name__ == "__main__":
    main()
