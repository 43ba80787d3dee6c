"""The premature-expiration gate's evidence: the session ledger, the expiry watch (a real
Valkey's keyspace notifications) and the classifier that joins them, on hand-made runs."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis

from loadtests.ledger import (
    ExpiryReport,
    ExpiryWatch,
    SessionLedger,
    SessionRecord,
    classify,
    predicted_step_expirations,
    watch_redis,
)
from loadtests.slo import FIGURES, GATES, Sample, evaluate, premature_gate


def _ledger() -> SessionLedger:
    """Two sessions: ``a`` closed at t=20 after steps 0-2 (started at 10, 13, 16); ``b``
    abandoned after steps 0-1 (started at 11, 14), last request at 15."""
    led = SessionLedger()
    led.opened("a", 9.5)
    for k, t in enumerate((10.0, 13.0, 16.0)):
        led.step_started("a", k, t)
        led.wrote("a", k)
        led.sent("a", t + 0.5)
    led.sent("a", 20.0)  # the close
    led.ended("a", "closed")
    led.opened("b", 10.5)
    for k, t in enumerate((11.0, 14.0)):
        led.step_started("b", k, t)
        led.sent("b", t + 0.5)
    led.ended("b", "abandoned")
    return led


def test_a_step_output_expiring_before_its_dependent_step_is_premature() -> None:
    led = _ledger()
    events = [
        (12.0, "wm:{a}:step:0"),  # step 1 started at 13: premature
        (13.5, "wm:{a}:step:1"),  # step 2 started at 16: premature
        (17.0, "wm:{a}:step:2"),  # no step 3: expected
        (15.0, "wm:{b}:step:0"),  # step 1 started at 14: expected
        (19.0, "wm:{b}:step:1"),  # abandoned, no dependent: expected
    ]
    rep = classify(events, led.sessions)
    assert (rep.expired, rep.premature, rep.expected, rep.untracked) == (5, 2, 3, 0)
    assert rep.step_keys_expired == 5
    assert rep.violations == 2
    assert rep.examples[0] == "wm:{a}:step:0: step 0 output expired 1.00 s before step 1 started"
    assert rep.reasons["premature: step"] == 2
    assert (rep.sessions, rep.closed, rep.abandoned, rep.steps) == (2, 1, 1, 5)


def test_session_keys_are_premature_only_while_the_session_still_sends() -> None:
    led = _ledger()
    events = [
        (18.0, "wm:{a}:contract:current"),  # a sent its close at 20: premature
        (21.0, "svc:{a}:state"),  # after the close: expected
        (16.0, "wm:{b}:index"),  # b's last request at 15 (abandoned): expected
        (12.0, "wm:{a}:api:read_sensor:abc"),  # a cached tool response: expected
        (12.0, "wm:{warmup-1}:step:0"),  # a session this run's users never opened
        (12.0, "svc:agent:{loadtest-1}:wbytes:7"),  # a quota window, no session
    ]
    rep = classify(events, led.sessions)
    assert (rep.premature, rep.expected, rep.untracked) == (1, 3, 2)
    assert rep.examples == (
        "wm:{a}:contract:current: contract expired 2.00 s before the session's last request",
    )
    assert rep.reasons["untracked: no session of this run"] == 1
    assert rep.reasons["untracked: no session"] == 1


def test_lost_reads_count_even_when_no_expiry_was_announced() -> None:
    led = _ledger()
    led.lost_read("a", "wm:{a}:step:1")
    rep = classify([], led.sessions)
    assert rep.premature == 0 and rep.lost_reads == 1 and rep.violations == 1
    assert rep.examples == ("wm:{a}:step:1: read back missing while the session was live",)
    gate = premature_gate(rep)
    assert not gate.passed and gate.achieved == 1.0


def test_the_ledger_travels_from_a_worker_to_the_master_intact() -> None:
    led = _ledger()
    led.lost_read("b", "wm:{b}:step:0")
    wire = json.loads(json.dumps(led.to_wire()))  # what Locust's message carries
    master = SessionLedger()
    master.merge(wire)
    assert master.sessions["a"].steps == {0: 10.0, 1: 13.0, 2: 16.0}
    assert master.sessions["a"].end == "closed" and master.sessions["b"].end == "abandoned"
    assert master.sessions["b"].lost_reads == ["wm:{b}:step:0"]
    assert SessionRecord.from_wire(led.sessions["a"].to_wire()).last_sent == 20.0
    rep = classify([(12.0, "wm:{a}:step:0")], master.sessions)
    assert ExpiryReport.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep


def test_predicted_step_expirations_leave_out_what_a_close_deleted() -> None:
    led = _ledger()
    # TTL 2 s: a's steps expire at 12, 15, 18 (all before its close at 20), b's at 13, 16
    assert predicted_step_expirations(led.sessions, step_ttl_s=2.0, until=100.0) == 5
    # TTL 5 s: a's step 1 (due 18) and 2 (due 21) outlive... step 2 is deleted by the close
    assert predicted_step_expirations(led.sessions, step_ttl_s=5.0, until=100.0) == 4
    # only what came due before the watch stopped
    assert predicted_step_expirations(led.sessions, step_ttl_s=2.0, until=14.0) == 2
    with pytest.raises(ValueError, match="step_ttl_s"):
        predicted_step_expirations(led.sessions, step_ttl_s=0.0, until=1.0)


def test_the_gate_fails_on_a_premature_expiry_and_without_evidence() -> None:
    led = _ledger()
    ok = classify([(17.0, "wm:{a}:step:2")], led.sessions)
    bad = classify([(12.0, "wm:{a}:step:0")], led.sessions)
    assert premature_gate(ok).passed and premature_gate(ok).achieved == 0.0
    g = premature_gate(bad)
    assert not g.passed and g.achieved == 1.0
    assert "e.g. wm:{a}:step:0: step 0 output expired" in g.note
    assert not premature_gate(None).passed
    assert not premature_gate(classify([], {})).passed  # no session: nothing shown
    unwatched = classify([], led.sessions, watched=False)
    assert not premature_gate(unwatched).passed
    assert "not watched" in premature_gate(unwatched).note


def test_expired_keys_growth_is_reported_not_gated() -> None:
    """The burst's ~20 % growth (keys held fall after the peak) no longer fails a run."""
    samples = [
        Sample(
            t=t,
            target_rps=10.0,
            target_total=10.0 * t,
            requests=int(10 * t),
            expired_keys=int(t * 20),
            keys=200,
        )
        for t in (0.0, 5.0, 15.0, 25.0, 29.0)
    ]
    led = _ledger()
    v = evaluate(samples, run_s=30.0, ttl_factor=10.0, expiry=classify([], led.sessions))
    assert "expired_keys_growth" not in GATES and FIGURES == ("expired_keys_growth",)
    assert [r.name for r in v.figures] == ["expired_keys_growth"]
    fig = v.figures[0]
    assert fig.achieved is not None and fig.achieved > 0.05 and not fig.passed
    assert "expired_keys_growth" not in v.failed
    assert {r.name: r for r in v.results}["premature_expirations"].passed
    assert v.to_dict()["figures"][0]["name"] == "expired_keys_growth"


def test_the_watch_sees_real_expirations_and_restores_the_setting(
    embedded_valkey_url: str,
) -> None:
    c = redis.Redis.from_url(embedded_valkey_url)
    try:
        before = c.config_get("notify-keyspace-events")["notify-keyspace-events"]
        c.config_set("notify-keyspace-events", "Kg")  # an operator's own setting, kept
        watches = watch_redis(embedded_valkey_url)
        assert len(watches) == 1 and watches[0].subscribed
        flags = c.config_get("notify-keyspace-events")["notify-keyspace-events"]
        assert set(flags) >= {"K", "g", "E", "x"}, flags
        sid = f"lt-{uuid.uuid4().hex[:12]}"
        c.set(f"wm:{{{sid}}}:step:0", "v", px=50)
        c.set(f"wm:{{{sid}}}:step:1", "v", ex=60)  # does not expire during the test
        t_set = time.time()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not watches[0].events:
            c.get(f"wm:{{{sid}}}:step:0")  # a read expires it at once, if the cycle has not
            time.sleep(0.05)
        watches[0].stop()
        keys = [k for _, k in watches[0].events]
        assert keys == [f"wm:{{{sid}}}:step:0"]
        assert watches[0].events[0][0] >= t_set + 0.04
        assert set(c.config_get("notify-keyspace-events")["notify-keyspace-events"]) == {"K", "g"}
        c.delete(f"wm:{{{sid}}}:step:1")
    finally:
        c.config_set("notify-keyspace-events", before)
        c.close()


def test_a_watch_on_an_unreachable_server_never_subscribes() -> None:
    w = ExpiryWatch(lambda: redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), db=0)
    assert w.start(timeout_s=0.5) is False
    w.stop()
    assert not w.subscribed and w.error is not None and w.events == []
