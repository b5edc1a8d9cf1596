"""Prometheus metrics for ``GET /metrics`` (``--enable-metrics``), with ``prometheus-client``.

The names are the ones SGLang and vLLM users already chart (their Grafana dashboards work unchanged);
where both projects name the same quantity, both names are exported. Every family has the label
``model_name``. Units: seconds, tokens, ratios in [0, 1].

| quantity (counters unless named) | SGLang name | vLLM name |
|---|---|---|
| running requests (gauge) | ``sglang:num_running_reqs`` | ``vllm:num_requests_running`` |
| waiting requests (gauge) | ``sglang:num_queue_reqs`` | ``vllm:num_requests_waiting`` |
| KV pages held by requests or pinned, over all (gauge) | ``sglang:token_usage`` | ``vllm:kv_cache_usage_perc`` |
| prefix cache hit rate since start (gauge) | ``sglang:cache_hit_rate`` | |
| prompt tokens looked up | | ``vllm:prefix_cache_queries_total`` |
| prompt tokens served from the cache | ``sglang:cached_tokens_total`` | ``vllm:prefix_cache_hits_total`` |
| prompt tokens, finished requests | ``sglang:prompt_tokens_total`` | ``vllm:prompt_tokens_total`` |
| tokens generated, finished requests | ``sglang:generation_tokens_total`` | ``vllm:generation_tokens_total`` |
| finished requests (counter) | ``sglang:num_requests_total`` | ``vllm:request_success_total`` (by reason) |
| TTFT (histogram) | ``sglang:time_to_first_token_seconds`` | ``vllm:time_to_first_token_seconds`` |
| ITL (histogram) | ``sglang:inter_token_latency_seconds`` | ``vllm:inter_token_latency_seconds`` |
| E2E latency (histogram) | ``sglang:e2e_request_latency_seconds`` | ``vllm:e2e_request_latency_seconds`` |

Also ``radixrt:kv_cache_cached_ratio`` (evictable cached pages over all pages), which neither peer has, and
``radixrt:process_restarts_total{process}`` (children restarted after ``process`` died: scheduler,
detokenizer, tp_rank).
With cache tiers (``--enable-hierarchical-cache``, ``mem/hicache.py``), per ``tier`` (``host``, ``disk``):
``radixrt:hicache_hit_tokens_total`` (prompt tokens restored from the tier), ``radixrt:hicache_hit_rate``
(those over all prompt tokens looked up), ``radixrt:hicache_bytes`` (held), ``radixrt:hicache_load_seconds_total``
and ``radixrt:hicache_store_seconds_total`` (time copying pages in and out of the tier); and
``radixrt:hicache_restoring_jobs`` / ``radixrt:hicache_restoring_pages`` (restores in flight on the copy thread),
``radixrt:hicache_storing_jobs`` / ``radixrt:hicache_storing_pages`` (stores of evicted pages in flight).
Gauges and the cache counters are refreshed from the scheduler at each scrape; latencies are measured in
the main process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _SchedulerState:
    """Gauges and cache counters from the scheduler's last ``InfoOut`` (read at scrape time)."""

    def __init__(self, labels: dict):
        self.labels = labels
        self.running = self.waiting = 0
        self.usage = self.cached_ratio = 0.0
        self.query = self.hit = 0
        self.memory: dict = {}
        self.spec: dict = {}  # the scheduler's speculative-decoding counters (scheduler/spec_step.py)
        self.hicache: dict = {}

    def _tiers(self, names: list, vals: list):
        """The cache tiers' families (none without tiers)."""
        tiers = [(t, self.hicache[t]) for t in ("host", "disk") if t in self.hicache]
        if not tiers:
            return
        pb = self.hicache.get("page_bytes", 0)
        rows = {"hit_rate": [], "bytes": [], "hit_tokens": [], "load_seconds": [], "store_seconds": []}
        for t, d in tiers:
            disk = t == "disk"
            rows["hit_rate"].append((t, d["hit_rate"]))
            rows["bytes"].append((t, d["files"] * pb if disk else d["used_bytes"]))
            rows["hit_tokens"].append((t, d["hit_tokens"]))
            rows["load_seconds"].append((t, d["read_seconds"] if disk else d["load_seconds"]))
            rows["store_seconds"].append((t, d["write_seconds"] if disk else d["store_seconds"]))
        for suffix, doc, kind in (
            ("hit_rate", "prompt tokens restored from the tier over those looked up", GaugeMetricFamily),
            ("bytes", "KV bytes held in the tier", GaugeMetricFamily),
            ("hit_tokens", "prompt tokens restored from the tier", CounterMetricFamily),
            ("load_seconds", "seconds spent reading pages from the tier", CounterMetricFamily),
            ("store_seconds", "seconds spent writing pages to the tier", CounterMetricFamily),
        ):
            fam = kind(f"radixrt:hicache_{suffix}", doc, labels=names + ["tier"])
            for t, v in rows[suffix]:
                fam.add_metric(vals + [t], v)
            yield fam
        host = self.hicache.get("host", {})
        for suffix, doc in (
            ("restoring_jobs", "restores in flight on the copy thread (their requests wait)"),
            ("restoring_pages", "KV pool pages being filled by restores in flight"),
            ("storing_jobs", "stores of evicted pages to tier 2 in flight on the store thread"),
            ("storing_pages", "KV pool pages held until their store to tier 2 lands"),
        ):
            fam = GaugeMetricFamily(f"radixrt:hicache_{suffix}", doc, labels=names)
            fam.add_metric(vals, host.get(suffix, 0))
            yield fam

    def collect(self):
        names = list(self.labels)
        vals = [self.labels[k] for k in names]
        rate = self.hit / self.query if self.query else 0.0
        for name, doc, v in (
            ("sglang:num_running_reqs", "running requests", self.running),
            ("vllm:num_requests_running", "running requests", self.running),
            ("sglang:num_queue_reqs", "requests waiting to be scheduled", self.waiting),
            ("vllm:num_requests_waiting", "requests waiting to be scheduled", self.waiting),
            ("sglang:token_usage", "KV pages held by requests or pinned in the tree, over all", self.usage),
            ("vllm:kv_cache_usage_perc", "KV pages held by requests or pinned in the tree, over all", self.usage),
            ("radixrt:kv_cache_cached_ratio", "evictable cached KV pages over all pages", self.cached_ratio),
            ("sglang:cache_hit_rate", "prompt tokens served from the prefix cache over those looked up", rate),
            (
                "sglang:spec_accept_length",
                "tokens per verifying request-step (accepted drafts + 1)",
                self.spec.get("accept_length", 0.0),
            ),
            ("radixrt:spec_accept_rate", "accepted over proposed draft tokens", self.spec.get("accept_rate", 0.0)),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(vals, v)
            yield g
        m = self.memory
        for name, doc, v in (
            ("radixrt:weight_bytes", "bytes of the model's weights as held", m.get("weight_bytes", 0)),
            ("radixrt:kv_pool_bytes", "bytes of the KV pool", m.get("kv_pool_bytes", 0)),
            (
                "radixrt:peak_rss_bytes",
                "peak resident set of every server process, summed (bytes)",
                m.get("peak_rss_by_process", {}).get("total", 0),
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(vals, v)
            yield g
        for name, doc, v in (
            ("vllm:prefix_cache_queries", "prompt tokens looked up in the prefix cache", self.query),
            ("vllm:prefix_cache_hits", "prompt tokens served from the prefix cache", self.hit),
            ("sglang:cached_tokens", "prompt tokens served from the prefix cache", self.hit),
            ("vllm:spec_decode_num_accepted_tokens", "draft tokens accepted", self.spec.get("accepted_tokens", 0)),
            (
                "vllm:spec_decode_num_draft_tokens",
                "draft tokens proposed and verified",
                self.spec.get("draft_tokens", 0),
            ),
            ("vllm:spec_decode_num_drafts", "request-steps that verified drafts", self.spec.get("verify_steps", 0)),
        ):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(vals, v)
            yield c
        yield from self._tiers(names, vals)


class Metrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self.lab = {"model_name": model_name}
        r, names = self.registry, list(self.lab)

        def both(kind, suffix, doc, **kw):
            return [
                kind(f"{p}:{suffix}", doc, names + kw.pop("extra", []), registry=r, **kw) for p in ("sglang", "vllm")
            ]

        self.prompt_tokens = both(Counter, "prompt_tokens", "prompt tokens of finished requests")
        self.gen_tokens = both(Counter, "generation_tokens", "generated tokens of finished requests")
        self.requests = Counter("sglang:num_requests", "finished requests", names, registry=r)
        self.success = Counter("vllm:request_success", "finished requests", names + ["finished_reason"], registry=r)
        self.ttft = both(Histogram, "time_to_first_token_seconds", "time to first token", buckets=_LATENCY_BUCKETS)
        self.itl = both(Histogram, "inter_token_latency_seconds", "time between output tokens", buckets=_ITL_BUCKETS)
        self.e2e = both(
            Histogram, "e2e_request_latency_seconds", "request latency, arrival to finish", buckets=_LATENCY_BUCKETS
        )
        self.restarts = Counter(
            "radixrt:process_restarts", "children restarted after a child process died", names + ["process"], registry=r
        )
        self.state = _SchedulerState(self.lab)
        r.register(self.state)

    def observe_restart(self, process: str) -> None:
        self.restarts.labels(**self.lab, process=process).inc()

    def observe_ttft(self, dt: float) -> None:
        for h in self.ttft:
            h.labels(**self.lab).observe(dt)

    def observe_itl(self, dt: float, n: int = 1) -> None:
        for fam in self.itl:
            h = fam.labels(**self.lab)
            for _ in range(n):
                h.observe(dt)

    def observe_finish(
        self, e2e: float, prompt_tokens: int, completion_tokens: int, cached_tokens: int, reason: str
    ) -> None:
        for h in self.e2e:
            h.labels(**self.lab).observe(e2e)
        for c in self.prompt_tokens:
            c.labels(**self.lab).inc(prompt_tokens)
        for c in self.gen_tokens:
            c.labels(**self.lab).inc(completion_tokens)
        self.requests.labels(**self.lab).inc()
        self.success.labels(**self.lab, finished_reason=reason).inc()

    def update(self, info) -> None:
        """Refresh the gauges and cache counters from an ``InfoOut``."""
        c, s = info.cache, self.state
        total = max(c.get("total_pages", 0), 1)
        s.running, s.waiting = info.num_running, info.num_waiting
        s.usage = (total - c.get("free_pages", 0) - c.get("evictable_pages", 0)) / total
        s.cached_ratio = c.get("evictable_pages", 0) / total
        s.query, s.hit = c.get("query_tokens", 0), c.get("hit_tokens", 0)
        s.spec = c.get("speculative", {})
        s.hicache = c.get("hicache") or {}

    def update_memory(self, memory: dict) -> None:
        """Refresh the memory gauges from ``get_server_info``'s ``memory`` dict."""
        self.state.memory = memory

    def render(self) -> bytes:
        return generate_latest(self.registry)
