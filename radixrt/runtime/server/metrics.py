"""Prometheus metrics for ``GET /metrics`` (``--enable-metrics``), with ``prometheus-client``.

- Gauges, refreshed from the scheduler at each scrape: ``radixrt_num_running_reqs``,
  ``radixrt_num_waiting_reqs``, ``radixrt_kv_cache_usage_ratio`` (pages held by requests or pinned,
  over all pages), ``radixrt_kv_cache_cached_ratio`` (evictable cached pages over all pages).
- Counters: ``radixrt_prefix_cache_query_tokens_total`` / ``radixrt_prefix_cache_hit_tokens_total``
  (the scheduler's totals), ``radixrt_prompt_tokens_total``, ``radixrt_generation_tokens_total``,
  ``radixrt_requests_total{finish_reason}``.
- Histograms (seconds): ``radixrt_time_to_first_token_seconds``, ``radixrt_inter_token_latency_seconds``,
  ``radixrt_e2e_request_latency_seconds``, measured in the main process.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _CacheCounters:
    """Exposes the scheduler's cumulative prefix-cache totals as counters."""

    def __init__(self, labels: dict):
        self.labels = labels
        self.query = 0
        self.hit = 0

    def collect(self):
        names = list(self.labels)
        for name, doc, v in (("radixrt_prefix_cache_query_tokens", "prompt tokens looked up in the prefix cache",
                              self.query),
                             ("radixrt_prefix_cache_hit_tokens", "prompt tokens served from the prefix cache",
                              self.hit)):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric([self.labels[k] for k in names], v)
            yield c


class Metrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        lab = {"model_name": model_name}
        self.lab = lab
        r = self.registry
        self.running = Gauge("radixrt_num_running_reqs", "requests in the running batch", list(lab), registry=r)
        self.waiting = Gauge("radixrt_num_waiting_reqs", "requests waiting to be scheduled", list(lab), registry=r)
        self.kv_usage = Gauge("radixrt_kv_cache_usage_ratio",
                              "KV pages held by running requests or pinned in the tree, over all pages",
                              list(lab), registry=r)
        self.kv_cached = Gauge("radixrt_kv_cache_cached_ratio", "evictable cached KV pages over all pages",
                               list(lab), registry=r)
        self.prompt_tokens = Counter("radixrt_prompt_tokens", "prompt tokens of finished requests", list(lab),
                                     registry=r)
        self.gen_tokens = Counter("radixrt_generation_tokens", "generated tokens of finished requests", list(lab),
                                  registry=r)
        self.requests = Counter("radixrt_requests", "finished requests", list(lab) + ["finish_reason"], registry=r)
        self.ttft = Histogram("radixrt_time_to_first_token_seconds", "time to first token", list(lab),
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("radixrt_inter_token_latency_seconds", "time between output tokens", list(lab),
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("radixrt_e2e_request_latency_seconds", "request latency, arrival to finish",
                             list(lab), buckets=_LATENCY_BUCKETS, registry=r)
        self.cache = _CacheCounters(lab)
        r.register(self.cache)

    def observe_ttft(self, dt: float) -> None:
        self.ttft.labels(**self.lab).observe(dt)

    def observe_itl(self, dt: float, n: int = 1) -> None:
        h = self.itl.labels(**self.lab)
        for _ in range(n):
            h.observe(dt)

    def observe_finish(self, e2e: float, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
                       reason: str) -> None:
        self.e2e.labels(**self.lab).observe(e2e)
        self.prompt_tokens.labels(**self.lab).inc(prompt_tokens)
        self.gen_tokens.labels(**self.lab).inc(completion_tokens)
        self.requests.labels(**self.lab, finish_reason=reason).inc()

    def update(self, info) -> None:
        """Refresh the gauges and cache counters from an ``InfoOut``."""
        c = info.cache
        total = max(c.get("total_pages", 0), 1)
        self.running.labels(**self.lab).set(info.num_running)
        self.waiting.labels(**self.lab).set(info.num_waiting)
        self.kv_usage.labels(**self.lab).set((total - c.get("free_pages", 0) - c.get("evictable_pages", 0)) / total)
        self.kv_cached.labels(**self.lab).set(c.get("evictable_pages", 0) / total)
        self.cache.query = c.get("query_tokens", 0)
        self.cache.hit = c.get("hit_tokens", 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
