"""Prometheus metrics of one service instance, in their own registry (no process globals).

With ``PROMETHEUS_MULTIPROC_DIR`` set (``ctx serve --workers N`` sets it), every worker writes
its samples to that directory and ``/metrics`` aggregates them, so a scrape sees the whole
instance rather than whichever worker answered.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "ServiceMetrics"]

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip


class ServiceMetrics:
    """The figures the load-test SLO gates and dashboards read."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._layer_children: dict[str, Any] = {}
        self._http_families(self.registry)
        self._rpc_families(self.registry)
        self._context_families(self.registry)
        self._load_families(self.registry)
        self._process_families(self.registry)
        self._threshold_families(self.registry)

    def _http_families(self, r: CollectorRegistry) -> None:
        """Requests by route template, method and status."""
        self.request_seconds = Histogram(
            "ctx_http_request_seconds",
            "HTTP request latency by route template and method",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "ctx_http_requests",
            "HTTP requests by route template, method and status code",
            ["route", "method", "status"],
            registry=r,
        )

    def _rpc_families(self, r: CollectorRegistry) -> None:
        """gRPC calls (:mod:`context_app.rpc`), named after OpenTelemetry's RPC conventions
        (``rpc.server.call.duration``; attributes ``rpc.service``, ``rpc.method``,
        ``rpc.grpc.status_code``), in this registry so one scrape shows HTTP and gRPC."""
        self.rpc_seconds = Histogram(
            "ctx_rpc_server_call_duration_seconds",
            "gRPC call latency by service, method and status code",
            ["rpc_service", "rpc_method", "rpc_grpc_status_code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def observe_rpc(self, service: str, method: str, code: str, seconds: float) -> None:
        """One gRPC call (a stream: from its start to its last message)."""
        self.rpc_seconds.labels(service, method, code).observe(seconds)

    def _context_families(self, r: CollectorRegistry) -> None:
        """How context bundles were built: per layer, L3, failures, degraded, L2 misses."""
        self.layer_seconds = Histogram(
            "ctx_layer_seconds",
            "Time spent per memory layer while building a context bundle",
            ["layer"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.l3_search_seconds = Histogram(
            "ctx_l3_search_seconds",
            "L3 knowledge search time per routed request that asked for L3",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.load_failures = Counter(
            "ctx_context_load_failures",
            "Context requests that produced no bundle, by reason",
            ["reason"],
            registry=r,
        )
        self.degraded = Counter(
            "ctx_degraded_bundles", "Bundles served without L3 (failure or timeout)", registry=r
        )
        self.l2_misses = Counter(
            "ctx_l2_misses", "Working-memory keys an intent asked for and did not find", registry=r
        )
        # pre-create the label sets the SLO gates read, so they export 0 instead of nothing
        for reason in ("backend", "l2_miss", "error"):
            self.load_failures.labels(reason=reason)

    def _load_families(self, r: CollectorRegistry) -> None:
        """Backends down, requests shed and in flight."""
        self.backend_unavailable = Counter(
            "ctx_backend_unavailable",
            "Requests answered 503 because a backend was down",
            ["backend"],
            registry=r,
        )
        self.shed = Counter(
            "ctx_shed_requests",
            "Requests answered 503 + Retry-After because the worker already held "
            "CTX_SHED_INFLIGHT requests (load shedding)",
            registry=r,
        )
        self.inflight = Gauge(
            "ctx_inflight_requests",
            "Requests in flight in this worker at scrape time (CTX_DEGRADE_INFLIGHT skips L3 "
            "from here on, CTX_SHED_INFLIGHT sheds)",
            registry=r,
            multiprocess_mode="livesum",
        )

    def _process_families(self, r: CollectorRegistry) -> None:
        """Process figures for the long-session leak gate, refreshed by sample_process() at
        scrape time and (with several workers) by each worker's own periodic task; and the
        background jobs' counts."""
        self.rss = Gauge(
            "ctx_process_rss_bytes",
            "Resident set size of the service process (summed over live workers)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.py_blocks = Gauge(
            "ctx_python_allocated_blocks",
            "sys.getallocatedblocks(): memory blocks the interpreter holds, a cheap proxy of "
            "live Python objects (summed over live workers; no heap walk)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.acl_resyncs = Counter(
            "ctx_acl_resyncs",
            "Namespace ACL re-syncs from the API keys file after Redis lost its data "
            "(restart or flush)",
            registry=r,
        )
        self.idle_timeouts = Counter(
            "ctx_idle_timeouts",
            "Sessions timed out by the idle sweep (no activity for CTX_SESSION_IDLE_S)",
            registry=r,
        )

    def _threshold_families(self, r: CollectorRegistry) -> None:
        """The L3 confidence thresholds in force and where they came from."""
        self.threshold = Gauge(
            "ctx_confidence_threshold",
            "Confidence threshold in force for L3 hits (accept / skip), read on every route "
            "from thresholds.json when it changes",
            ["bound"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.threshold_info = Gauge(
            "ctx_confidence_thresholds_info",
            "Provenance of the thresholds in force: file or defaults, the embedding model "
            "they were calibrated for, the labelling rule, the promoted calibration version "
            "(empty: defaults or an unversioned file) (value 1)",
            ["source", "model", "rule", "version"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.threshold_mismatch = Gauge(
            "ctx_thresholds_model_mismatch",
            "1 when thresholds.json was calibrated for another embedding model than the one "
            "in use (refused or, with CTX_THRESHOLDS_MODEL_MISMATCH=warn, used anyway)",
            registry=r,
            multiprocess_mode="mostrecent",
        )

    def sample_process(self, inflight: int | None = None) -> None:
        """Refresh the per-process gauges (RSS, interpreter blocks, requests in flight)."""
        import sys

        import psutil

        self.rss.set(float(psutil.Process().memory_info().rss))
        self.py_blocks.set(float(sys.getallocatedblocks()))
        if inflight is not None:
            self.inflight.set(float(max(0, inflight)))

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One HTTP request: its latency and its count by status. The labelled children are
        kept (``labels()`` validates and locks on every call; there are a few dozen)."""
        key = (route, method, status)
        found = self._request_children.get(key)
        if found is None:
            found = (
                self.request_seconds.labels(route, method),
                self.requests.labels(route, method, str(status)),
            )
            if len(self._request_children) < 4096:  # route templates: bounded anyway
                self._request_children[key] = found
        found[0].observe(seconds)
        found[1].inc()

    def observe_bundle(self, timings_ms: Mapping[str, float], *, l3_requested: bool) -> None:
        for layer, ms in timings_ms.items():
            child = self._layer_children.get(layer)
            if child is None:
                child = self._layer_children[layer] = self.layer_seconds.labels(layer=layer)
            child.observe(max(0.0, float(ms)) / 1000.0)
        if l3_requested and "l3" in timings_ms:
            self.l3_search_seconds.observe(max(0.0, float(timings_ms["l3"])) / 1000.0)

    def set_thresholds(self, status: Mapping[str, object]) -> None:
        """Export the router's current threshold pair and where it came from."""
        for bound in ("accept", "skip"):
            value = status.get(bound)
            if isinstance(value, int | float):
                self.threshold.labels(bound=bound).set(float(value))
        self.threshold_info.clear()
        self.threshold_info.labels(
            source=str(status.get("source", "")),
            model=str(status.get("model") or ""),
            rule=str(status.get("rule", "")),
            version=str(status.get("version") or ""),
        ).set(1)
        self.threshold_mismatch.set(1.0 if status.get("mismatch") else 0.0)

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            agg = CollectorRegistry()
            multiprocess.MultiProcessCollector(agg)
            return generate_latest(agg)
        return generate_latest(self.registry)
