"""Exact-key context reads for a route: L1 session fields, L2 working-memory keys, namespaces.

Split out of :mod:`context_core.router` because these reads share one shape (look a key up,
record it in the route's trace dict, wrap the value in an ``"exact"`` :class:`Fragment`) and
none of them needs the router's L3 machinery. The router owns the trace dicts and the
"seen before" memory and passes them in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from context_core.bundle import Fragment, hours_since
from context_core.errors import AccessDeniedError, ContextMissError
from context_core.intents import IntentSpec, L2KeySpec, TemplateParamError, fill

if TYPE_CHECKING:
    from context_core.namespaces import NamespaceRegistry
    from context_core.session import SessionState
    from context_core.working_memory import SessionMemory

__all__ = ["read_l1", "read_l2", "read_namespaces"]

_SERIES_IN_BUNDLE = 60  # newest points handed to the agent; the count says how many exist


def read_l1(
    state: SessionState, spec: IntentSpec, now: float, used: dict[str, Any]
) -> list[Fragment]:
    """The spec's session fields as exact fragments; empty/absent fields are left out."""
    out = []
    for name in spec.l1_fields:
        value: Any = getattr(state, name, None)
        fresh = 0.0
        if name == "user_query":
            fresh = hours_since(state.start_time, now)
        elif name == "trace":
            if not value:
                continue
            value = [
                {"kind": i.kind, "name": i.name, "call_id": i.call_id, "payload": i.payload}
                for i in value
            ]
            fresh = hours_since(state.trace[-1].ts, now)
        elif name == "last_api_result" and value is not None:
            value = {"status": value.status, "data_sha256": value.data_sha256}
        if value is None:
            continue
        out.append(Fragment("L1", f"L1:session.{name}", value, 1.0, fresh, 1.0, "exact"))
        used["l1"].append(name)
    return out


def _request(l2_trace: dict[str, list[str]], key: str, key_spec: L2KeySpec) -> None:
    """Trace a requested key; ``required`` tells CER which misses are loading failures."""
    l2_trace["requested"].append(key)
    if key_spec.required:
        l2_trace["required"].append(key)


def read_l2(
    sm: SessionMemory,
    key_spec: L2KeySpec,
    values: Mapping[str, Any],
    params: Mapping[str, Any],
    now: float,
    l2_trace: dict[str, list[str]],
    was_seen: Callable[[str, str], bool],
) -> tuple[Fragment | None, ContextMissError | None]:
    """One L2 key: its fragment, or the miss (traced ``expired`` if ``was_seen`` knew the key)."""
    try:
        ident = fill(key_spec.ident, values)
    except TemplateParamError as e:
        key = f"wm:{{{sm.session_id}}}:{key_spec.kind}:<{key_spec.ident}>"
        _request(l2_trace, key, key_spec)
        l2_trace["missing"].append(key)
        return None, ContextMissError(key, str(e))
    if key_spec.kind == "api":
        api_params = params.get("api_params") or {}
        key = sm.api_key(ident, api_params)
    else:
        key = sm.key(key_spec.kind, ident)
    _request(l2_trace, key, key_spec)
    content: Any
    stored_at: float | None
    try:
        if key_spec.kind == "api":
            loaded = sm.get_api_response(ident, api_params)
            content, stored_at = loaded.value, loaded.stored_at
        elif key_spec.kind == "step":
            loaded = sm.get_step_result(ident)
            content, stored_at = loaded.value, loaded.stored_at
        elif key_spec.kind == "series":
            points = sm.series(ident)
            if not points:
                raise ContextMissError(key)
            content = {
                "points": len(points),
                "newest": points[-1],
                "series": points[-_SERIES_IN_BUNDLE:],
            }
            stored_at = points[-1][0]
        else:  # contract
            contract = sm.contract()
            if contract.version == 0:
                raise ContextMissError(key)
            content = {
                "version": contract.version,
                "fields": contract.fields,
                "corrected": contract.corrected,
                "locked": contract.locked,
            }
            stored_at = contract.updated_at
    except ContextMissError as e:
        l2_trace["missing"].append(key)
        if was_seen(sm.session_id, key):
            l2_trace["expired"].append(key)
        return None, e
    l2_trace["found"].append(key)
    frag = Fragment("L2", f"L2:{key}", content, 1.0, hours_since(stored_at, now), 1.0, "exact")
    return frag, None


def read_namespaces(
    namespaces: NamespaceRegistry | None,
    spec: IntentSpec,
    values: Mapping[str, Any],
    agent_id: str | None,
    now: float,
    ns_trace: dict[str, list[str]],
) -> list[tuple[Fragment | None, AccessDeniedError | None]]:
    """Shared-namespace reads as the agent; a denial is returned only for a required entry."""
    if namespaces is None:
        return []
    out: list[tuple[Fragment | None, AccessDeniedError | None]] = []
    for ns in spec.namespaces:
        try:
            key = fill(ns.key, values)
        except TemplateParamError:
            continue  # nothing to look up yet (e.g. no device): not requested
        ref = f"{ns.namespace}/{key}"
        ns_trace["requested"].append(ref)
        try:
            entry = namespaces.read_entry(ns.namespace, key, agent_id=agent_id, purpose=ns.purpose)
        except AccessDeniedError as e:
            ns_trace["denied"].append(ref)
            out.append((None, e if ns.required else None))
            continue
        except ContextMissError:
            continue
        ns_trace["found"].append(ref)
        frag = Fragment(
            "NS",
            f"NS:{entry.redis_key}",
            entry.value,
            1.0,
            hours_since(entry.stored_at, now),
            1.0,
            "exact",
        )
        out.append((frag, None))
    return out
