"""A scripted agent session through all three layers: the README's end-to-end demonstration.

A pump-vibration investigation, as an agent framework would drive it: lifecycle events change
the layers, the router builds a provenanced bundle before each step, and the "agent" (scripted
here) writes an output that cites its context, so the traces feed the CER evaluation.

    session_start -> fetch_sensor_data -> tool_call -> compare_vibration -> tool_call
    -> call_api -> tool_call -> user_correction -> generate_report -> goal_achieved

Use :func:`run_demo` from code (the main job calls it after ingestion) or ``ctx session-demo``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.access.namespaces import Grant
from context_core.platform import Platform, build_platform
from context_core.routing.router import ContextBundle

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.lifecycle.manager import LifecycleManager
    from context_core.routing.router import ContextRouter
    from context_core.traces import TraceWriter

__all__ = ["DEVICE", "DemoResult", "DemoStep", "run_demo"]

DEVICE = "PUMP-0042"
AGENT = "demo-agent"
FLEET_NS = "fleet"
USER_QUERY = (
    f"{DEVICE} has been vibrating hard since 06:00. Find the cause and write a short "
    "maintenance report."
)


@dataclass(frozen=True)
class DemoStep:
    """One routed step: the bundle the agent got and the output it wrote."""

    intent: str
    bundle: ContextBundle
    output: str


@dataclass
class DemoResult:
    session_id: str
    steps: list[DemoStep] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    knowledge_points: int | None = None
    traces_dir: Path | None = None


def _cite(bundle: ContextBundle) -> str:
    """What a well-behaved agent appends: the keys and point ids it relied on.

    CER counts these as use (they are the fragments' citable tokens in the trace), next to
    the values the output repeats (device id, readings, limits, dates).
    """
    used = bundle.context_used
    refs = [*used.get("l2", []), *used.get("ns", []), *used.get("l3", [])]
    return "sources: " + ", ".join(refs) if refs else "sources: session state only"


def _l3_pages(bundle: ContextBundle) -> str:
    pages = dict.fromkeys(str(f.content.get("page", "")) for f in bundle.by_layer("L3"))
    return ", ".join(p for p in pages if p) or "no manual page above threshold"


def run_demo(
    settings: Settings,
    *,
    platform: Platform | None = None,
    session_id: str | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    on_bundle: Callable[[DemoStep], None] | None = None,
    on_start: Callable[[int | None], None] | None = None,
) -> DemoResult:
    """Run the scripted session; returns every bundle.

    ``platform`` None means: build one from ``settings`` (the configured stores: Qdrant Edge
    + MiniLM by default) and close it at the end; pass one to reuse the caller's (e.g. the
    main job's after ingestion), which stays open. The route's L3 budget is
    ``settings.l3_timeout_ms`` (of the platform's settings when one is given).
    """
    own = platform is None
    p = platform if platform is not None else build_platform(settings)
    try:
        return _run(p, on_event=on_event, on_bundle=on_bundle, on_start=on_start, sid=session_id)
    finally:
        if own:
            p.close()


def _run(
    p: Platform,
    *,
    sid: str | None,
    on_event: Callable[[str, dict[str, Any]], None] | None,
    on_bundle: Callable[[DemoStep], None] | None,
    on_start: Callable[[int | None], None] | None,
) -> DemoResult:
    knowledge = p.knowledge
    # The first forward pass of a freshly loaded model is several times slower than the
    # rest; pay it here rather than inside the first route's 100 ms L3 budget.
    p.warm_up()
    sid = sid or f"demo-{uuid.uuid4().hex[:8]}"
    result = DemoResult(session_id=sid, traces_dir=p.settings.traces_dir)
    result.knowledge_points = knowledge.stats().get(knowledge.main)
    if on_start:
        on_start(result.knowledge_points)
    _share_fleet_baseline(p)
    script = _Script(result, p.tracer, p.router, p.lifecycle, on_event, on_bundle)
    state, rms = _diagnose(script)
    _report(script, state, rms)
    return result


def _share_fleet_baseline(p: Platform) -> None:
    """A fleet namespace the agent may read, holding the pumps' vibration baseline."""
    ns = p.namespaces
    ns.create(
        FLEET_NS,
        ttl_s=3600,
        acl={"fleet-etl": Grant(frozenset({"*"}), write=True)},
    )
    ns.grant(FLEET_NS, AGENT, ["diagnostics", "reporting"])
    ns.write(
        FLEET_NS,
        "baseline:PUMP",
        {"rms_mm_s_p50": 2.1, "rms_mm_s_p95": 3.4, "fleet_size": 37},
        agent_id="fleet-etl",
        purpose="baseline-refresh",
    )


@dataclass
class _Script:
    """The scripted agent's two moves: apply a lifecycle event, route a step and answer it."""

    result: DemoResult
    tracer: TraceWriter
    router: ContextRouter
    lifecycle: LifecycleManager
    on_event: Callable[[str, dict[str, Any]], None] | None = None
    on_bundle: Callable[[DemoStep], None] | None = None

    def event(self, ev: str, state: Any, /, **payload: Any) -> Any:
        res = self.lifecycle.apply(ev, state, **payload)
        self.result.events.append((ev, res.effects))
        if self.on_event:
            self.on_event(ev, res.effects)
        return res.state

    def step(
        self, state: Any, intent: str, output: Callable[[ContextBundle], str], /, **params: Any
    ) -> ContextBundle:
        bundle = self.router.route(state, intent, params=params, agent_id=AGENT)
        text = output(bundle)
        self.tracer.record_output(bundle.trace_id, self.result.session_id, bundle.step, text)
        s = DemoStep(intent, bundle, text)
        self.result.steps.append(s)
        if self.on_bundle:
            self.on_bundle(s)
        return bundle


def _diagnose(script: _Script) -> tuple[Any, float]:
    """Session start, the sensor fetch and the comparison; the state and the latest RMS."""
    event, step = script.event, script.step
    state = event(
        "session_start",
        None,
        session_id=script.result.session_id,
        user_id="demo-user",
        user_query=USER_QUERY,
        contract={"device": DEVICE, "report_length": "short"},
        device_id=DEVICE,
    )
    # Step 0: what do we already know about the sensors? (nothing yet: the series is an
    # optional miss, the contract is there.) The agent names the device and the contract.
    step(
        state,
        "fetch_sensor_data",
        lambda b: (
            f"No vibration series cached for {DEVICE} yet; fetching the last 1h under "
            f"the task contract. {_cite(b)}"
        ),
    )
    now = time.time()
    series = [(now - 60 * (11 - i), round(2.3 + 0.27 * i, 2)) for i in range(12)]
    rms = series[-1][1]
    state = event(
        "tool_call",
        state,
        name="sensors/vibration",
        args={"device": DEVICE, "window": "last 1h"},
        result={"rms_mm_s": rms, "peak_hz": 49.6, "points": len(series)},
        series={f"{DEVICE}.vibration": series},
    )
    # Step 1: compare live vibration with the manual's limits and the fleet baseline.
    step(
        state,
        "compare_vibration",
        lambda b: (
            f"{DEVICE} RMS {rms} mm/s over the last 1h is above the alarm "
            f"limit (manual: {_l3_pages(b)}) and the fleet p95 of 3.4 mm/s. {_cite(b)}"
        ),
    )
    state = event(
        "tool_call",
        state,
        name="analysis/compare",
        args={"device": DEVICE, "limit": "manual"},
        result={"verdict": "above alarm", "rms_mm_s": rms, "fleet_p95": 3.4},
    )
    return state, rms


def _report(script: _Script, state: Any, rms: float) -> None:
    """The maintenance history, the user's correction, the report and the confirmed answer."""
    event, step = script.event, script.step
    # Step 2: maintenance history through a tool API (a cached response would be reused).
    history_args = {"device": DEVICE}
    step(
        state,
        "call_api",
        lambda b: (
            f"No cached maintenance/history response for {DEVICE}; calling the API. {_cite(b)}"
        ),
        endpoint="maintenance/history",
        api_params=history_args,
    )
    state = event(
        "tool_call",
        state,
        name="maintenance/history",
        args=history_args,
        result={"last_service": "2026-08-14", "bearing_hours": 17400, "seal": "ok"},
    )
    # The user corrects the brief: one page, with bearing history.
    state = event(
        "user_correction",
        state,
        fields={"report_length": "one page", "include_bearing_history": True},
    )
    # Step 3: the report.
    step(
        state,
        "generate_report",
        lambda b: (
            f"Report for {DEVICE}: RMS {rms} mm/s above alarm; bearing at 17400 h "
            f"since the 2026-08-14 service: replace the drive-end bearing. Template: "
            f"{_l3_pages(b)}. {_cite(b)}"
        ),
    )
    event(
        "goal_achieved",
        state,
        answers=[
            {
                "text": (
                    f"{DEVICE}: RMS vibration rising to {rms} mm/s above the "
                    "4.5 mm/s alarm with bearing hours over 17,000 pointed to drive-end "
                    "bearing wear; replacing the bearing was confirmed as the fix."
                ),
                "source": "confirmed-answer:pump-vibration-bearing",
                "title": "Resolved: pump vibration from bearing wear",
            }
        ],
    )


def bundle_rows(bundle: ContextBundle, width: int = 70) -> list[tuple[str, ...]]:
    """Rows for a provenance table: layer, source, label, confidence, freshness, content."""
    rows: list[tuple[str, ...]] = []
    for f in bundle.fragments:
        content = f.content.get("text") if isinstance(f.content, dict) else None
        text = content or json.dumps(f.content, ensure_ascii=False, default=str)
        text = " ".join(text.split())
        if f.note:
            text = f"[{f.note}] {text}"
        rows.append(
            (
                f.layer,
                f.source,
                f.label,
                f"{f.confidence:.3f}",
                "?" if f.freshness_hours < 0 else f"{f.freshness_hours:.2f}",
                text if len(text) <= width else text[: width - 1] + "…",
            )
        )
    return rows
