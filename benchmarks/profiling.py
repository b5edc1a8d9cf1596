"""``--profile``: sample radixrt's scheduler process with py-spy while a workload runs, to show where the
time goes (the issue asks for a profile of the hot path wherever a target is missed).

py-spy (``pip install py-spy``) attaches to the running process; nothing in radixrt changes. The raw
collapsed stacks go to ``profile-<system>-<workload>.txt`` (load them in speedscope, or run ``flamegraph.pl``)
and the run reports the top frames by self time and by inclusive time.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Optional


def pyspy_path() -> Optional[str]:
    p = Path(sys.executable).parent / "py-spy"
    return str(p) if p.exists() else shutil.which("py-spy")


class PySpy:
    """``py-spy record --format raw`` on ``pid`` until :meth:`stop`."""

    def __init__(self, pid: int, out: str, rate: int = 100):
        exe = pyspy_path()
        if exe is None:
            raise RuntimeError("--profile needs py-spy: pip install py-spy")
        self.out = out
        self.log = out + ".log"
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--output",
                out,
                "--nonblocking",
            ],
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
        )

    def stop(self, timeout: float = 60) -> Optional[str]:
        """Stop sampling; returns the output file, or None when py-spy wrote nothing (see the .log)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.path.exists(self.out) and os.path.getsize(self.out) > 0:
            os.remove(self.log)
            return self.out
        return None


_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def _name(frame: str) -> str:
    """``forward (radixrt/runtime/models/llama.py:88)`` -> ``forward (models/llama.py)``."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    parts = m.group("file").replace("\\", "/").split("/")
    return f"{m.group('fn')} ({'/'.join(parts[-2:])})"


def top_frames(raw_path: str, n: int = 12) -> dict:
    """Shares of samples by self time (the innermost frame) and by inclusive time (anywhere on the stack)."""
    self_c: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for line in Path(raw_path).read_text().splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        frames = [f for f in m.group(1).split(";") if f]
        if frames and frames[0].startswith(("process ", "thread ")):
            frames = frames[1:]
        if not frames:
            continue
        c = int(m.group(2))
        total += c
        names = [_name(f) for f in frames]
        self_c[names[-1]] += c
        for nm in set(names):
            incl[nm] += c
    if not total:
        return {"samples": 0, "self": [], "inclusive": []}
    return {
        "samples": total,
        "self": [[k, v / total] for k, v in self_c.most_common(n)],
        "inclusive": [[k, v / total] for k, v in incl.most_common(n + 8)][: n + 8],
    }
