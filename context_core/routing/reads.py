"""Exact-key context reads for a route: L1 session fields, L2 working-memory keys, namespaces.

Split out of :mod:`context_core.routing.router` because these reads share one shape (look a key up,
record it in the route's trace dict, wrap the value in an ``"exact"`` :class:`Fragment`) and
none of them needs the router's L3 machinery. The router owns the trace dicts and passes
them in.

Expired vs never written is decided in Redis, not in process memory: a missing session key is
traced ``expired`` when :meth:`SessionMemory.key_expired` says this session wrote it and it is
gone, so every router process (or service worker) over the same Redis gives the same answer.
Preferences (``pref`` keys, per user, no TTL) are never ``expired``, only missing.

Round trips: the L2 and preference reads are operations (:mod:`context_core.redis.ops`) and
the namespace reads hand back their commands, so the router sends all of a route's reads,
with its touch, in one round trip (a second one only for the "was it ever written?" check of
keys that missed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from context_core.errors import AccessDeniedError, ContextError, ContextMissError
from context_core.redis.ops import Cmd, Op, ok
from context_core.routing.bundle import Fragment, hours_since
from context_core.routing.intents import (
    ALL_PREFERENCES,
    IntentSpec,
    L2KeySpec,
    TemplateParamError,
    fill,
)
from context_core.working_memory.keys import session_prefix

if TYPE_CHECKING:
    from context_core.access.namespaces import NamespaceRegistry
    from context_core.session.state import SessionState
    from context_core.working_memory import SessionMemory, WorkingMemory

__all__ = ["L2Trace", "NsRead", "read_l1", "read_l2", "read_namespaces", "read_prefs"]

#: The route's ``l2`` trace block: key lists plus ``contract_lost`` (bool).
L2Trace = dict[str, Any]

_SERIES_IN_BUNDLE = 60  # newest points handed to the agent; the count says how many exist


def read_l1(
    state: SessionState, spec: IntentSpec, now: float, used: dict[str, Any] | None = None
) -> list[Fragment]:
    """The spec's session fields as exact fragments; empty/absent fields are left out
    (their names are appended to ``used["l1"]`` when ``used`` is given)."""
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
        if used is not None:
            used["l1"].append(name)
    return out


def _request(l2_trace: L2Trace, key: str, key_spec: L2KeySpec) -> None:
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
    l2_trace: L2Trace,
) -> Op[tuple[Fragment | None, ContextMissError | None]]:
    """Operation (:mod:`context_core.redis.ops`): one session L2 key: its fragment, or the
    miss (traced ``expired`` when Redis says this session wrote the key and it is gone,
    :meth:`SessionMemory.key_expired`: a second round, for misses only)."""
    try:
        ident = fill(key_spec.ident, values)
    except TemplateParamError as e:
        key = f"{session_prefix(sm.session_id)}{key_spec.kind}:<{key_spec.ident}>"
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
        if key_spec.kind in ("api", "step"):
            loaded = yield from (sm.string_op(key) if key_spec.kind == "api" else sm.hash_op(key))
            content, stored_at = loaded.value, loaded.stored_at
        elif key_spec.kind == "series":
            points = yield from sm.series_op(ident)
            if not points:
                raise ContextMissError(key)
            content = {
                "points": len(points),
                "newest": points[-1],
                "series": points[-_SERIES_IN_BUNDLE:],
            }
            stored_at = points[-1][0]
        elif key_spec.kind == "contract":
            contract = yield from sm.contract_op()
            if contract.version == 0:
                raise ContextMissError(key)
            content = {
                "version": contract.version,
                "fields": contract.fields,
                "corrected": contract.corrected,
                "locked": contract.locked,
                "status": contract.status,
            }
            stored_at = contract.updated_at
        else:  # pref keys are per user: read_prefs
            raise ValueError(f"read_l2 cannot read {key_spec.kind!r} keys")
    except ContextMissError as e:
        l2_trace["missing"].append(key)
        if (yield from sm.key_expired_op(key)):
            l2_trace["expired"].append(key)
        return None, e
    l2_trace["found"].append(key)
    frag = Fragment("L2", f"L2:{key}", content, 1.0, hours_since(stored_at, now), 1.0, "exact")
    return frag, None


def read_prefs(
    wm: WorkingMemory,
    org_id: str,
    user_id: str,
    key_spec: L2KeySpec,
    values: Mapping[str, Any],
    now: float,
    l2_trace: L2Trace,
) -> Op[tuple[list[Fragment], ContextMissError | None]]:
    """Operation: the session user's preferences: one type, or all of them (ident ``*``).

    Traced under the preference key (``pref:{<org>:<uid>}:<type>``, or ``...:*`` for all,
    found when the user has at least one). Each preference is a fragment
    ``L2:pref:{<org>:<uid>}:<type>`` with ``{value, confidence, last_updated}``, relevance and
    confidence = its confidence, label ``"preference"``; "all" comes most confident first.
    """
    placeholder = f"pref:<{key_spec.ident}>"
    try:
        prefs = wm.preferences(org_id, user_id)
        placeholder = f"{prefs.prefix}<{key_spec.ident}>"
        ident = (
            key_spec.ident if key_spec.ident == ALL_PREFERENCES else fill(key_spec.ident, values)
        )
    except (TemplateParamError, ContextError) as e:
        _request(l2_trace, placeholder, key_spec)
        l2_trace["missing"].append(placeholder)
        return [], ContextMissError(placeholder, str(e))
    try:
        if ident == ALL_PREFERENCES:
            key = prefs.prefix + ALL_PREFERENCES
            _request(l2_trace, key, key_spec)
            every = yield from prefs.all_op()
            found = sorted(every.values(), key=lambda p: (-p.confidence, p.type))
            if not found:
                raise ContextMissError(key, "the user has no preferences yet")
        else:
            key = prefs.key(ident)
            _request(l2_trace, key, key_spec)
            found = [(yield from prefs.get_op(ident))]
    except ContextMissError as e:
        l2_trace["missing"].append(key)
        return [], e
    except ContextError as e:  # an invalid preference type
        _request(l2_trace, placeholder, key_spec)
        l2_trace["missing"].append(placeholder)
        return [], ContextMissError(placeholder, str(e))
    l2_trace["found"].append(key)
    frags = [
        Fragment(
            "L2",
            f"L2:{prefs.key(p.type)}",
            {"value": p.value, "confidence": p.confidence, "last_updated": p.last_updated},
            p.confidence,
            hours_since(p.last_updated, now),
            p.confidence,
            "preference",
        )
        for p in found
    ]
    return frags, None


#: What :func:`read_namespaces` hands back per shared-namespace entry.
NsRead = tuple[Fragment | None, AccessDeniedError | None]


def read_namespaces(
    namespaces: NamespaceRegistry | None,
    spec: IntentSpec,
    values: Mapping[str, Any],
    agent_id: str | None,
    now: float,
    ns_trace: dict[str, list[str]],
) -> tuple[list[Cmd], Callable[[list[Any]], list[NsRead]]]:
    """Shared-namespace reads as the agent, for the caller's own round trip: the commands
    (every entry's ACL line and value, :meth:`NamespaceRegistry.entry_read`) and the function
    that takes their replies, decides, traces and returns a ``(fragment, denial)`` per entry
    found or refused; a denial is returned only for a required entry. Nothing is traced or
    audited until that function runs, so a caller that ends up not wanting the entries (a
    required L2 key is missing) drops the replies and it is as if nothing was read."""
    if namespaces is None:
        return [], lambda _replies: []
    planned: list[tuple[Any, str, int, int, Callable[[list[Any]], Any]]] = []
    wanted: list[Cmd] = []
    for ns in spec.namespaces:
        try:
            key = fill(ns.key, values)
        except TemplateParamError:
            continue  # nothing to look up yet (e.g. no device): not requested
        cmds, decide = namespaces.entry_read(
            ns.namespace, key, agent_id=agent_id, purpose=ns.purpose
        )
        planned.append((ns, f"{ns.namespace}/{key}", len(wanted), len(wanted) + len(cmds), decide))
        wanted.extend(cmds)

    def interpret(replies: list[Any]) -> list[NsRead]:
        out: list[NsRead] = []
        for ns, ref, start, end, decide in planned:
            ns_trace["requested"].append(ref)
            try:
                entry = decide(ok(replies[start:end]))
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

    return wanted, interpret
