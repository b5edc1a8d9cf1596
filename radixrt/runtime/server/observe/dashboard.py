"""``GET /dashboard`` (a live page) and ``GET /cache_tree?top=N`` (the JSON it reads), on the server's port.

``/cache_tree`` returns the scheduler's state (``num_running``, ``num_waiting``, ``cache``: the same dict as
``/get_server_info``), recent TTFT / ITL percentiles in seconds (``latency``, main process), and the radix
tree's ``top`` longest and most-hit prefixes (``tree``, see ``mem/tree_summary.py``) with the first words of
each decoded (``text``). The page is plain HTML with a small inline script (``dashboard.html``); nothing is
fetched from outside the server. ``--api-key`` applies to both routes, as to every route but ``/health``.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse

from radixrt.runtime.server.context import ctx
from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.server.http.responses import JSONResp

router = APIRouter()
MAX_TOP = 500
_HTML = Path(__file__).with_name("dashboard.html")


def parse_top(raw: str | None, default: int = 50) -> int:
    """``top`` query parameter: an integer in [1, MAX_TOP]. Raises ApiError (400, param ``top``)."""
    if raw is None:
        return default
    try:
        top = int(raw)
    except ValueError:
        raise ApiError(f"top must be an integer, got {raw!r}", param="top") from None
    if not 1 <= top <= MAX_TOP:
        raise ApiError(f"top must be between 1 and {MAX_TOP}, got {top}", param="top")
    return top


def _head_text(tokenizer, ids: list[int], max_chars: int = 80) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=False).replace("\n", " ")
    return text if len(text) <= max_chars else text[: max_chars - 1] + "\u2026"


@router.get("/cache_tree")
async def cache_tree(request: Request):
    c = ctx(request)
    top = parse_top(request.query_params.get("top"))
    info = await c.tm.get_info(top)
    tree = info.tree or {"num_nodes": 0, "largest": [], "most_hit": []}
    for key in ("largest", "most_hit"):
        for row in tree[key]:
            row["text"] = _head_text(c.tm.tokenizer, row.pop("head_ids"))
    return JSONResp(
        {
            "time": time.time(),
            "model_name": c.tm.model_name,
            "num_running": info.num_running,
            "num_waiting": info.num_waiting,
            "cache": info.cache,
            "latency": c.tm.latency.summary(),
            "eviction_policy": c.args.eviction_policy,
            "tree": tree,
        }
    )


@router.get("/dashboard")
async def dashboard(request: Request):
    return HTMLResponse(_HTML.read_text(encoding="utf-8"))
