"""The degradation path over a real HTTP connection: from CTX_DEGRADE_INFLIGHT requests in
flight a context load skips L3 (degraded=true, reason in the trace), from CTX_SHED_INFLIGHT the
service answers 503 + Retry-After before reading the body, and the ops endpoints still answer.

Requests are held in flight deterministically by raw sockets that send a request's headers
and only part of its body (the service counts a request from its first byte)."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_ops_hardening import run_app
from test_service import cleanup_service_keys, service_settings

from context_app.service.middleware import LoadGauge
from context_core.config import get_settings
from context_core.errors import ConfigError
from loadtests.slo import parse_service_metrics


@pytest.fixture(scope="module")
def shed_svc(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("shed")
    settings, raw = service_settings(tmp, redis_url, shed_inflight=3, degrade_inflight=0)
    with run_app(settings) as (url, app):
        yield {"url": url, "key": raw["agent-a"], "gauge": app.state.load, "settings": settings}
    cleanup_service_keys(redis_url)


def _hold(url: str, key: str) -> socket.socket:
    """A POST whose body never completes: in flight until the socket closes."""
    port = int(url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(
        b"POST /v1/sessions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + f"X-API-Key: {key}\r\nContent-Length: 200\r\n\r\n".encode()
        + b'{"session_id": "t-'
    )
    return s


def _wait_inflight(gauge: LoadGauge, n: int) -> None:
    deadline = time.monotonic() + 10
    while gauge.inflight != n:
        assert time.monotonic() < deadline, f"in flight {gauge.inflight}, expected {n}"
        time.sleep(0.01)


def _context(c: httpx.Client, sid: str) -> dict[str, Any]:
    r = c.post("/v1/sessions", json={"session_id": sid, "user_id": "u-1", "user_query": "pump"})
    assert r.status_code == 201, r.text
    state = r.json()["state"]
    body = {"session_id": sid, "step_intent": "default", "state": state, "params": {}}
    r = c.post("/v1/context", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_bundles_degrade_before_requests_are_shed(shed_svc: dict[str, Any]) -> None:
    gauge: LoadGauge = shed_svc["gauge"]
    url = shed_svc["url"]
    with httpx.Client(base_url=url, headers={"X-API-Key": shed_svc["key"]}, timeout=30) as c:
        calm = _context(c, f"t-{uuid.uuid4().hex[:12]}")
        assert calm["degraded"] is False

        gauge.degrade_at = 2
        held = [_hold(url, shed_svc["key"])]
        try:
            _wait_inflight(gauge, 1)  # this context load is the 2nd request in flight
            busy = _context(c, f"t-{uuid.uuid4().hex[:12]}")
        finally:
            for s in held:
                s.close()
            gauge.degrade_at = 0
        assert busy["degraded"] is True
        assert busy["fragments"], "the L1/L2 part of the bundle is still delivered"
        assert not any(f["layer"] == "L3" for f in busy["fragments"])

        metrics = c.get("/metrics").text
        assert "ctx_degraded_bundles_total 1.0" in metrics

    traces = Path(shed_svc["settings"].traces_dir)
    records = [
        json.loads(line)
        for f in sorted(traces.glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    by_id = {r.get("trace_id"): r for r in records}
    assert by_id[busy["trace_id"]]["l3"]["error"].startswith("skipped under load: 2 requests")
    assert by_id[calm["trace_id"]]["l3"]["error"] is None


def test_past_the_limit_requests_get_503_with_retry_after_and_ops_still_answer(
    shed_svc: dict[str, Any],
) -> None:
    gauge: LoadGauge = shed_svc["gauge"]
    url, key = shed_svc["url"], shed_svc["key"]
    held = [_hold(url, key) for _ in range(3)]
    try:
        _wait_inflight(gauge, 3)
        with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30) as c:
            r = c.get("/v1/intents")
            assert r.status_code == 503
            assert r.headers["Retry-After"] == "1"
            body = r.json()
            assert body["error"] == "overloaded" and "CTX_SHED_INFLIGHT=3" in body["detail"]
            assert c.get("/healthz").status_code == 200
            assert c.get("/readyz").status_code == 200
            metrics = c.get("/metrics").text
            assert "ctx_shed_requests_total 1.0" in metrics
            assert "ctx_inflight_requests 3.0" in metrics
            assert parse_service_metrics(metrics)["rss_bytes"] > 10 * 2**20
    finally:
        for s in held:
            s.close()
    _wait_inflight(gauge, 0)
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30) as c:
        assert c.get("/v1/intents").status_code == 200  # nothing stuck once the load is gone


def test_degradation_must_come_before_shedding() -> None:
    with pytest.raises(ConfigError, match=r"CTX_DEGRADE_INFLIGHT \(10\) must be below CTX_SHED"):
        get_settings(shed_inflight=10, degrade_inflight=10)
    assert get_settings(shed_inflight=0, degrade_inflight=10).degrade_inflight == 10


@pytest.mark.parametrize(
    ("inflight", "degrade_at", "degraded"),
    [(0, 2, False), (1, 2, False), (2, 2, True), (9, 0, False)],
)
def test_degrade_reason_follows_the_threshold(
    inflight: int, degrade_at: int, degraded: bool
) -> None:
    g = LoadGauge(shed_at=0, degrade_at=degrade_at)
    g.inflight = inflight
    reason = g.degrade_reason()
    assert (reason is not None) == degraded
    if degraded:
        assert reason is not None and f"CTX_DEGRADE_INFLIGHT={degrade_at}" in reason
