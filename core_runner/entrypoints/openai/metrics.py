"""Prometheus metrics for /metrics.

Names: where a metric means what vLLM's metric of that name means, it carries vLLM's name
(``vllm:`` prefix), so vLLM's dashboards and alerts work unchanged; a metric of our own
would take the ``core_runner:`` prefix. Every metric has vLLM's ``model_name`` label.
Each server has its own registry (several servers in one process, as in tests, do not
collide); the engine thread updates the metrics (prometheus_client is thread-safe).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM's buckets (seconds)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)


class PrometheusStats:
    """The engine thread's reports (AsyncLLM's EngineStats) as Prometheus metrics."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self._running = Gauge("vllm:num_requests_running", "Requests in model execution batches.", labels,
                              registry=r).labels(model_name)
        self._waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", labels,
                              registry=r).labels(model_name)
        self._kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", labels,
                         registry=r).labels(model_name)
        self._prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels,
                               registry=r).labels(model_name)
        self._gen = Counter("vllm:generation_tokens", "Generation tokens processed.", labels,
                            registry=r).labels(model_name)
        self._pc_queries = Counter("vllm:prefix_cache_queries",
                                   "Prefix cache queries, in terms of number of queried tokens.", labels,
                                   registry=r).labels(model_name)
        self._pc_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                                labels, registry=r).labels(model_name)
        self._spec = [Counter(name, doc, labels, registry=r).labels(model_name) for name, doc in (
            ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
        )]
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.", labels,
                               buckets=_TTFT_BUCKETS, registry=r).labels(model_name)
        self._itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", labels,
                              buckets=_ITL_BUCKETS, registry=r).labels(model_name)

    def on_step(self, num_running: int, num_waiting: int, kv_cache_usage: float) -> None:
        self._running.set(num_running)
        self._waiting.set(num_waiting)
        self._kv.set(kv_cache_usage)

    def on_tokens(self, prompt: int, generation: int) -> None:
        if prompt:
            self._prompt.inc(prompt)
        if generation:
            self._gen.inc(generation)

    def on_prefix_cache(self, queries: int, hits: int) -> None:
        if queries:
            self._pc_queries.inc(queries)
        if hits:
            self._pc_hits.inc(hits)

    def on_spec_decode(self, drafts: int, draft_tokens: int, accepted_tokens: int) -> None:
        for counter, n in zip(self._spec, (drafts, draft_tokens, accepted_tokens)):
            if n:
                counter.inc(n)

    def on_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def on_inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
