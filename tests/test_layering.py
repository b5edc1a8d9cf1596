"""The import contracts of pyproject.toml ``[tool.importlinter]`` hold, and they catch a violation.

``lint-imports`` (import-linter) builds the import graph statically (grimp) and checks: the runtime's
layers by role (server > profile > engine | router > scheduler > executor | tokenizer > models | sampling |
layers | parsers > mem | constrained | kernels), the server's layers by API (launch > http_server > cli >
openai | native > manager > observe > api_models | context | http), that ``radixrt.lang`` reaches
the runtime only through Engine, io_struct and load_tokenizer, and that no two sibling modules or
packages import each other in a circle.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = [
    "runtime: layers by role",
    "server: layers by API",
    "runtime: nothing below the server imports it",
    "runtime: mem, constrained and kernels import nothing else of radixrt",
    "lang: uses the runtime only through Engine, io_struct and load_tokenizer",
    "no import circles between sibling packages or modules",
]


def _lint(root: Path) -> tuple[int, dict[str, str]]:
    """Run ``lint-imports`` on the tree at ``root``; returns its exit code and each contract's verdict."""
    exe = Path(sys.executable).parent / "lint-imports"
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run(
        [*cmd, "--no-cache", "--no-logo"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    verdicts = {}
    for name in CONTRACTS:
        m = re.search(re.escape(name) + r" (KEPT|BROKEN)", r.stdout)
        verdicts[name] = m.group(1) if m else f"missing from output:\n{r.stdout}\n{r.stderr}"
    return r.returncode, verdicts


def test_import_contracts_hold():
    rc, verdicts = _lint(ROOT)
    assert verdicts == {name: "KEPT" for name in CONTRACTS}
    assert rc == 0


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_import_contracts_catch_violations(tmp_path):
    shutil.copytree(ROOT / "radixrt", tmp_path / "radixrt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    pkg = tmp_path / "radixrt"
    # One violation per contract.
    _append(pkg / "runtime/constrained/cache.py", "from radixrt.runtime import scheduler  # bottom -> middle")
    _append(pkg / "runtime/sampling/params.py", "import radixrt.runtime.server.observe.metrics  # middle -> server")
    _append(pkg / "lang/choices.py", "from radixrt.runtime.mem import radix_cache  # lang -> runtime internals")
    _append(pkg / "lang/tracer.py", "import radixrt.lang.program  # a circle tracer -> program -> tracer")
    _append(pkg / "kernels/attention/metadata.py", "import radixrt.runtime.server.launch  # bottom -> server")
    _append(
        pkg / "runtime/executor/forward_batch.py", "import radixrt.runtime.scheduler.scheduler  # executor -> scheduler"
    )
    _append(pkg / "runtime/server/http/body.py", "import radixrt.runtime.server.openai.chat  # http -> openai")
    rc, verdicts = _lint(tmp_path)
    assert verdicts == {name: "BROKEN" for name in CONTRACTS}
    assert rc == 1
