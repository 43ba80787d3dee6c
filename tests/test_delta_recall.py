"""Delta recall (context_core.routing.delta): a delta applied to its base is exactly the full
bundle.

Real parts, as in test_router.py (whose fixtures this module reuses): Redis (and a Redis
Cluster), Qdrant Edge on a temp dir with a few manual pages, the packaged MiniLM model.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from test_router import ALL, Env, env, redis_url

from context_core.errors import ContextMissError
from context_core.routing.delta import (
    BundleMirror,
    DeltaMismatchError,
    apply_delta,
    fragment_hash,
    fragment_ids,
    log_key,
)
from context_core.routing.router import ContextBundle, ContextRouter
from context_core.session.wire import BundleDeltaWire, FragmentWire, encode_json

FIXTURES = (env, redis_url)  # test_router's, used here by name (encoder: conftest)
FRAGMENT_FIELDS = set(FragmentWire.model_fields)
INTENTS = ("fetch_sensor_data", "compare_vibration", "generate_report", "call_api", "default")
QUERIES = (
    None,
    "pump vibration alarm limit",
    "replace the mechanical seal",
    "maintenance report template",
    "fan blade balance",
)


def _wire(bundle: ContextBundle) -> dict[str, Any]:
    """The delta answer as a client parses it (and valid against the published model)."""
    wire = json.loads(encode_json(bundle.to_delta_dict()))
    BundleDeltaWire.model_validate(wire)
    return dict(wire)


def _full(bundle: ContextBundle) -> list[dict[str, Any]]:
    return list(json.loads(bundle.to_json())["fragments"])


def _same_but_age(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """Two routes a moment apart: the same fragments in the same order; ages may tick."""
    assert [f["source"] for f in a] == [f["source"] for f in b]
    for x, y in zip(a, b, strict=True):
        assert {k: v for k, v in x.items() if k != "freshness_hours"} == {
            k: v for k, v in y.items() if k != "freshness_hours"
        }
        assert abs(x["freshness_hours"] - y["freshness_hours"]) < 0.01


class Session:
    """A scripted agent session whose L2/L3 inputs change between steps."""

    def __init__(self, e: Env, rng: random.Random) -> None:
        self.env = e
        self.rng = rng
        self.sm = e.sm()
        self.step = 1
        self.contract_version = 0
        self.state = e.state(step=self.step)
        self.sm.add_series_point("PUMP-0042.vibration", time.time() - 60, 3.1)
        self.sm.put_step_result("0", {"finding": "started"})
        self.contract_version = self.sm.update_contract(
            {"goal": "diagnose PUMP-0042"}, expected_version=0
        ).version
        self.api_params = {"device": "PUMP-0042", "window": "1h"}

    def change(self) -> str:
        """One random change of what the next route reads; returns its name."""
        op = self.rng.choice(("step", "step", "series", "contract", "api", "nothing", "nothing"))
        sm = self.sm
        if op == "step":  # the step's result lands in L2, and the agent moves on
            sm.put_step_result(str(self.step), {"finding": f"f{self.step}", "rms": self.step})
            self.step += 1
            self.state = self.env.state(step=self.step)
        elif op == "series":
            sm.add_series_point("PUMP-0042.vibration", time.time(), round(self.rng.random(), 3))
        elif op == "contract":  # a user correction
            self.contract_version = sm.update_contract(
                {"length": self.rng.choice(["one page", "short", "two pages"])},
                expected_version=self.contract_version,
                corrected=True,
            ).version
        elif op == "api":
            sm.put_api_response("sensors/rms", self.api_params, {"rms": self.rng.random()})
        return op

    def params(self, intent: str) -> dict[str, Any]:
        p: dict[str, Any] = {}
        query = self.rng.choice(QUERIES)  # L3 hits change with the query
        if query and intent in ("compare_vibration", "generate_report", "default"):
            p["query"] = query
        if intent == "call_api":
            p.update(endpoint="sensors/rms", api_params=self.api_params)
        return p


@pytest.mark.parametrize(("seed", "cap"), [(1, ALL), (2, 3), (3, 5)])
def test_deltas_applied_in_order_reproduce_every_full_bundle(env: Env, seed: int, cap: int) -> None:
    """Property over a scripted session: at every step, the client's bundle (its held base +
    the delta) is exactly the full bundle of the same route, and equals a route without
    delta a moment later but for the ticking ages. Bases are mostly the last bundle, some
    older ones (out of order), none, or unknown."""
    rng = random.Random(seed)
    s = Session(env, rng)
    mirror = BundleMirror()
    held: list[str] = []
    kinds = {"unchanged": 0, "changed": 0, "removed": 0, "full": 0}
    with env.router(max_fragments=cap) as router:
        for _ in range(40):
            s.change()
            intent = rng.choice(INTENTS)
            params = s.params(intent)
            r = rng.random()
            since = (
                mirror.last_id
                if r < 0.7
                else rng.choice(held)
                if r < 0.85 and held
                else None
                if r < 0.93
                else "99999.0badc0de"
            )
            try:
                b = router.route(s.state, intent, params=params, delta=True, since_bundle=since)
            except ContextMissError:
                continue  # a required key not there yet (nothing logged: tested below)
            wire = _wire(b)
            full = _full(b)
            base_held = since is not None and since in held[-8:]
            assert wire["full"] == (not base_held)
            assert wire["base_bundle_id"] == (since if base_held else None)
            assert mirror.apply(wire) == full
            held.append(wire["bundle_id"])
            plain = router.route(s.state, intent, params=params)
            assert plain.delta is None
            _same_but_age(full, _full(plain))
            kinds["unchanged"] += len(wire["unchanged"])
            kinds["changed"] += len(wire["fragments"]) * (not wire["full"])
            kinds["removed"] += len(wire["removed"])
            kinds["full"] += wire["full"]
    # the session exercised every part of the delta
    assert all(kinds.values()), kinds


def test_unchanged_fragments_go_by_reference(env: Env) -> None:
    sm = env.sm()
    sm.add_series_point("PUMP-0042.vibration", time.time() - 600, 4.2)
    sm.update_contract({"goal": "diagnose"}, expected_version=0)
    with env.router(max_fragments=ALL) as router:
        first = _wire(router.route(env.state(2), "fetch_sensor_data", delta=True))
        assert first["full"] and first["base_bundle_id"] is None and first["unchanged"] == []
        assert [f["pos"] for f in first["fragments"]] == [0, 1, 2, 3, 4]
        assert all(set(f) == {*FRAGMENT_FIELDS, "hash", "pos"} for f in first["fragments"])
        sm.add_series_point("PUMP-0042.vibration", time.time(), 5.0)
        b = router.route(
            env.state(3), "fetch_sensor_data", delta=True, since_bundle=first["bundle_id"]
        )
    second = _wire(b)
    assert not second["full"] and second["base_bundle_id"] == first["bundle_id"]
    sid = env.session_id
    # the step and the series changed; the query, the device and the contract did not
    assert [f["source"] for f in second["fragments"]] == [
        "L1:session.current_step",
        f"L2:wm:{{{sid}}}:series:PUMP-0042.vibration",
    ]
    refs = {r["id"]: r for r in second["unchanged"]}
    assert set(refs) == {
        "L1:session.user_query",
        "L1:session.last_device_id",
        f"L2:wm:{{{sid}}}:contract:current",
    }
    contract = refs[f"L2:wm:{{{sid}}}:contract:current"]
    assert contract["layer"] == "L2" and contract["pos"] == 4 and "content" not in contract
    assert second["removed"] == []
    assert apply_delta(first["fragments"], second) == _full(b)


def test_removed_lists_what_left(env: Env) -> None:
    sm = env.sm()
    sm.add_series_point("PUMP-0042.vibration", time.time(), 4.2)
    sm.update_contract({"goal": "diagnose"}, expected_version=0)
    sid = env.session_id
    with env.router(max_fragments=ALL) as router:
        a = _wire(router.route(env.state(), "fetch_sensor_data", delta=True))
        b = router.route(env.state(), "default", delta=True, since_bundle=a["bundle_id"])
    d = _wire(b)
    assert set(d["removed"]) == {
        f"L2:wm:{{{sid}}}:series:PUMP-0042.vibration",
        f"L2:wm:{{{sid}}}:contract:current",
    }
    assert {r["id"] for r in d["unchanged"]} >= {"L1:session.user_query"}
    assert apply_delta(a["fragments"], d) == _full(b)


def test_a_bundle_id_is_matched_whole(env: Env) -> None:
    """A since_bundle with anything after the id (here a newline, which '$' let through) is
    an unknown base: the answer is the whole bundle, as for any id never issued."""
    with env.router(max_fragments=ALL) as router:
        a = _wire(router.route(env.state(), "fetch_sensor_data", delta=True))
        bent = _wire(
            router.route(env.state(), "default", delta=True, since_bundle=a["bundle_id"] + "\n")
        )
        unknown = _wire(router.route(env.state(), "default", delta=True, since_bundle="1.00000000"))
    for d in (bent, unknown):
        assert d["unchanged"] == [] and d["removed"] == []
    assert bent.keys() == unknown.keys()


def test_concurrent_routes_against_one_base(env: Env) -> None:
    """Eight steps of one session at once, all against the same base: each delta is exact
    against that base, and every bundle gets its own id."""
    sm = env.sm()
    sm.add_series_point("PUMP-0042.vibration", time.time(), 4.2)
    sm.put_step_result("1", {"finding": "bearing"})
    sm.put_step_result("2", {"finding": "seal"})
    with env.router() as router:
        base_b = router.route(env.state(), "compare_vibration", delta=True)
        base = _wire(base_b)

        def one(i: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            b = router.route(
                env.state(step=2 + i % 2),
                INTENTS[i % 3],
                delta=True,
                since_bundle=base["bundle_id"],
            )
            return _wire(b), _full(b)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(8)))
    ids = {w["bundle_id"] for w, _ in answers} | {base["bundle_id"]}
    assert len(ids) == 9
    for wire, full in answers:
        assert wire["base_bundle_id"] == base["bundle_id"] and not wire["full"]
        assert apply_delta(_full(base_b), wire) == full


def test_out_of_order_answers_and_the_wrong_base(env: Env) -> None:
    """Answers applied in another order than sent still give exact bundles (each names its
    base); a delta applied to another bundle than its base is refused, never wrong."""
    sm = env.sm()
    sm.add_series_point("PUMP-0042.vibration", time.time(), 4.2)
    sm.update_contract({"goal": "diagnose"}, expected_version=0)
    with env.router(max_fragments=ALL) as router:
        b0 = router.route(env.state(1), "fetch_sensor_data", delta=True)
        w0 = _wire(b0)
        b1 = router.route(
            env.state(2), "fetch_sensor_data", delta=True, since_bundle=w0["bundle_id"]
        )
        sm.update_contract({"goal": "report"}, expected_version=1, corrected=True)
        b2 = router.route(
            env.state(3), "fetch_sensor_data", delta=True, since_bundle=w0["bundle_id"]
        )
    w1, w2 = _wire(b1), _wire(b2)
    mirror = BundleMirror()
    mirror.apply(w0)
    assert mirror.apply(w2) == _full(b2)  # the later answer first
    assert mirror.apply(w1) == _full(b1)
    assert mirror.last_id == w1["bundle_id"]
    # the contract changed between b1 and b2: w2 against b1's fragments is a mismatch
    sid = env.session_id
    ref = next(r for r in w1["unchanged"] if r["id"] == f"L2:wm:{{{sid}}}:contract:current")
    assert ref["hash"] == fragment_hash(_full(b0)[4])
    stale = {**w1, "base_bundle_id": "x"}
    with pytest.raises(DeltaMismatchError):
        apply_delta(_full(b2), stale)  # b2's contract is another version than b1 references
    with pytest.raises(DeltaMismatchError):
        BundleMirror().apply(w1)  # a client that does not hold the base


def test_lost_expired_or_evicted_base_answers_full(env: Env) -> None:
    with env.router(delta_keep=3) as router:
        ids = [_wire(router.route(env.state(), "default", delta=True))["bundle_id"]]
        for _ in range(3):
            w = _wire(router.route(env.state(), "default", delta=True, since_bundle=ids[-1]))
            assert not w["full"]
            ids.append(w["bundle_id"])

        def answer(since: str | None) -> dict[str, Any]:
            return _wire(router.route(env.state(), "default", delta=True, since_bundle=since))

        # ids[0] was evicted (3 kept); ids[1] is still there ... until this route logs one more
        assert answer(ids[0])["full"]
        assert answer(ids[-1])["base_bundle_id"] == ids[-1]
        seq, nonce = ids[-1].split(".")
        assert answer(f"{seq}.{'0' * 8 if nonce != '0' * 8 else '1' * 8}")["full"]
        assert answer("not-an-id")["full"]
        # the log expired (or the session was cleared): the counter restarts, old ids miss
        env.client.delete(log_key(env.session_id))
        fresh = answer(ids[-1])
        assert fresh["full"] and fresh["base_bundle_id"] is None
        assert fresh["bundle_id"].startswith("1.")
        assert answer(ids[0])["full"]  # seq 1 exists again, with another nonce
        assert not answer(fresh["bundle_id"])["full"]


def test_the_log_is_small_bounded_listed_and_expires(env: Env) -> None:
    sm = env.sm()
    key = log_key(env.session_id)
    with env.router(delta_keep=4) as router:
        last: str | None = None
        for _ in range(10):
            b = router.route(env.state(), "default", delta=True, since_bundle=last)
            last = _wire(b)["bundle_id"]
        wm = router.wm
    fields = env.client.hgetall(key)
    assert sorted(fields) == ["m:10", "m:7", "m:8", "m:9", "seq"]
    manifest = json.loads(fields["m:10"])
    assert set(manifest) == {"n", "i", "f"} and "content" not in fields["m:10"]
    assert 0 < env.client.ttl(key) <= wm.contract_ttl_s
    assert key in env.client.smembers(sm.index_key)
    sm.clear()
    assert not env.client.exists(key)


def test_delta_is_opt_in(env: Env) -> None:
    with env.router() as router:
        b = router.route(env.state(), "default")
        assert b.delta is None and "bundle_id" not in b.to_dict()
        with pytest.raises(ValueError, match="routed without delta"):
            b.to_delta_dict()
        with pytest.raises(ValueError, match="since_bundle"):
            router.route(env.state(), "default", since_bundle="1.00000000")
    assert not env.client.exists(log_key(env.session_id))


def test_a_failed_route_logs_nothing(env: Env) -> None:
    with env.router() as router, pytest.raises(ContextMissError):
        router.route(env.state(), "generate_report", delta=True)  # step 1 never written
    assert not env.client.exists(log_key(env.session_id))


def test_ids_and_hash() -> None:
    assert fragment_ids(["L1:a", "L2:b", "L1:a", "L1:a"]) == ["L1:a", "L2:b", "L1:a#2", "L1:a#3"]
    f = {"layer": "L2", "source": "L2:k", "content": {"b": 1, "a": [1, 2]}, "relevance": 1.0,
         "freshness_hours": 0.5, "confidence": 1.0, "label": "exact", "note": "",
         "p_relevant": None, "confidence_signal": None}  # fmt: skip
    same = {**f, "freshness_hours": 9.0, "content": {"a": [1, 2], "b": 1}}
    assert fragment_hash(f) == fragment_hash(same)  # age and key order are not content
    assert fragment_hash(f) != fragment_hash({**f, "content": {"a": [2, 1], "b": 1}})
    assert fragment_hash(f) != fragment_hash({**f, "label": "low_confidence"})
    assert len(fragment_hash(f)) == 16


def test_router_rejects_a_bad_keep(env: Env) -> None:
    from context_core.errors import ConfigError

    with pytest.raises(ConfigError, match="delta_keep"):
        ContextRouter(wm=env.sm().wm, knowledge=None, policy=env.router().policy,
                      tracer=env.tracer, delta_keep=0)  # fmt: skip
