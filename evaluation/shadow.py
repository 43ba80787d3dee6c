"""Shadow evaluation of a candidate calibration: start, stop, and the report.

``start_shadow`` writes the marker the router reads (:mod:`context_core.routing.shadow`):
from then on every route also records, in its trace, the labels the candidate would have
given its hits. ``shadow_report`` reads those traces and shows, before any promotion:

* how many routes and hits ran in shadow, and the share of hits whose label differs, with the
  transitions (``low_confidence->confident`` ...);
* CER on those routes as they ran (the calibration in force) and as the candidate would have
  judged them: the same records with the shadow labels and the candidate's accept. "Loaded"
  (a hit at or above accept) moves exactly; "used" is judged on the same step outputs, so it is
  an estimate: an agent given other context might have answered otherwise.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from context_core.errors import PromotionError
from context_core.fsutil import atomic_write_text
from evaluation.cer import DEFAULT_RULES, Rate, UseRule, _rate, judge_steps, load_step_records
from evaluation.promotion import VersionStore

__all__ = ["ShadowReport", "shadow_report", "shadow_status", "start_shadow", "stop_shadow"]


def start_shadow(
    store: VersionStore,
    version: str,
    *,
    routes: int | None = None,
    minutes: float | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """Put ``version`` in shadow, bounded by ``routes`` (per process) and/or ``minutes``
    (60 minutes when neither is given). Returns the marker document."""
    v = store.get(version)
    if v.id == store.current_id():
        raise PromotionError(
            f"{v.id} is the calibration in force; shadow another version (`ctx eval "
            "thresholds list`)"
        )
    if routes is not None and routes < 1:
        raise PromotionError(f"--routes must be a positive number, got {routes}")
    if minutes is not None and minutes <= 0:
        raise PromotionError(f"--minutes must be positive, got {minutes}")
    if routes is None and minutes is None:
        minutes = 60.0
    start = (now or dt.datetime.now(dt.UTC)).replace(microsecond=0)
    doc = {
        "version": v.id,
        "thresholds": {
            "accept": v.thresholds["accept"],
            "skip": v.thresholds["skip"],
            "model": v.thresholds.get("model"),
        },
        "relevance": v.relevance,
        "started_at": start.isoformat(),
        "until": (start + dt.timedelta(minutes=minutes)).isoformat() if minutes else None,
        "max_routes": routes,
    }
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(store.shadow_file, json.dumps(doc, indent=2) + "\n")
    return doc


def stop_shadow(store: VersionStore) -> bool:
    """Remove the shadow marker; True when there was one."""
    try:
        store.shadow_file.unlink()
    except FileNotFoundError:
        return False
    return True


def shadow_status(store: VersionStore) -> dict[str, Any] | None:
    try:
        doc = json.loads(store.shadow_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class ShadowReport:
    version: str | None
    n_routes: int
    n_hits: int
    n_changed: int
    transitions: Mapping[str, int]
    cer_in_force: Rate
    cer_shadow: Rate
    in_force_versions: Mapping[str, int] = field(default_factory=dict)

    @property
    def changed_share(self) -> float:
        return self.n_changed / self.n_hits if self.n_hits else float("nan")

    @property
    def cer_change(self) -> float:
        return self.cer_shadow.cer - self.cer_in_force.cer

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "routes": self.n_routes,
            "hits": self.n_hits,
            "changed": self.n_changed,
            "changed_share": self.changed_share if self.n_hits else None,
            "transitions": dict(self.transitions),
            "cer_in_force": self.cer_in_force.to_dict(),
            "cer_shadow": self.cer_shadow.to_dict(),
            "in_force_versions": dict(self.in_force_versions),
        }


def _as_shadow(route: Mapping[str, Any]) -> dict[str, Any]:
    """The route record as the shadow calibration would have labelled it."""
    rec = copy.deepcopy(dict(route))
    conf = rec["confidence"]
    sh = conf.pop("shadow")
    hits = rec["l3"].get("hits") or []
    for hit, label in zip(hits, sh["labels"], strict=False):
        hit["label"] = label
    if sh["signal"] == "p_relevant" and sh.get("p_relevant") is not None:
        for hit, p in zip(hits, sh["p_relevant"], strict=False):
            hit["p_relevant"] = p
        conf["relevance"] = {**(conf.get("relevance") or {}), "accept": sh["accept"],
                             "skip": sh["skip"]}  # fmt: skip
        rec["l3"]["confidence_signal"] = "p_relevant"
    else:
        conf["accept"], conf["skip"] = sh["accept"], sh["skip"]
        conf.pop("relevance", None)
        rec["l3"]["confidence_signal"] = "cosine"
        for hit in hits:
            hit.pop("p_relevant", None)
    conf["version"] = sh["version"]
    return rec


def _shadowed(records: Iterable[Mapping[str, Any]], version: str | None) -> list[Mapping[str, Any]]:
    out = []
    for r in records:
        if r.get("kind", "route") != "route":
            continue
        sh = (r.get("confidence") or {}).get("shadow")
        if isinstance(sh, Mapping) and (version is None or sh.get("version") == version):
            out.append(r)
    return out


def shadow_report(
    traces_dir: Path,
    *,
    version: str | None = None,
    since: dt.date | dt.datetime | None = None,
    until: dt.date | dt.datetime | None = None,
    accept: float = 0.72,
    rules: tuple[UseRule, ...] = DEFAULT_RULES,
) -> ShadowReport:
    """Compare the labels and CER of the routes that ran with ``version`` in shadow (every
    shadowed route when None). ``accept`` only matters for records without their own."""
    records = load_step_records(traces_dir, since, until)
    routes = _shadowed(records, version)
    ids = {r["trace_id"] for r in routes}
    outputs = [r for r in records if r.get("kind") == "step_output" and r["trace_id"] in ids]
    transitions: Counter[str] = Counter()
    n_hits = 0
    versions: Counter[str] = Counter()
    for r in routes:
        versions[str((r.get("confidence") or {}).get("version") or "unversioned")] += 1
        sh = r["confidence"]["shadow"]
        for hit, new in zip(r["l3"].get("hits") or [], sh["labels"], strict=False):
            n_hits += 1
            if hit["label"] != new:
                transitions[f"{hit['label']}->{new}"] += 1
    before = judge_steps([*routes, *outputs], accept=accept, rules=rules)
    after = judge_steps([*(_as_shadow(r) for r in routes), *outputs], accept=accept, rules=rules)
    found = {str(r["confidence"]["shadow"]["version"]) for r in routes}
    return ShadowReport(
        version=version or (found.pop() if len(found) == 1 else None),
        n_routes=len(routes),
        n_hits=n_hits,
        n_changed=sum(transitions.values()),
        transitions=dict(transitions.most_common()),
        cer_in_force=_rate(before),
        cer_shadow=_rate(after),
        in_force_versions=dict(versions),
    )
