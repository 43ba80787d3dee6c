"""The composition root: one wiring, shared parts, closing in reverse, failing cleanly.

Real servers only: the ``settings`` fixture's Redis (DB 13 of the system Redis, or the
embedded Valkey) and Qdrant Edge in the test's temp dir.
"""

from __future__ import annotations

import ast
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from context_app.service.deps import Services
from context_core import defaults
from context_core.config import Settings, get_settings
from context_core.errors import BackendUnavailableError
from context_core.gateway.sanitize import Gateway
from context_core.platform import Platform, build_platform
from context_core.routing.router import ContextRouter
from context_core.working_memory import WorkingMemory

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def _with(settings: Settings, **overrides: object) -> Settings:
    return get_settings(**{**settings.model_dump(), **overrides})


def _record_closing(p: Platform) -> list[str]:
    """Make ``p`` note each part's name as it closes it (the real close still runs)."""
    calls: list[str] = []

    def noting(what: str, close: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            calls.append(what)
            close()

        return run

    p._opened[:] = [(what, noting(what, close)) for what, close in p._opened]
    return calls


# --- building -------------------------------------------------------------------------------


def test_l2_platform_shares_one_client_and_gateway_and_opens_nothing_of_l3(
    settings: Settings,
) -> None:
    s = _with(settings, wm_default_ttl_s=123, l3_timeout_ms=55.0, bundle_max_fragments=5,
              l1_max_trace_tokens=777, correction_min_confidence=0.7)  # fmt: skip
    with build_platform(s, with_knowledge=False) as p:
        router, life = p.router, p.lifecycle
        # one gateway, one Redis client, one L2 store behind every part
        assert router.wm is p.wm and life.wm is p.wm
        assert life.gateway is p.gateway and p.wm._gateway is p.gateway
        assert p.wm._client is p.redis and p.namespaces._r is p.redis
        assert router.namespaces is p.namespaces and life.namespaces is p.namespaces
        assert router.tracer is p.tracer and router.registry is p.registry
        assert router.knowledge is None and life.knowledge is None
        # the settings reach every part
        assert p.wm.default_ttl_s == 123 and router.l3_timeout_ms == 55.0
        assert router.max_fragments == 5 and life.max_trace_tokens == 777
        assert life.correction_min_confidence == 0.7
        assert p.gateway.max_response_bytes == s.max_response_bytes
        # nothing of L3 was opened for an L1/L2 caller
        assert "vector store" not in p.opened and "encoder" not in p.__dict__
        # and the parts work: a step written through L2 is read back by the client
        sid = f"t-{uuid.uuid4().hex[:12]}"
        p.wm.session(sid).put_step_result("1", {"finding": "bearing wear"})
        try:
            loaded = p.wm.session(sid).get_step_result("1")
            assert loaded is not None and loaded.value["finding"] == "bearing wear"
            assert loaded.ttl_s is not None and 0 < loaded.ttl_s <= 123
            assert p.redis.exists(loaded.key) == 1
        finally:
            p.wm.session(sid).clear()


def test_full_platform_wires_l3_into_router_and_lifecycle(settings: Settings) -> None:
    p = build_platform(settings, eager=True)
    try:
        km = p.knowledge
        assert p.router.knowledge is km and p.lifecycle.knowledge is km
        assert km.store is p.store and km.gateway is p.gateway
        assert p.encoder._redis is p.redis_bin  # the query-embedding cache: the bytes client
        assert p.policy.model == p.encoder.name and p.router.policy_status()["encoder_model"]
        assert p.router.l3_collection == settings.collection_main
        assert p.store.info(settings.collection_main) is not None  # collections ensured
        assert p.opened == ["redis provider", "vector store", "trace writer", "router"]
    finally:
        p.close()


def test_fail_fast_clients_use_the_service_timeouts(settings: Settings) -> None:
    s = _with(settings, service_redis_timeout_s=0.2, service_redis_connect_timeout_s=0.3)
    with build_platform(s, with_knowledge=False, fail_fast_redis=True) as p:
        for client in (p.redis, p.redis_bin, p.wm._client, p.namespaces._r):
            kw = client.connection_pool.connection_kwargs
            assert (kw["socket_timeout"], kw["socket_connect_timeout"]) == (0.2, 0.3)
        assert p.provider.socket_timeout == 0.2
        assert p.redis is not p.provider.client()  # not the provider's relaxed pool
        assert p.opened == ["redis provider", "redis client", "redis client (bytes)"]


# --- closing --------------------------------------------------------------------------------


def test_close_releases_in_reverse_order_and_goes_on_after_a_failure(
    settings: Settings,
) -> None:
    p = build_platform(settings, with_knowledge=False, fail_fast_redis=True)
    router = p.router
    assert p.opened == ["redis provider", "redis client", "trace writer", "router"]

    def broken() -> None:
        raise RuntimeError("close failed")

    p._track("broken part", broken)
    calls = _record_closing(p)
    p.close()
    assert calls == ["broken part", "router", "trace writer", "redis client", "redis provider"]
    assert router._pool._shutdown  # the L3 pool is stopped
    assert p.provider._clients == {}
    assert p.opened == []
    p.close()  # twice is fine
    assert calls == ["broken part", "router", "trace writer", "redis client", "redis provider"]


def test_services_close_the_platform(settings: Settings) -> None:
    from context_app.service.deps import build_services

    svc = build_services(settings, echo_dev_key=False)
    calls = _record_closing(svc.platform)
    opened = list(svc.platform.opened)
    # the service's parts are the platform's, read as plain attributes
    assert svc.router is svc.platform.router and svc.wm is svc.platform.wm
    assert svc.owners._r is svc.platform.redis
    svc.close()
    assert calls == list(reversed(opened))
    assert opened[0] == "redis provider" and opened[-1] == "router"


def test_service_container_is_typed() -> None:
    """The done-when check of issue 13: no ``Any`` in the service's dependency container."""
    assert "Any" not in (ROOT / "context_app" / "service" / "deps.py").read_text("utf-8")
    assert not [n for n, t in Services.__annotations__.items() if "Any" in str(t)]


# --- failing parts --------------------------------------------------------------------------


@pytest.mark.parametrize("fail_fast", [False, True])
def test_unreachable_redis_closes_what_was_opened(settings: Settings, fail_fast: bool) -> None:
    s = _with(settings, redis_url=UNREACHABLE)
    p = build_platform(s, with_knowledge=False, fail_fast_redis=fail_fast)
    t0 = time.perf_counter()
    with pytest.raises(BackendUnavailableError, match=r"did not answer PING.*CTX_REDIS_URL"):
        p.open()
    assert p.opened == []
    assert p.provider._clients == {}
    if fail_fast:  # the service's timeouts bound the failure
        assert time.perf_counter() - t0 < 2.0
    with pytest.raises(BackendUnavailableError):
        build_platform(s, with_knowledge=False, eager=True)


def test_bad_qdrant_path_closes_redis_and_names_the_setting(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.qdrant_dir.write_text("not a directory", encoding="utf-8")
    p = build_platform(settings)
    with pytest.raises(BackendUnavailableError, match="CTX_DATA_DIR") as info:
        p.open()
    assert isinstance(info.value.__cause__, OSError)  # the driver's error, kept as the cause
    assert p.opened == []  # Redis (opened first) was closed again
    assert "provider" in p.__dict__ and p.provider._clients == {}


# --- one wiring -------------------------------------------------------------------------------

# Classes wired only by the composition root: constructing one (or calling its
# ``from_settings``) anywhere else is hand wiring. Tests build them directly on purpose, and a
# class's own module may (``cls(...)`` is not named here anyway).
WIRED_ONCE = {
    "ContextRouter": "context_core/routing/router.py",
    "WorkingMemory": "context_core/working_memory/memory.py",
    "KnowledgeMemory": "context_core/knowledge/memory.py",
    "LifecycleManager": "context_core/lifecycle/manager.py",
    "NamespaceRegistry": "context_core/access/namespaces.py",
    "TraceWriter": "context_core/traces.py",
}
ROOT_MODULE = "context_core/platform.py"
SCANNED = ("context_core", "context_app", "evaluation", "loadtests", "benchmarks", "dags")


def _hand_wiring(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in WIRED_ONCE:
            found.append((node.lineno, f"{f.id}("))
        elif (
            isinstance(f, ast.Attribute)
            and f.attr == "from_settings"
            and isinstance(f.value, ast.Name)
            and f.value.id in WIRED_ONCE
        ):
            found.append((node.lineno, f"{f.value.id}.from_settings("))
    return found


def test_the_library_is_wired_in_one_place() -> None:
    offenders = []
    for pkg in SCANNED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == ROOT_MODULE:
                continue
            for line, call in _hand_wiring(path.read_text("utf-8")):
                cls = call.split("(")[0].split(".")[0]
                if WIRED_ONCE[cls] != rel:
                    offenders.append(f"{rel}:{line}: {call}")
    assert not offenders, "wire these through context_core.platform.build_platform:\n" + "\n".join(
        offenders
    )
    # and the root does wire each of them
    wired = {
        c.split("(")[0].split(".")[0] for _, c in _hand_wiring((ROOT / ROOT_MODULE).read_text())
    }
    assert wired == set(WIRED_ONCE)


def test_the_wiring_check_catches_hand_wiring() -> None:
    code = (
        "wm = WorkingMemory(client, gw)\n"
        "life = LifecycleManager.from_settings(s, wm=wm, gateway=gw)\n"
        "r = context_core.routing.router.ContextRouter\n"  # naming the class is not constructing it
    )
    assert _hand_wiring(code) == [(1, "WorkingMemory("), (2, "LifecycleManager.from_settings(")]


def test_library_defaults_come_from_one_place() -> None:
    """Classes built without settings (tests, scripts) get the Settings defaults."""
    import inspect

    s = SimpleNamespace(**{k: f.default for k, f in Settings.model_fields.items()})
    assert Gateway().max_response_bytes == s.max_response_bytes == defaults.MAX_RESPONSE_BYTES

    wm = inspect.signature(WorkingMemory).parameters
    assert wm["default_ttl_s"].default == s.wm_default_ttl_s
    assert wm["series_window"].default == s.wm_series_window
    assert wm["min_ttl_s"].default == s.wm_min_ttl_s
    assert wm["max_step_bytes"].default == s.max_step_result_bytes
    assert wm["contract_ttl_s"].default == s.wm_contract_ttl_s
    assert wm["contract_history_ttl_s"].default == s.wm_contract_history_ttl_s
    assert wm["idle_s"].default == s.session_idle_s
    router = inspect.signature(ContextRouter).parameters
    assert router["l3_timeout_ms"].default == s.l3_timeout_ms
    assert router["max_fragments"].default == s.bundle_max_fragments
    from context_core.lifecycle.manager import LifecycleManager
    from context_core.routing.confidence import ConfidencePolicy

    assert (ConfidencePolicy().accept, ConfidencePolicy().skip) == (
        s.accept_threshold,
        s.skip_threshold,
    )
    life = inspect.signature(LifecycleManager).parameters
    assert life["max_trace_tokens"].default == s.l1_max_trace_tokens
    assert life["correction_min_confidence"].default == s.correction_min_confidence


# --- the thresholds' model without the encoder ------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "recorded", "expected"),
    [
        ("onnx-int8", None, "minilm+onnx-int8"),  # no collection yet: what the setting builds
        ("torch", None, "minilm"),
        ("auto", "minilm", "minilm"),  # auto follows the collection: a torch-built one
        ("auto", "minilm+onnx-int8", "minilm+onnx-int8"),
    ],
)
def test_policy_without_knowledge_checks_the_encoder_the_collections_were_built_with(
    settings: Settings, backend: str, recorded: str | None, expected: str
) -> None:
    """The health report opens a platform without the model; its thresholds check must name
    the encoder the router serves with (``ctx run``'s report refused thresholds calibrated on
    ``minilm+onnx-int8`` as made for another model before this)."""
    s = _with(settings, embed_model="minilm", embed_backend=backend,
              collection_main=f"pol-{uuid.uuid4().hex[:8]}")  # fmt: skip
    with build_platform(s, with_knowledge=False) as p:
        if recorded is not None:
            p.store.create_collection(s.collection_main, dim=384, model=recorded)
        assert p.policy.model == expected
