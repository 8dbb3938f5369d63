"""Prometheus metrics, on a registry of our own (nothing of vLLM's or the process default's).

Requests by route and status and their latency come from a middleware (a streamed response counts
until its last byte); tokens, verdicts and compile waits from the generation path; the grammar cache
is read from the compiler when scraped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from grammar.cache import CacheStats
from schemas.verdict import Verdict

#: Status recorded for a request whose client went away before the answer (nginx's convention).
CLIENT_GONE = 499

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self, cache_stats: Callable[[], CacheStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tokenmold_requests", "HTTP requests by route and status.", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "tokenmold_request_seconds", "HTTP request latency (streams: until the last chunk).", ["route"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.prompt_tokens = Counter("tokenmold_prompt_tokens", "Prompt tokens of finished generations.", registry=r)
        self.completion_tokens = Counter("tokenmold_completion_tokens", "Generated tokens.", registry=r)
        self.verdicts = Counter("tokenmold_verdicts", "Outputs by verdict status.", ["status"], registry=r)
        self.compile_seconds = Histogram(
            "tokenmold_compile_seconds", "Time a request waited for its compiled shape (cache hits included).",
            buckets=_COMPILE_BUCKETS, registry=r,
        )
        r.register(_CacheCollector(cache_stats))

    def observe_verdict(self, verdict: Verdict, *, count_prompt: bool) -> None:
        """One finished output; its prompt is counted once per request (``count_prompt``)."""
        self.verdicts.labels(verdict.status.value).inc()
        self.completion_tokens.inc(verdict.usage.completion_tokens)
        if count_prompt:
            self.prompt_tokens.inc(verdict.usage.prompt_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CacheCollector(Collector):
    """The compiler's cache statistics, read at scrape time."""

    def __init__(self, stats: Callable[[], CacheStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        for name, value, text in (
            ("hits", stats.hits, "Compiled-shape cache hits."),
            ("misses", stats.misses, "Compiled-shape cache misses (compilations)."),
            ("evictions", stats.evictions, "Compiled shapes evicted for space."),
        ):
            yield CounterMetricFamily(f"tokenmold_grammar_cache_{name}", text, value=value)
        yield GaugeMetricFamily("tokenmold_grammar_cache_entries", "Compiled shapes cached.", value=stats.entries)
        yield GaugeMetricFamily("tokenmold_grammar_cache_bytes", "Bytes the cache holds.", value=stats.bytes)


class MetricsMiddleware:
    """Counts every HTTP request by route template (not raw path: bounded labels) and status."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = CLIENT_GONE  # unless a response starts: the app was cancelled (errors get a 500 response)

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
