"""``radixrt profile LOG``: would a radix cache help this traffic, and how much memory does it need?

    radixrt profile requests.jsonl                       # a --request-log file (token ids or page hashes)
    radixrt profile chats.jsonl --from-openai-jsonl      # plain OpenAI chat requests, tokenized here
    radixrt profile LOG --cache-sizes 4096,16384 --page-sizes 1,16,64 --prefill-tokens-per-s 12000
    radixrt profile LOG --cache-sizes 2048 --tier2-tokens 6144 --tier3-tokens 0   # with cache tiers

Replays the log through the radix tree and page allocator (no model) for every page size x cache size x
eviction policy and prints the hit rate next to the optimal one, the prefill tokens and time saved
(``radixrt/runtime/profile/report.py``); writes a PNG of hit rate against cache size.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from radixrt.runtime.mem.eviction import POLICIES
from radixrt.runtime.profile.report import parse_ints, format_table, measure_prefill_tps, plot, profile


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``profile`` on ``radixrt``'s subcommand parser."""
    p = sub.add_parser(
        "profile",
        help="replay a request log through the radix tree: hit rate per cache size",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", help="a --request-log file, or with --from-openai-jsonl a file of chat requests")
    p.add_argument(
        "--from-openai-jsonl",
        action="store_true",
        help="LOG holds OpenAI chat requests (messages, tools), tokenized with --model's chat template",
    )
    p.add_argument("--model", default=None, help="tokenizer (and --measure-prefill model); default SmolLM2")
    p.add_argument("--page-sizes", default=None, help="comma list (default 16, or the log's hash page size)")
    p.add_argument("--cache-sizes", default=None, help="comma list of cache sizes in tokens (default: auto)")
    p.add_argument(
        "--tier2-tokens",
        type=int,
        default=0,
        help="a host tier of this many tokens under each cache size (--hicache-size); hit rate by tier",
    )
    p.add_argument(
        "--tier3-tokens",
        type=int,
        default=None,
        help="and files under it, this many tokens (0: unbounded; --hicache-storage-size)",
    )
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma list of {tuple(POLICIES)}")
    p.add_argument("--prefill-tokens-per-s", type=float, default=None, help="prefill speed for time saved")
    p.add_argument("--measure-prefill", action="store_true", help="measure the prefill speed of --model here")
    p.add_argument("--sequential", action="store_true", help="ignore the log's times: one request at a time")
    p.add_argument("--plot", default="", help="write a PNG of hit rate by cache size here")
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    return p


MAX_TIER_TOKENS = 1 << 28


def run(ns: argparse.Namespace) -> int:
    """Run ``radixrt profile`` from parsed arguments. Returns the exit status (2 on bad input)."""
    from radixrt.runtime.profile.logs import read_request_log
    from radixrt.runtime.server.cli.chat_log import read_openai_jsonl

    try:
        if ns.from_openai_jsonl:
            from radixrt.runtime.models.loader import load_tokenizer

            reqs = read_openai_jsonl(ns.log, load_tokenizer(ns.model))
        else:
            reqs = read_request_log(ns.log, timed=not ns.sequential)
        units = {r.unit for r in reqs}
        default_ps = str(max(units)) if units and max(units) > 1 else "16"
        page_sizes = parse_ints(ns.page_sizes or default_ps, "page_sizes")
        sizes = parse_ints(ns.cache_sizes, "cache_sizes") if ns.cache_sizes else None
        policies = [p.strip() for p in ns.policies.split(",") if p.strip()]
        for p in policies:
            if p not in POLICIES:
                raise ValueError(f"policies: unknown eviction policy {p!r}; known: {tuple(POLICIES)}")
        tps = ns.prefill_tokens_per_s
        if ns.measure_prefill:
            tps = measure_prefill_tps(ns.model)
            print(f"measured prefill: {tps:.0f} tokens/s", file=sys.stderr)
        if ns.tier2_tokens < 0 or (ns.tier3_tokens is not None and ns.tier3_tokens < 0):
            raise ValueError("tier2_tokens and tier3_tokens must be >= 0")
        for name, n in (("tier2_tokens", ns.tier2_tokens), ("tier3_tokens", ns.tier3_tokens or 0)):
            if n > MAX_TIER_TOKENS:  # the replay's stand-in tiers still keep a slot per page
                raise ValueError(f"{name}: at most {MAX_TIER_TOKENS} tokens, got {n}")
            if 0 < n < max(page_sizes):
                raise ValueError(f"{name}: {n} tokens hold no page of {max(page_sizes)} tokens")
        rows = profile(
            reqs,
            page_sizes,
            sizes,
            policies,
            tps,
            progress=True,
            tier2_tokens=ns.tier2_tokens,
            tier3_tokens=ns.tier3_tokens,
        )
    except (OSError, ValueError) as e:
        print(f"radixrt profile: error: {e}", file=sys.stderr)
        return 2
    q = rows[0].query_tokens
    print(f"{ns.log}: {len(reqs)} requests, {q} prompt tokens" + (f", prefill at {tps:.0f} tokens/s" if tps else ""))
    print(format_table(rows))
    if ns.plot:
        plot(rows, ns.plot, title=ns.log.rsplit("/", 1)[-1])
        print(f"plot: {ns.plot}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0
