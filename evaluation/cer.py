"""Context Effectiveness Rate (CER) from router traces.

CER = steps whose context was correctly **loaded** AND correctly **used** / all routed steps.

Loaded (from the ``route`` record, schema in :mod:`context_core.traces`):

* every **required** L2 key was found: none of ``l2.required`` is in ``l2.missing`` (a key
  also listed in ``l2.expired`` is reported as expired: it existed earlier in the session and
  decayed before the step needed it). Keys the intent only asked for opportunistically
  (requested but not required, e.g. the sensor series before it was fetched, a cached API
  response) are not loading failures: a miss becomes an info note on the verdict
  (``l2_optional_missing`` / ``l2_optional_expired``). Schema-1 records have no
  ``l2.required``; there every requested key counts as required, as it did then.
* the task contract was not lost (schema 3, ``l2.contract_lost``): the intent asked for the
  task contract and this session's contract had expired. The contract key is optional for
  every built-in intent (a session may not have one yet), so a plain miss is only a note; but
  a *live session that lost its contract* has lost the user's goal and constraints, and
  silently so, which is exactly the failure CER exists to catch: the step fails loading with
  reason ``contract_lost`` (and no ``l2_optional_expired`` note for that key).
* when the intent asked for L3 (``l3.requested``): no L3 error and at least one hit scoring at
  or above ``accept``.

``accept`` is the threshold the route itself used when the record carries it (schema 3,
``confidence.accept``: the thresholds in force at that moment, which may have been reloaded
since); the ``accept`` passed to :func:`judge_steps` applies to older records.

Used (from the ``step_output`` record with the same ``trace_id``): a rule-based matcher finds
a value of the step's context in the agent's output. The step's context, as the trace carries
it: the L3 query, hit sources and sections, fragment sources, namespace refs, each fragment's
citable tokens (``fragments[].cites``, schema 2: its key or point id, ids and rounded numbers
from its value), plus any ``context_values`` the caller passes (e.g. a bundle's
``context_used``). L3 fragments below ``accept`` and hits below ``accept`` give no citable
values: citing a for-reference chunk is not evidence the trusted context was used. When the
route rendered a prompt (the record's ``prompt``, :mod:`context_core.routing.prompts`), the
fragments' citable values are those of the fragments its fields bound (status ``bound``): the
same bindings the model saw, so a value the prompt left out, or showed with the
"for reference only" notice, is not evidence of use.

A :class:`UseRule` is a regex (case-sensitive unless it says ``(?i)``; comparing with the
output ignores case and spacing); with ``require_in_context`` (default) it first collects the
pattern's matches in the step's context and is satisfied when the output cites one of them. A
rule whose pattern finds nothing in the context does not apply. With
``require_in_context=False`` the rule is satisfied by any match in the output (e.g. "cites
some ISO standard"). The built-in rule ``cites_source`` is satisfied when the output contains
one of the citable values as a whole token (``3.4`` does not match inside ``13.45``). A step
is used when at least one applicable rule is satisfied.

A step whose output cites none of its context fails with ``not_cited`` (naming the rules it
was checked by). A step whose context holds nothing citable at all (no rule applies and no
citable value exists) fails with ``not_checkable``: it stays in the denominator, as issue
#5 defines CER over all steps, and :attr:`Rate.n_not_checkable` counts such steps so a low
CER from uncheckable steps can be told apart from one caused by unused context.

Every verdict carries reasons, so a failing step says why (``l2_expired: wm:{s}:step:x``),
and info ``notes`` that explain without failing it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from context_core.errors import DataValidationError

__all__ = [
    "DEFAULT_RULES",
    "CerReport",
    "Rate",
    "StepVerdict",
    "UseRule",
    "cer_report",
    "compute_cer",
    "judge_steps",
    "load_rules",
    "load_step_records",
]


@dataclass(frozen=True, slots=True)
class UseRule:
    """A way of recognising that the output cites the context (see module docstring)."""

    name: str
    pattern: str
    intents: frozenset[str] | None = None  # None: applies to every intent
    require_in_context: bool = True

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"use rule {self.name!r}: invalid regex {self.pattern!r}: {e}") from e

    def applies_to(self, intent: str) -> bool:
        return self.intents is None or intent in self.intents


CITES_SOURCE = "cites_source"
NOT_CHECKABLE = "not_checkable"

DEFAULT_RULES: tuple[UseRule, ...] = (
    UseRule("standard", r"\b(?:ISO|IEC|API|ANSI|DIN|GB/T|GB)\s?\d{3,5}(?:[-.:]\d+)*"),
    UseRule("device_id", r"\b[A-Z]{2,6}-\d{2,6}\b"),
    UseRule(
        "alert_window",
        r"\b\d{1,2}:\d{2}\s*(?:-|–|to)\s*\d{1,2}:\d{2}\b|\b(?:last|past)\s+\d+\s*(?:min|minutes|h|hours)\b",
    ),
)


def load_rules(path: Path | str) -> tuple[UseRule, ...]:
    """Rules from JSON: ``[{"name", "pattern", "intents"?: [...], "require_in_context"?}]``."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DataValidationError(f"rules file {path} cannot be read as JSON: {e}") from e
    if not isinstance(raw, list):
        raise DataValidationError(f"rules file {path} must hold a JSON list of rule objects")
    rules = []
    for i, item in enumerate(raw, start=1):
        if not isinstance(item, dict) or not {"name", "pattern"} <= item.keys():
            raise DataValidationError(f"rules file {path}: rule {i} needs 'name' and 'pattern'")
        intents = item.get("intents")
        try:
            rules.append(
                UseRule(
                    name=str(item["name"]),
                    pattern=str(item["pattern"]),
                    intents=frozenset(intents) if intents else None,
                    require_in_context=bool(item.get("require_in_context", True)),
                )
            )
        except ValueError as e:
            raise DataValidationError(f"rules file {path}: rule {i}: {e}") from e
    return tuple(rules)


# --- per-step verdicts -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """Whether one routed step's context was loaded and used, and why not."""

    trace_id: str
    loaded: bool
    used: bool
    reasons: tuple[str, ...]
    session_id: str = ""
    intent: str = ""
    step: int = 0
    ts: str = ""
    rules_matched: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # info only (e.g. an optional L2 key missing): not failures
    calibration: str = ""  # confidence.version of the route ("" : defaults / unversioned)

    @property
    def checkable(self) -> bool:
        return not any(r.startswith(NOT_CHECKABLE) for r in self.reasons)

    @property
    def effective(self) -> bool:
        return self.loaded and self.used

    @property
    def day(self) -> str:
        return _parse_ts(self.ts).date().isoformat()

    @property
    def week(self) -> str:
        y, w, _ = _parse_ts(self.ts).isocalendar()
        return f"{y}-W{w:02d}"


def _parse_ts(ts: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(ts)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _loaded_reasons(route: Mapping[str, Any], accept: float) -> tuple[list[str], list[str]]:
    """(failure reasons, info notes) for the loading half of the verdict."""
    reasons: list[str] = []
    notes: list[str] = []
    l2 = route.get("l2") or {}
    requested = list(l2.get("requested") or ())
    # Schema 1 has no "required": every requested key was treated as required then.
    required = set(l2["required"]) if "required" in l2 else set(requested)
    expired = set(l2.get("expired") or ())
    missing = set(l2.get("missing") or ())
    found = set(l2.get("found") or ())
    lost = bool(l2.get("contract_lost"))
    for key in requested:
        if key in found and key not in missing:
            continue
        if lost and key in expired and _is_contract(key):
            reasons.append(
                f"contract_lost: {key} expired while the session was live (the user's goal "
                "and constraints are gone)"
            )
        elif key not in required:
            state = "expired" if key in expired else "missing"
            notes.append(f"l2_optional_{state}: {key} (optional for this intent; not a failure)")
        elif key in expired:
            reasons.append(f"l2_expired: {key} expired before the step loaded it")
        else:
            reasons.append(f"l2_missing: {key} was never found")
    l3 = route.get("l3") or {}
    if l3.get("requested"):
        hits = l3.get("hits") or []
        if l3.get("error"):
            reasons.append(f"l3_error: {l3['error']}")
        elif not hits:
            reasons.append("l3_no_hits: L3 returned nothing")
        else:
            field, accept = _l3_signal(route, accept)
            best = max(float(h.get(field, h["score"])) for h in hits)
            if best < accept:
                what = "p_relevant" if field == "p_relevant" else "best hit"
                reasons.append(f"l3_below_accept: {what} {best:.3f} < accept {accept:.3f}")
    return reasons, notes


def _l3_signal(route: Mapping[str, Any], cosine_accept: float) -> tuple[str, float]:
    """(hit field, accept) the route's labels came from: ``p_relevant`` against the relevance
    model's accept when a fitted model labelled the hits, else the cosine ``score``."""
    l3 = route.get("l3") or {}
    conf = route.get("confidence")
    rel = conf.get("relevance") if isinstance(conf, Mapping) else None
    if l3.get("confidence_signal") == "p_relevant" and isinstance(rel, Mapping):
        value = rel.get("accept")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return "p_relevant", float(value)
    return "score", cosine_accept


def _is_contract(key: str) -> bool:
    """A session's current task contract key (``wm:{<sid>}:contract:current``), hashed or not."""
    return key.endswith(":contract:current")


def _version_of(route: Mapping[str, Any]) -> str:
    """The calibration version that labelled the route's hits ("" when none is named)."""
    conf = route.get("confidence")
    value = conf.get("version") if isinstance(conf, Mapping) else None
    return value if isinstance(value, str) else ""


def _accept_of(route: Mapping[str, Any], default: float) -> float:
    """The accept threshold the route used (schema 3 records carry it), else ``default``."""
    conf = route.get("confidence")
    if isinstance(conf, Mapping):
        value = conf.get("accept")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return default


def _context_texts(
    route: Mapping[str, Any], accept: float, extra: Mapping[str, Any] | None
) -> tuple[list[str], list[str]]:
    """(all context strings to search rule patterns in, citable values for ``cites_source``)."""
    l3 = route.get("l3") or {}
    texts = [str(l3.get("query") or "")]
    citable: list[str] = []
    field, hit_accept = _l3_signal(route, accept)
    for h in l3.get("hits") or []:
        texts += [str(h.get("source") or ""), str(h.get("section") or "")]
        if float(h.get(field, h.get("score", -1.0))) >= hit_accept and h.get("source"):
            citable.append(str(h["source"]))
    bound = _prompt_bound(route)
    for i, frag in enumerate(route.get("fragments") or []):
        texts.append(str(frag.get("source") or ""))
        if bound is not None and i not in bound:
            continue  # delivered but not bound into the step's prompt (or only with a notice)
        cites = [str(c) for c in frag.get("cites") or ()]
        if frag.get("layer") == "L3" and (
            frag.get("label") != "confident"  # the relevance model's label, not the cosine
            if field == "p_relevant"
            else float(frag.get("confidence", 0.0)) < accept
        ):
            continue  # for reference only: not what the step should rely on
        texts += cites
        citable += cites
    texts += [str(r) for r in (route.get("ns") or {}).get("found") or []]
    for value in _flatten(extra or {}):
        texts.append(value)
        citable.append(value)
    return [t for t in texts if t], list(dict.fromkeys(c for c in citable if len(c.strip()) >= 3))


def _prompt_bound(route: Mapping[str, Any]) -> set[int] | None:
    """The fragments the route's prompt bound plainly (status ``bound``; a ``notice`` value
    is for reference only), by index; None when the route rendered no prompt."""
    prompt = route.get("prompt")
    if not isinstance(prompt, Mapping):
        return None
    return {
        int(i)
        for b in prompt.get("bindings") or ()
        if b.get("status") == "bound"
        for i in b.get("fragments") or ()
    }


def _flatten(value: Any) -> Iterable[str]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _flatten(v)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            yield from _flatten(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def _used(
    route: Mapping[str, Any],
    output: str | None,
    rules: Sequence[UseRule],
    accept: float,
    extra: Mapping[str, Any] | None,
) -> tuple[bool, list[str], list[str]]:
    if output is None:
        return False, ["no_output: no step_output record for this trace_id"], []
    intent = str(route.get("intent", ""))
    texts, citable = _context_texts(route, accept, extra)
    out = _norm(output)
    matched: list[str] = []
    applicable: list[str] = []
    for rule in rules:
        if not rule.applies_to(intent):
            continue
        rx = re.compile(rule.pattern)
        if not rule.require_in_context:
            applicable.append(rule.name)
            if rx.search(output):
                matched.append(rule.name)
            continue
        values = {_norm(m.group(0)) for t in texts for m in rx.finditer(t)}
        if not values:
            continue
        applicable.append(rule.name)
        if any(v in out for v in values):
            matched.append(rule.name)
    if citable:
        applicable.append(CITES_SOURCE)
        if any(_cited(_norm(c), out) for c in citable):
            matched.append(CITES_SOURCE)
    if matched:
        return True, [], matched
    if not applicable:
        return (
            False,
            [
                f"{NOT_CHECKABLE}: the step's context holds nothing citable (no id, key "
                "or number in the trace), so use cannot be shown; counted as not used"
            ],
            [],
        )
    shown = ", ".join(citable[:5]) + (", ..." if len(citable) > 5 else "")
    hint = f" (citable: {shown})" if citable else ""
    return False, [f"not_cited: output cites nothing checked by {', '.join(applicable)}{hint}"], []


def _cited(value: str, output: str) -> bool:
    """``value`` occurs in ``output`` as a whole token (not inside a longer word or number)."""
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\w)", output) is not None


def judge_steps(
    records: Iterable[Mapping[str, Any]],
    *,
    accept: float,
    rules: Sequence[UseRule] = DEFAULT_RULES,
    context_values: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[StepVerdict]:
    """One verdict per ``route`` record; ``step_output`` records are matched by ``trace_id``.

    ``accept`` is the L3 accept threshold for records that do not carry their own (schema
    1/2; a schema-3 record is judged against ``confidence.accept``, the threshold its route
    used). ``context_values`` optionally maps trace_id -> the bundle's ``context_used``.
    """
    routes: list[Mapping[str, Any]] = []
    outputs: dict[str, list[str]] = defaultdict(list)
    for rec in records:
        kind = rec.get("kind", "route")
        if kind == "route":
            routes.append(rec)
        elif kind == "step_output":
            outputs[str(rec["trace_id"])].append(str(rec.get("output", "")))
    verdicts = []
    for route in routes:
        tid = str(route["trace_id"])
        route_accept = _accept_of(route, accept)
        load_reasons, notes = _loaded_reasons(route, route_accept)
        out = "\n".join(outputs[tid]) if tid in outputs else None
        used, use_reasons, matched = _used(
            route, out, rules, route_accept, (context_values or {}).get(tid)
        )
        verdicts.append(
            StepVerdict(
                trace_id=tid,
                loaded=not load_reasons,
                used=used,
                reasons=tuple(load_reasons + use_reasons),
                session_id=str(route.get("session_id", "")),
                intent=str(route.get("intent", "")),
                step=int(route.get("step", 0)),
                ts=str(route.get("ts", "")),
                rules_matched=tuple(matched),
                notes=tuple(notes),
                calibration=_version_of(route),
            )
        )
    return verdicts


# --- aggregation ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rate:
    n_steps: int
    n_loaded: int
    n_used: int
    n_effective: int
    n_not_checkable: int = 0  # steps with nothing citable in their context (counted as failed)

    @property
    def cer(self) -> float:
        return self.n_effective / self.n_steps if self.n_steps else float("nan")

    def to_dict(self) -> dict[str, Any]:
        cer = None if not self.n_steps else round(self.cer, 6)
        return {
            "n_steps": self.n_steps,
            "n_loaded": self.n_loaded,
            "n_used": self.n_used,
            "n_effective": self.n_effective,
            "n_not_checkable": self.n_not_checkable,
            "cer": cer,
        }


def _rate(verdicts: Sequence[StepVerdict]) -> Rate:
    return Rate(
        n_steps=len(verdicts),
        n_loaded=sum(v.loaded for v in verdicts),
        n_used=sum(v.used for v in verdicts),
        n_effective=sum(v.effective for v in verdicts),
        n_not_checkable=sum(not v.checkable for v in verdicts),
    )


def _group(verdicts: Sequence[StepVerdict], key: Any) -> dict[Any, Rate]:
    groups: dict[Any, list[StepVerdict]] = defaultdict(list)
    for v in verdicts:
        groups[key(v)].append(v)
    return {k: _rate(vs) for k, vs in sorted(groups.items())}


@dataclass(frozen=True, slots=True)
class WeekChange:
    week: str
    cer: float
    change: float | None  # CER minus the previous week's, None for the first week


@dataclass(frozen=True)
class CerReport:
    """CER overall and sliced; ``verdicts`` say which steps failed and why."""

    overall: Rate
    by_intent: Mapping[str, Rate]
    by_session: Mapping[str, Rate]
    by_day: Mapping[str, Rate]
    by_week: Mapping[str, Rate]
    by_intent_day: Mapping[tuple[str, str], Rate]
    week_over_week: tuple[WeekChange, ...]
    failure_reasons: Mapping[str, int]
    verdicts: tuple[StepVerdict, ...] = field(repr=False)
    info_notes: Mapping[str, int] = field(default_factory=dict)  # e.g. optional L2 misses
    # per calibration version ("" = defaults / unversioned thresholds), see traces.py
    by_version: Mapping[str, Rate] = field(default_factory=dict)

    @property
    def failures(self) -> tuple[StepVerdict, ...]:
        return tuple(v for v in self.verdicts if not v.effective)

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_dict(),
            "by_intent": {k: r.to_dict() for k, r in self.by_intent.items()},
            "by_session": {k: r.to_dict() for k, r in self.by_session.items()},
            "by_day": {k: r.to_dict() for k, r in self.by_day.items()},
            "by_week": {k: r.to_dict() for k, r in self.by_week.items()},
            "by_version": {k or "unversioned": r.to_dict() for k, r in self.by_version.items()},
            "week_over_week": [
                {"week": w.week, "cer": w.cer, "change": w.change} for w in self.week_over_week
            ],
            "failure_reasons": dict(self.failure_reasons),
            "info_notes": dict(self.info_notes),
            "failures": [
                {"trace_id": v.trace_id, "session_id": v.session_id, "intent": v.intent,
                 "step": v.step, "ts": v.ts, "loaded": v.loaded, "used": v.used,
                 "reasons": list(v.reasons), "notes": list(v.notes)}
                for v in self.failures
            ],
        }  # fmt: skip


def cer_report(verdicts: Sequence[StepVerdict]) -> CerReport:
    """Aggregate verdicts into CER overall / per intent / session / day / ISO week."""
    vs = tuple(verdicts)
    by_week = _group(vs, lambda v: v.week)
    wow: list[WeekChange] = []
    prev: float | None = None
    for week, rate in by_week.items():
        wow.append(WeekChange(week, rate.cer, None if prev is None else rate.cer - prev))
        prev = rate.cer
    reasons = Counter(r.split(":", 1)[0] for v in vs for r in v.reasons)
    notes = Counter(n.split(":", 1)[0] for v in vs for n in v.notes)
    return CerReport(
        overall=_rate(vs),
        by_intent=_group(vs, lambda v: v.intent),
        by_session=_group(vs, lambda v: v.session_id),
        by_day=_group(vs, lambda v: v.day),
        by_week=by_week,
        by_intent_day=_group(vs, lambda v: (v.intent, v.day)),
        week_over_week=tuple(wow),
        failure_reasons=dict(reasons.most_common()),
        verdicts=vs,
        info_notes=dict(notes.most_common()),
        by_version=_group(vs, lambda v: v.calibration),
    )


def load_step_records(
    traces_dir: Path,
    since: dt.date | dt.datetime | None = None,
    until: dt.date | dt.datetime | None = None,
    *,
    output_slack: dt.timedelta = dt.timedelta(days=1),
) -> list[dict[str, Any]]:
    """Route records in ``[since, until]`` plus their step outputs, which are written after the
    route and may land in a later daily file: outputs are read up to ``until + output_slack``."""
    from context_core.traces import read_traces

    routes = list(read_traces(traces_dir, since, until, kind="route"))
    ids = {r["trace_id"] for r in routes}
    later = until + output_slack if until is not None else None
    outputs = [
        o
        for o in read_traces(traces_dir, since, later, kind="step_output")
        if o.get("trace_id") in ids
    ]
    return routes + outputs


def compute_cer(
    traces_dir: Path,
    *,
    accept: float,
    since: dt.date | dt.datetime | None = None,
    until: dt.date | dt.datetime | None = None,
    rules: Sequence[UseRule] = DEFAULT_RULES,
) -> CerReport:
    """Read the daily trace files for steps routed in ``[since, until]``; compute CER."""
    records = load_step_records(traces_dir, since, until)
    return cer_report(judge_steps(records, accept=accept, rules=rules))
