"""The bundle budget: at most N fragments, chosen across layers by a documented priority;
the rest listed by reference (never their content). Real Redis, Qdrant Edge and MiniLM
(fixtures from test_router) for the routes; apply_budget itself is pure."""

# ruff: noqa: F811  (pytest fixtures imported from test_router are parameters here)

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator

import pytest
from conftest import cleanup_keys
from test_router import KNOWLEDGE, Env, _pid, env  # noqa: F401 (fixtures)

from context_core.access.namespaces import Grant, NamespaceRegistry
from context_core.errors import ConfigError
from context_core.routing.bundle import PRIORITY, Fragment, Tier, apply_budget, reference_entry
from context_core.routing.intents import IntentRegistry, IntentSpec, L2KeySpec, NsKeySpec
from context_core.routing.router import ContextRouter

# --- apply_budget, pure ---------------------------------------------------------------------


def _frag(layer: str, name: str, relevance: float = 1.0, label: str = "exact") -> Fragment:
    return Fragment(layer, f"{layer}:{name}", {"v": name}, relevance, 0.0, relevance, label)  # type: ignore[arg-type]


def _route_order() -> list[tuple[Tier, Fragment]]:
    """One fragment per tier (two for L3 and optional L2), in the order a route reads them."""
    return [
        ("l1", _frag("L1", "session.user_query")),
        ("l1", _frag("L1", "session.current_step")),
        ("optional_l2", _frag("L2", "pref:{u}:units", 0.6, "preference")),
        ("required", _frag("L2", "step:1")),
        ("contract", _frag("L2", "contract:current")),
        ("optional_l2", _frag("L2", "api:x")),
        ("namespace", _frag("NS", "baseline")),
        ("low_l3", _frag("L3", "c:low-a", 0.70, "low_confidence")),
        ("confident_l3", _frag("L3", "c:conf-b", 0.80, "confident")),
        ("confident_l3", _frag("L3", "c:conf-a", 0.95, "confident")),
        ("low_l3", _frag("L3", "c:low-b", 0.71, "low_confidence")),
    ]


def test_priority_order_is_the_documented_one() -> None:
    assert PRIORITY == (
        "required", "contract", "confident_l3", "namespace", "optional_l2", "low_l3", "l1",
    )  # fmt: skip
    ranked = _route_order()
    delivered, by_ref = apply_budget(ranked, 0 + len(ranked))
    assert delivered == [f for _, f in ranked] and by_ref == []
    # Budget 1 still delivers the required key; the rest comes by reference in priority
    # order (relevance breaks ties within a tier, then route order).
    delivered, by_ref = apply_budget(ranked, 1)
    assert [f.source for f in delivered] == ["L2:step:1"]
    assert [f.source for f in by_ref] == [
        "L2:contract:current",
        "L3:c:conf-a",
        "L3:c:conf-b",
        "NS:baseline",
        "L2:api:x",
        "L2:pref:{u}:units",
        "L3:c:low-b",
        "L3:c:low-a",
        "L1:session.user_query",
        "L1:session.current_step",
    ]


@pytest.mark.parametrize(
    ("n", "delivered"),
    [
        (2, ["L2:step:1", "L2:contract:current"]),
        # delivered fragments keep the route's order, whatever their rank
        (3, ["L2:step:1", "L2:contract:current", "L3:c:conf-a"]),
        (5, ["L2:step:1", "L2:contract:current", "NS:baseline", "L3:c:conf-b", "L3:c:conf-a"]),
        (
            7,
            [
                "L2:pref:{u}:units", "L2:step:1", "L2:contract:current", "L2:api:x",
                "NS:baseline", "L3:c:conf-b", "L3:c:conf-a",
            ],
        ),
    ],
)  # fmt: skip
def test_budget_cuts_by_priority_and_keeps_route_order(n: int, delivered: list[str]) -> None:
    got, by_ref = apply_budget(_route_order(), n)
    assert [f.source for f in got] == delivered
    assert len(got) + len(by_ref) == len(_route_order())
    assert not {f.source for f in got} & {f.source for f in by_ref}


def test_required_keys_are_never_cut() -> None:
    ranked: list[tuple[Tier, Fragment]] = [
        ("l1", _frag("L1", "session.user_query")),
        *[("required", _frag("L2", f"step:{i}")) for i in range(4)],
    ]
    delivered, by_ref = apply_budget(ranked, 3)
    assert [f.source for f in delivered] == [f"L2:step:{i}" for i in range(4)]
    assert [f.source for f in by_ref] == ["L1:session.user_query"]


def test_reference_entry_never_carries_content() -> None:
    f = _frag("L3", "c:conf-a", 0.95, "confident")
    assert reference_entry(f) == {
        "layer": "L3",
        "source": "L3:c:conf-a",
        "relevance": 0.95,
        "label": "confident",
    }


# --- intent and router configuration -----------------------------------------------------------


def test_intent_max_fragments_is_validated_and_read_from_data() -> None:
    reg = IntentRegistry.from_dict({"wide": {"l3": True, "max_fragments": 6}})
    assert reg.get("wide").max_fragments == 6
    assert reg.get("default").max_fragments is None
    with pytest.raises(ConfigError, match="max_fragments must be a positive integer"):
        IntentSpec(name="bad", max_fragments=0)
    with pytest.raises(ConfigError, match="max_fragments must be a positive integer"):
        IntentRegistry.from_dict({"bad": {"max_fragments": True}})
    with pytest.raises(ConfigError, match="below its 2 required L2 keys"):
        IntentSpec(
            name="bad",
            l2_keys=(L2KeySpec("step", "1", True), L2KeySpec("step", "2", True)),
            max_fragments=1,
        )


def test_router_max_fragments_is_validated(env: Env) -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="max_fragments"):
            ContextRouter(wm=env.sm().wm, knowledge=None, policy=env.router().policy,
                          tracer=env.tracer, max_fragments=bad)  # type: ignore[arg-type]  # fmt: skip


# --- routes ---------------------------------------------------------------------------------------


@pytest.fixture
def fleet(env: Env) -> Iterator[tuple[NamespaceRegistry, str]]:
    ns_name = f"fleet-{uuid.uuid4().hex[:8]}"
    reg = NamespaceRegistry(env.client, env.gateway)
    reg.create(ns_name, ttl_s=300, acl={"writer": Grant(frozenset({"reporting"}), write=True)})
    reg.write(ns_name, "baseline:PUMP", {"rms_mm_s": 2.2}, agent_id="writer", purpose="reporting")
    try:
        yield reg, ns_name
    finally:
        cleanup_keys(env.redis_url, f"ns:{{{ns_name}}}:*")


def _report_registry(ns_name: str, **over: object) -> IntentRegistry:
    """The built-in generate_report, reading our test namespace instead of "fleet"."""
    reg = IntentRegistry.builtin()
    spec = reg.get("generate_report")
    reg.register(
        dataclasses.replace(
            spec, namespaces=(NsKeySpec(ns_name, "baseline:{device_prefix}", "reporting"),), **over
        )
    )
    return reg


def _full_session(env: Env) -> None:
    sm = env.sm()
    sm.put_step_result("1", {"finding": "bearing wear", "rms_mm_s": 5.1})
    sm.update_contract({"goal": "monthly report", "device": "PUMP-0042"}, expected_version=0)
    prefs = env.sm().wm.preferences("default", env.user_id)
    prefs.set("units", "mm/s", confidence=0.9)
    prefs.set("report_language", "en", confidence=0.6)


def test_generate_report_delivers_at_most_three_and_lists_the_rest(
    env: Env, fleet: tuple[NamespaceRegistry, str]
) -> None:
    reg, ns_name = fleet
    _full_session(env)
    sid = env.session_id
    query = KNOWLEDGE[1][2]  # the pump report template itself: a confident top hit
    kw = {"namespaces": reg, "registry": _report_registry(ns_name)}
    with env.router(max_fragments=50, **kw) as router:
        everything = router.route(
            env.state(), "generate_report", params={"query": query}, agent_id="writer"
        )
    with env.router(**kw) as router:
        b = router.route(env.state(), "generate_report", params={"query": query}, agent_id="writer")
    assert len(everything.fragments) >= 10  # what it returned before the budget
    assert everything.context_used["by_reference"] == []
    # Budget 3: the required previous step, the task contract, the best confident L3 hit.
    assert b.sources == (
        f"L2:wm:{{{sid}}}:step:1",
        f"L2:wm:{{{sid}}}:contract:current",
        f"L3:knowledge_main:{_pid(1)}",
    )
    refs = b.context_used["by_reference"]
    assert len(refs) == len(everything.fragments) - 3
    assert {r["source"] for r in refs} == set(everything.sources) - set(b.sources)
    assert all(set(r) == {"layer", "source", "relevance", "label"} for r in refs)
    # Priority order: the other confident L3 hits, the namespace entry, preferences by
    # confidence, the low-confidence hits, the L1 fields last.
    layers = [r["layer"] for r in refs]
    ns_at = layers.index("NS")
    assert all(r["label"] == "confident" for r in refs[:ns_at])
    pref_refs = [r for r in refs if r["label"] == "preference"]
    assert [r["source"] for r in pref_refs] == [
        f"L2:pref:{{default:{env.user_id}}}:units",
        f"L2:pref:{{default:{env.user_id}}}:report_language",
    ]
    assert [r["relevance"] for r in pref_refs] == [0.9, 0.6]
    n_l1 = len(everything.by_layer("L1"))
    assert n_l1 == 3 and layers[-n_l1:] == ["L1"] * n_l1 and layers.count("L1") == n_l1
    # context_used lists only what was delivered
    used = b.context_used
    assert used["l1"] == [] and used["ns"] == [] and used["l3_reference"] == []
    assert used["l2"] == [f"wm:{{{sid}}}:step:1", f"wm:{{{sid}}}:contract:current"]
    assert used["l3"] == [_pid(1)]
    text = json.dumps(b.to_dict())
    assert "bearing wear" in text  # the delivered step result
    assert "mm/s RMS" not in text and 'rms_mm_s": 2.2' not in text  # referenced: no content
    assert set(b.to_dict()) == {
        "session_id", "step", "intent", "resolved_intent", "fragments", "degraded",
        "timings_ms", "context_used", "trace_id", "prompt",
    }  # fmt: skip
    # The trace records what was delivered and what was by reference.
    _, rec = env.traces()
    assert [f["source"] for f in rec["fragments"]] == list(b.sources)
    assert rec["by_reference"] == refs
    assert rec["l3"]["used"] is True
    assert rec["ns"]["found"] == [f"{ns_name}/baseline:PUMP"]  # read, then left out


def test_intent_budget_overrides_the_router(env: Env, fleet: tuple[NamespaceRegistry, str]) -> None:
    reg, ns_name = fleet
    _full_session(env)
    registry = _report_registry(ns_name, max_fragments=5)
    with env.router(namespaces=reg, registry=registry, max_fragments=2) as router:
        b = router.route(env.state(), "generate_report", params={"query": KNOWLEDGE[1][2]})
    assert len(b.fragments) == 5
    with env.router(namespaces=reg, registry=_report_registry(ns_name), max_fragments=2) as r2:
        b2 = r2.route(env.state(), "generate_report", params={"query": KNOWLEDGE[1][2]})
    assert len(b2.fragments) == 2
    assert b2.sources == b.sources[:2]  # step result, contract


def test_same_route_same_split(env: Env) -> None:
    _full_session(env)
    with env.router() as router:
        a = router.route(env.state(), "default", params={"query": KNOWLEDGE[0][2]})
        b = router.route(env.state(), "default", params={"query": KNOWLEDGE[0][2]})
    assert a.sources == b.sources and len(a.sources) == 3
    assert a.context_used["by_reference"] == b.context_used["by_reference"]
    # default: L3 hits first (confident, then low-confidence), L1 fields by reference
    assert all(f.layer == "L3" for f in a.fragments)
    assert [r["layer"] for r in a.context_used["by_reference"]] == ["L1"] * 3
