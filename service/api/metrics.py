"""Prometheus metrics, on a registry of our own, and vLLM's engine metrics beside them.

Requests by route and status and their latency come from a middleware (a streamed response counts
until its last byte); tokens, verdicts and compile waits from the generation path; the grammar cache
is read from the compiler when scraped. vLLM's own ``vllm:`` families (prefix-cache queries and
hits, KV-cache use, scheduler queues...), which its engine records in the process's default
registry unless ``--disable-log-stats``, are passed through as vLLM's server shows them; nothing
else of the default registry is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from tokenmold.grammar.cache import CacheStats
from tokenmold.grammar.store import StoreStats
from tokenmold.grammar.worker import WAIT_BUCKETS, PoolStats
from tokenmold.schemas.verdict import Verdict

if TYPE_CHECKING:
    from tokenmold.service.request.runtime import EngineStats

#: Status recorded for a request whose client went away before the answer (nginx's convention).
CLIENT_GONE = 499

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(
        self,
        cache_stats: Callable[[], CacheStats],
        pool_stats: Callable[[], PoolStats | None] = lambda: None,
        engine_stats: Callable[[], EngineStats | None] = lambda: None,
        store_stats: Callable[[], StoreStats | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tokenmold_requests", "HTTP requests by route and status.", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "tokenmold_request_seconds",
            "HTTP request latency (streams: until the last chunk).",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("tokenmold_prompt_tokens", "Prompt tokens of finished generations.", registry=r)
        self.completion_tokens = Counter("tokenmold_completion_tokens", "Generated tokens.", registry=r)
        self.verdicts = Counter("tokenmold_verdicts", "Outputs by verdict status.", ["status"], registry=r)
        self.compile_seconds = Histogram(
            "tokenmold_compile_seconds",
            "Time a request waited for its compiled shape (cache hits included).",
            buckets=_COMPILE_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("tokenmold_requests_in_flight", "HTTP requests being answered now.", registry=r)
        r.register(_CacheCollector(cache_stats))
        r.register(_PoolCollector(pool_stats))
        r.register(_EngineCollector(engine_stats))
        r.register(_StoreCollector(store_stats))
        r.register(_VllmCollector())

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


class _PoolCollector:
    """The compile pool's lanes (occupancy, queue waits) and workers, read at scrape time."""

    def __init__(self, stats: Callable[[], PoolStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        if stats is None:
            return
        yield GaugeMetricFamily("tokenmold_compile_workers", "Compile worker processes started.", value=stats.workers)
        yield GaugeMetricFamily(
            "tokenmold_compile_workers_heavy_cap", "Workers heavy compiles may hold at once.", value=stats.heavy_cap
        )
        for name, value, text in (
            ("killed", stats.killed, "Compile workers killed past the compile timeout."),
            ("died", stats.died, "Compile workers found dead (crashed, killed from outside)."),
            ("spawned", stats.spawned, "Compile workers started (initial, replacements, extras)."),
        ):
            yield CounterMetricFamily(f"tokenmold_compile_workers_{name}", text, value=value)
        busy = GaugeMetricFamily("tokenmold_compile_lane_busy", "Workers compiling, by lane.", labels=["lane"])
        waiting = GaugeMetricFamily("tokenmold_compile_lane_waiting", "Compiles waiting for a worker.", labels=["lane"])
        timeouts = CounterMetricFamily(
            "tokenmold_compile_queue_timeouts", "Compiles refused (503) after waiting too long.", labels=["lane"]
        )
        demoted = CounterMetricFamily(
            "tokenmold_compile_demoted", "Compiles estimated cheap that ran past the cheap budget.", labels=["lane"]
        )
        wait = HistogramMetricFamily(
            "tokenmold_compile_queue_wait_seconds", "Time a compile waited for a free worker.", labels=["lane"]
        )
        for lane, lane_stats in stats.lanes.items():
            busy.add_metric([lane], lane_stats.busy)
            waiting.add_metric([lane], lane_stats.waiting)
            timeouts.add_metric([lane], lane_stats.queue_timeouts)
            demoted.add_metric([lane], lane_stats.demoted)
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, WAIT_BUCKETS), "+Inf"], lane_stats.wait_buckets, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            wait.add_metric([lane], buckets, lane_stats.wait_seconds)
        yield from (busy, waiting, timeouts, demoted, wait)


class _EngineCollector:
    """Requests the engine holds and those aborted for a gone client, read at scrape time."""

    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        if stats is None:
            return
        yield GaugeMetricFamily("tokenmold_engine_alive", "1 while the engine process lives.", value=int(stats.alive))
        yield GaugeMetricFamily(
            "tokenmold_engine_requests_running", "Requests the engine holds now (batch slots).", value=stats.running
        )
        yield CounterMetricFamily(
            "tokenmold_engine_requests_aborted", "Engine requests aborted because the client left.", value=stats.aborted
        )


class _StoreCollector:
    """This server's use of the grammar store on disk (``--grammar-cache-dir``), read at scrape time;
    the engine's own loads and writes are in its process, not counted here."""

    def __init__(self, stats: Callable[[], StoreStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        if stats is None:
            return
        for name, value, text in (
            ("hits", stats.hits, "Compiled shapes loaded from the grammar store instead of compiled."),
            ("misses", stats.misses, "Shapes the grammar store did not hold (compiled)."),
            ("rejected", stats.rejected, "Grammar store files ignored: corrupt, or of other versions."),
            ("writes", stats.writes, "Compiled shapes written to the grammar store."),
            ("evictions", stats.evictions, "Grammar store files this server removed for space."),
        ):
            yield CounterMetricFamily(f"tokenmold_grammar_store_{name}", text, value=value)


class _VllmCollector:
    """vLLM's ``vllm:`` metric families, read from the default registry at scrape time."""

    def collect(self) -> Iterator[Any]:
        return (family for family in REGISTRY.collect() if family.name.startswith("vllm:"))


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
        self.metrics.in_flight.inc()
        status = CLIENT_GONE  # unless a response starts: the app was cancelled (errors get a 500 response)

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.in_flight.dec()
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
