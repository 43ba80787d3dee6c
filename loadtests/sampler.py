"""Samples the figures the SLO gates need while a campaign runs (a greenlet in Locust).

Every few seconds: Locust's own counters, current percentiles and cumulative response-time
histograms (all requests, ``POST /v1/context``; requests per endpoint), the target integrated
so far, the service's ``/metrics`` (L3 search histogram, load failures, degraded bundles, L2
misses, process RSS and allocated Python blocks) and Redis ``INFO`` (``expired_keys``, keys
held). A source that does not answer leaves ``None`` in the sample, which is itself
information (Redis down during a fault drill).

In a distributed run the sampler lives on the Locust master, whose stats sum the workers'
reports; ``sync`` (the locustfile's :class:`~loadtests.locustfile.StatsFlush`) makes every
worker report just before a sample is read, and says whether all of them did.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtests.slo import Hist, Sample, parse_redis_info, parse_service_metrics

__all__ = ["CONTEXT_ENTRY", "Sampler", "histogram_of"]

#: Locust's stats entry (name, method) of the context load.
CONTEXT_ENTRY = ("/v1/context", "POST")


def histogram_of(entry: Any) -> Hist | None:
    """A Locust ``StatsEntry``'s response-time dict as sorted ``(ms, count)`` pairs."""
    if entry is None:
        return None
    return tuple(sorted((int(ms), int(n)) for ms, n in entry.response_times.items()))


log = logging.getLogger(__name__)


class Sampler:
    def __init__(
        self,
        *,
        service_url: str,
        redis_url: str | None,
        stats: Any,
        run_time: Callable[[], float],
        target: Callable[[float], float],
        users: Callable[[], int],
        every_s: float = 2.0,
        target_requests: Callable[[float, float], float] | None = None,
        sync: Callable[[], tuple[int, bool]] | None = None,
    ) -> None:
        self.service_url = service_url.rstrip("/")
        self.redis_url = redis_url
        self.stats = stats
        self.run_time = run_time
        self.target = target
        self.users = users
        self.every_s = every_s
        self.samples: list[Sample] = []
        self.baseline: Sample | None = None
        self._redis: Any = None
        self._cluster = False
        self._db = 0
        self._running = False
        self._prev: tuple[float, int] | None = None
        self.target_requests = target_requests
        self._target_total = (0.0, 0.0)  # (t, requests the target asked for from 0 to t)
        self.sync = sync
        self.max_workers = 0

    def _redis_figures(self) -> tuple[int | None, int | None]:
        if not self.redis_url:
            return None, None
        try:
            if self._redis is None:
                from context_core.redis.connection import (
                    cluster_enabled,
                    make_client,
                    split_cluster_url,
                    url_db,
                )

                plain, named = split_cluster_url(self.redis_url)
                cluster = named or cluster_enabled(plain, connect_timeout=1.0, timeout=1.0)
                self._redis = make_client(
                    self.redis_url,
                    cluster=cluster,
                    decode_responses=False,
                    socket_timeout=1.0,
                    socket_connect_timeout=1.0,
                )
                self._db = 0 if cluster else url_db(plain)
                self._cluster = cluster
            if self._cluster:  # every primary's own figures, summed
                from redis.cluster import RedisCluster

                per_node = self._redis.info(target_nodes=RedisCluster.PRIMARIES)
                figures = [parse_redis_info(i, db=0) for i in per_node.values()]
                return sum(e for e, _ in figures), sum(k for _, k in figures)
            return parse_redis_info(self._redis.info(), db=self._db)
        except Exception as e:  # Redis down (fault drill) or not reachable from here
            log.debug("redis INFO failed: %s", e)
            return None, None

    def _service_figures(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"{self.service_url}/metrics", timeout=2.0) as resp:
                return parse_service_metrics(resp.read().decode("utf-8"))
        except Exception as e:
            log.debug("service /metrics failed: %s", e)
            return {}

    def take(self) -> Sample:
        workers: int | None = None
        synced = True
        if self.sync is not None:  # distributed: the workers' stats, flushed up to now
            workers, synced = self.sync()
            self.max_workers = max(self.max_workers, workers)
        total = self.stats.total
        t = self.run_time()
        expired, keys = self._redis_figures()
        svc = self._service_figures()
        # Achieved rate from the request counter between two samples: Locust's current_rps
        # trails over a 10 s window and would smear a burst.
        n = int(total.num_requests)
        achieved = 0.0
        if self._prev is not None and t > self._prev[0]:
            achieved = (n - self._prev[1]) / (t - self._prev[0])
        self._prev = (t, n)
        t0, asked = self._target_total
        if self.target_requests is not None and t > t0:
            asked += self.target_requests(t0, t)
            self._target_total = (t, asked)
        entries = self.stats.entries
        endpoints = tuple(
            sorted(
                (f"{method} {name}", int(e.num_requests)) for (name, method), e in entries.items()
            )
        )
        return Sample(
            t=round(t, 3),
            target_rps=round(self.target(t), 3),
            achieved_rps=round(achieved, 3),
            users=int(self.users()),
            requests=int(total.num_requests),
            failures=int(total.num_failures),
            p50_ms=total.get_current_response_time_percentile(0.5),
            p95_ms=total.get_current_response_time_percentile(0.95),
            p99_ms=total.get_current_response_time_percentile(0.99),
            expired_keys=expired,
            keys=keys,
            l3_buckets=svc.get("l3_buckets"),
            load_failures=svc.get("load_failures"),
            degraded=svc.get("degraded"),
            shed=svc.get("shed"),
            l2_misses=svc.get("l2_misses"),
            target_total=round(asked, 3),
            rt_all=histogram_of(total),
            rt_context=histogram_of(entries.get(CONTEXT_ENTRY)),
            endpoints=endpoints,
            rss_bytes=svc.get("rss_bytes"),
            py_blocks=svc.get("py_blocks"),
            workers=workers,
            stats_synced=synced,
        )

    def run(self) -> None:
        """The greenlet body: sample until :meth:`stop`."""
        import gevent

        self._running = True
        self.baseline = self.take()
        while self._running:
            gevent.sleep(self.every_s)
            if self._running:
                self.samples.append(self.take())

    def stop(self) -> None:
        if self._running:
            self._running = False
            self.samples.append(self.take())

    def dump(self, path: Path, **extra: Any) -> None:
        doc = {
            "written_at": time.time(),
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "samples": [s.to_dict() for s in self.samples],
            **extra,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
