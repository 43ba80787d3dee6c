"""Calibration versions, promotion gates, promote and roll back.

A calibration never overwrites the one in force. Every run (``ctx eval calibrate``,
``calibrate-beir``, the ``threshold_calibration`` DAG, ``ctx run``) writes a **candidate**
under ``<reports>/calibrations/<version>/`` (next to the router's ``thresholds.json``, see
:func:`context_core.routing.shadow.calibrations_dir_for`):

* ``thresholds.json``: the cosine pair, as the router reads it, stamped with ``version``;
* ``relevance_model.json``: the ``p_relevant`` model, only when it passed its gate;
* ``provenance.json``: the labels file's sha256, rows and class counts, model, collection,
  who ran it (``user@host``, ``dag:<run_id>``), when, the metrics with their CIs, the gates
  and, once promoted, who promoted it and why.

The version id is ``c-<UTC time>-<first 8 hex of the labels sha256>``.

**Gates** (:func:`evaluate_gates`), checked before a candidate is promoted, each named in the
output when it fails:

* ``labels_per_class`` (blocking): at least ``CTX_CALIBRATION_MIN_PER_CLASS`` (30) relevant
  and as many irrelevant hits.
* ``auc_ci`` (blocking): the lower bound of the AUC's bootstrap 95 % CI is above 0.5, i.e. the
  similarity demonstrably tells relevant from irrelevant hits on these labels.
* ``not_worse`` (blocking): on the same labels, the balanced accuracy of "confident" (signal
  >= accept) under the candidate minus under the calibration in force, with a paired
  bootstrap 95 % CI (the same resampled hits for both); refused when the CI's lower bound is
  below ``-CTX_CALIBRATION_NOT_WORSE_MARGIN`` (0.05). A candidate equal to the one in force
  has a difference of exactly 0 and passes. Nothing in force: passes.
* ``p_relevant`` (not blocking): the candidate keeps its relevance model only when the model's
  held-out AUC beats the raw cosine's on the same held-out queries; otherwise it carries none.
* ``label_change`` (reported): the share of labelled hits whose three-way label changes
  against the calibration in force.

**Promote** writes the runtime files, ``thresholds.json`` and ``relevance_model.json``
(removed when the version has no model), each atomically (temp file + ``os.replace``), then
``calibrations/current`` (the version in force) and a line in ``calibrations/history.jsonl``.
The router's reload-on-change (:class:`context_core.routing.confidence.PolicySource`) picks
them up on its next route, without a restart. **Rollback** returns to the version promoted
before the current one (the history is replayed as a stack: a promotion pushes, a rollback
pops). A ``thresholds.json`` in force from before versioning is kept as version
``legacy-<sha8>`` on the first promotion, so it can be rolled back to.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import getpass
import hashlib
import json
import math
import os
import re
import shutil
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from context_core.errors import PromotionError
from context_core.fsutil import atomic_write_text
from context_core.routing.confidence import label_score
from context_core.routing.relevance import RelevanceModel, relevance_path_for
from context_core.routing.shadow import SHADOW_FILE, calibrations_dir_for

if TYPE_CHECKING:
    from context_core.config import Settings
    from evaluation.calibration import CalibrationResult
    from evaluation.labels import LabelSet
    from evaluation.relevance_calibration import RelevanceFit

__all__ = [
    "BLOCKING_GATES",
    "Gate",
    "GateReport",
    "InForce",
    "Version",
    "VersionStore",
    "evaluate_gates",
    "format_gates",
    "ran_by",
    "summarize_versions",
]

BLOCKING_GATES = ("labels_per_class", "auc_ci", "not_worse")
_VERSION_RE = re.compile(r"^(c-\d{8}T\d{6}Z-[0-9a-f]{8}(-\d+)?|legacy-[0-9a-f]{8})$")
THRESHOLDS_FILE = "thresholds.json"
RELEVANCE_FILE = "relevance_model.json"
PROVENANCE_FILE = "provenance.json"


def ran_by() -> str:
    """``user@host`` of whoever runs this process (provenance, never a credential)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _version_order(vid: str) -> tuple[bool, str, int, str]:
    """Legacy imports first, then by time stamp, then by the same-second sequence number."""
    if vid.startswith("legacy-"):
        return (False, "", 0, vid)
    parts = vid.split("-")  # c, stamp, hash[, n]
    return (True, parts[1], int(parts[3]) if len(parts) > 3 else 1, vid)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, allow_nan=False, default=_jsonable) + "\n"


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def _finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


# --- versions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    """One stored calibration."""

    id: str
    path: Path
    thresholds: Mapping[str, Any]
    relevance: Mapping[str, Any] | None
    provenance: Mapping[str, Any]


@dataclass(frozen=True)
class InForce:
    """What the router reads now: the version named in ``current`` (None: nothing promoted
    yet) and the runtime documents themselves (None: file absent)."""

    version: str | None
    thresholds: Mapping[str, Any] | None
    relevance: Mapping[str, Any] | None


class VersionStore:
    """The versions of one thresholds file (by default the router's) and its history."""

    def __init__(self, thresholds_path: Path | str) -> None:
        self.thresholds_path = Path(thresholds_path)
        self.relevance_path = relevance_path_for(self.thresholds_path)
        self.root = calibrations_dir_for(self.thresholds_path)
        self.current_file = self.root / "current"
        self.history_file = self.root / "history.jsonl"
        self.shadow_file = self.root / SHADOW_FILE

    @classmethod
    def for_settings(cls, settings: Settings) -> VersionStore:
        return cls(settings.resolved_thresholds_path)

    # reading
    def ids(self) -> list[str]:
        """Stored versions, oldest first (ids sort by time; legacy imports first)."""
        if not self.root.is_dir():
            return []
        found = [p.name for p in self.root.iterdir() if p.is_dir() and _VERSION_RE.match(p.name)]
        return sorted(found, key=_version_order)

    def get(self, version: str) -> Version:
        if not _VERSION_RE.match(version or ""):
            raise PromotionError(
                f"{version!r} is not a calibration version id (c-YYYYMMDDTHHMMSSZ-xxxxxxxx); "
                "list them with `ctx eval thresholds list`"
            )
        path = self.root / version
        if not (path / THRESHOLDS_FILE).is_file():
            known = ", ".join(self.ids()[-5:]) or "none yet"
            raise PromotionError(
                f"no calibration version {version!r} under {self.root} (latest: {known}); "
                "list them with `ctx eval thresholds list`"
            )
        rel = path / RELEVANCE_FILE
        prov = path / PROVENANCE_FILE
        return Version(
            id=version,
            path=path,
            thresholds=json.loads((path / THRESHOLDS_FILE).read_text(encoding="utf-8")),
            relevance=json.loads(rel.read_text(encoding="utf-8")) if rel.is_file() else None,
            provenance=json.loads(prov.read_text(encoding="utf-8")) if prov.is_file() else {},
        )

    def current_id(self) -> str | None:
        try:
            value = self.current_file.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return value if _VERSION_RE.match(value) else None

    def in_force(self) -> InForce:
        def read(path: Path) -> Mapping[str, Any] | None:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            return doc if isinstance(doc, dict) else None

        return InForce(self.current_id(), read(self.thresholds_path), read(self.relevance_path))

    def history(self) -> list[dict[str, Any]]:
        try:
            lines = self.history_file.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def stack(self) -> list[str]:
        """The promotion stack replayed from the history (last = in force)."""
        stack: list[str] = []
        for entry in self.history():
            if entry.get("action") == "promote":
                prev = entry.get("previous")
                if not stack and prev:
                    stack.append(prev)
                stack.append(entry["version"])
            elif entry.get("action") == "rollback" and stack:
                stack.pop()
        return stack

    # writing
    def new_id(self, labels_sha256: str, when: dt.datetime | None = None) -> str:
        stamp = (when or _now()).strftime("%Y%m%dT%H%M%SZ")
        base = f"c-{stamp}-{labels_sha256[:8].lower()}"
        # Versions made in the same second are numbered in the order they were made (the hash
        # alone would order them at random): the second one is "-2", whatever its labels.
        same = list(self.root.glob(f"c-{stamp}-*")) if self.root.is_dir() else []
        n = len(same) + 1
        vid = base if n == 1 else f"{base}-{n}"
        while (self.root / vid).exists():
            n += 1
            vid = f"{base}-{n}"
        return vid

    def create(
        self,
        thresholds: Mapping[str, Any],
        relevance: Mapping[str, Any] | None,
        provenance: Mapping[str, Any],
        *,
        version: str | None = None,
    ) -> Version:
        """Store a candidate (all its files appear at once: written to a temp dir, renamed)."""
        vid = version or self.new_id(str(provenance.get("labels_sha256", "0" * 8)))
        thresholds = {**thresholds, "version": vid}
        if relevance is not None:
            relevance = {
                **relevance,
                "provenance": {**dict(relevance.get("provenance") or {}), "version": vid},
            }
        provenance = {**provenance, "version": vid}
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{vid}-{os.getpid()}"
        tmp.mkdir()
        try:
            (tmp / THRESHOLDS_FILE).write_text(_dump(thresholds), encoding="utf-8")
            if relevance is not None:
                (tmp / RELEVANCE_FILE).write_text(_dump(relevance), encoding="utf-8")
            (tmp / PROVENANCE_FILE).write_text(_dump(provenance), encoding="utf-8")
            os.replace(tmp, self.root / vid)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Version(vid, self.root / vid, thresholds, relevance, provenance)

    def _import_legacy(self) -> str | None:
        """Keep an unversioned thresholds.json in force as a version before replacing it."""
        if not self.thresholds_path.is_file():
            return None
        raw = self.thresholds_path.read_bytes()
        vid = f"legacy-{hashlib.sha256(raw).hexdigest()[:8]}"
        if (self.root / vid).is_dir():
            return vid
        try:
            doc = json.loads(raw)
        except ValueError:
            return None  # a malformed file: nothing worth rolling back to
        if not isinstance(doc, dict) or not all(
            isinstance(doc.get(k), int | float) and not isinstance(doc.get(k), bool)
            for k in ("accept", "skip")
        ):
            return None  # the router ignores it too
        rel = self.in_force().relevance
        prov = {
            "imported_from": str(self.thresholds_path),
            "note": "in force before calibrations were versioned",
            "created_at": _now().isoformat(),
        }
        self.create(doc, rel, prov, version=vid)
        return vid

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One promotion or rollback at a time (across processes: an flock on a lock file),
        so the history and ``current`` never interleave."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".lock").open("a") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def promote(
        self,
        version: str,
        *,
        by: str,
        reason: str | None = None,
        forced: bool = False,
        action: str = "promote",
    ) -> Version:
        """Make ``version`` the one in force (atomic file replaces; see the module docstring)."""
        with self._locked():
            return self._promote(version, by=by, reason=reason, forced=forced, action=action)

    def _promote(
        self, version: str, *, by: str, reason: str | None, forced: bool, action: str
    ) -> Version:
        v = self.get(version)
        previous = self.current_id()
        if previous is None and action == "promote":
            previous = self._import_legacy()
        if v.relevance is not None:
            atomic_write_text(self.relevance_path, _dump(v.relevance))
        else:
            self.relevance_path.unlink(missing_ok=True)
        atomic_write_text(self.thresholds_path, _dump(v.thresholds))
        atomic_write_text(self.current_file, v.id + "\n")
        entry = {
            "ts": _now().isoformat(),
            "action": action,
            "version": v.id,
            "previous": previous,
            "by": by,
            "forced": forced,
            "reason": reason,
        }
        with self.history_file.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
        if action == "promote":
            prov = dict(v.provenance)
            prov["promotions"] = [*prov.get("promotions", []), entry]
            atomic_write_text(v.path / PROVENANCE_FILE, _dump(prov))
        return self.get(v.id)

    def rollback(self, *, by: str, reason: str | None = None) -> Version:
        """Return to the version promoted before the one in force."""
        with self._locked():
            return self._rollback(by=by, reason=reason)

    def _rollback(self, *, by: str, reason: str | None) -> Version:
        stack = self.stack()
        current = self.current_id()
        if current is None or not stack or stack[-1] != current:
            raise PromotionError(
                f"nothing to roll back: no promotion history in {self.history_file} names the "
                "version in force; promote a version explicitly with "
                "`ctx eval thresholds promote <version>`"
            )
        if len(stack) < 2:
            raise PromotionError(
                f"{current} is the first calibration promoted; there is no earlier one to roll "
                "back to. Promote another version (`ctx eval thresholds promote <version>`) or "
                f"remove {self.thresholds_path} to use the settings' defaults"
            )
        return self._promote(stack[-2], by=by, reason=reason, forced=False, action="rollback")


# --- gates -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    passed: bool
    blocking: bool
    detail: str
    values: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "blocking": self.blocking,
            "detail": self.detail,
            "values": dict(self.values),
        }


@dataclass(frozen=True)
class GateReport:
    gates: tuple[Gate, ...]
    keep_relevance: bool

    @property
    def failed(self) -> list[str]:
        """Names of the blocking gates that failed."""
        return [g.name for g in self.gates if g.blocking and not g.passed]

    @property
    def passed(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failed": self.failed,
            "keep_relevance": self.keep_relevance,
            "gates": [g.to_dict() for g in self.gates],
        }


def _signal(
    labels: LabelSet, thresholds: Mapping[str, Any], relevance: Mapping[str, Any] | None
) -> tuple[np.ndarray, float, float, str]:
    """(per-hit signal, accept, skip, name): the relevance model's p_relevant when the
    calibration has a usable one, else the cosine, as the router labels hits."""
    from evaluation.relevance_calibration import features_from_frame

    if relevance is not None:
        try:
            model = RelevanceModel.from_dict(dict(relevance))
        except ValueError:
            model = None
        if model is not None and model.accept is not None and model.skip is not None:
            X, _ = features_from_frame(labels.frame)
            return model.predict(X), float(model.accept), float(model.skip), "p_relevant"
    return (
        np.asarray(labels.scores, dtype=float),
        float(thresholds["accept"]),
        float(thresholds["skip"]),
        "cosine",
    )


def _balanced_accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    pos, neg = y == 1, y == 0
    tpr = float(pred[pos].mean()) if pos.any() else float("nan")
    tnr = float((~pred[neg]).mean()) if neg.any() else float("nan")
    return (tpr + tnr) / 2


def _not_worse(
    cand: np.ndarray,
    cur: np.ndarray,
    y: np.ndarray,
    *,
    margin: float,
    n_boot: int,
    seed: int,
) -> Gate:
    diff = _balanced_accuracy(cand, y) - _balanced_accuracy(cur, y)
    rng = np.random.default_rng(seed)
    draws: list[float] = []
    for _ in range(max(n_boot, 0)):
        idx = rng.integers(0, len(y), len(y))
        by = y[idx]
        if by.min() == by.max():
            continue
        draws.append(_balanced_accuracy(cand[idx], by) - _balanced_accuracy(cur[idx], by))
    if draws:
        lo, hi = (float(v) for v in np.percentile(draws, [2.5, 97.5]))
    else:
        lo = hi = diff
    passed = lo >= -margin - 1e-12
    detail = f"balanced accuracy vs in force {diff:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}); " + (
        f"lower bound >= -{margin:.2f}"
        if passed
        else f"lower bound < -{margin:.2f}: the candidate may be worse than the one in force"
    )
    return Gate(
        "not_worse",
        passed,
        True,
        detail,
        {
            "diff": diff,
            "ci_low": lo,
            "ci_high": hi,
            "margin": margin,
            "metric": "balanced_accuracy",
        },
    )


def evaluate_gates(
    result: CalibrationResult,
    fit: RelevanceFit | None,
    labels: LabelSet,
    in_force: InForce,
    *,
    min_per_class: int,
    margin: float,
    n_boot: int = 1000,
    seed: int = 0,
) -> GateReport:
    """Check a candidate (``result`` + optional ``fit``) against the labels and the
    calibration in force; see the module docstring for each gate."""
    gates: list[Gate] = []
    smaller = min(result.n_pos, result.n_neg)
    gates.append(
        Gate(
            "labels_per_class",
            smaller >= min_per_class,
            True,
            f"{result.n_pos} relevant / {result.n_neg} irrelevant hits; need >= {min_per_class} "
            "of each (CTX_CALIBRATION_MIN_PER_CLASS)"
            + ("" if smaller >= min_per_class else ": label more hits of the smaller class"),
            {"n_pos": result.n_pos, "n_neg": result.n_neg, "min_per_class": min_per_class},
        )
    )
    auc_ci = result.ci["auc"]
    low = auc_ci.low
    ok = math.isfinite(low) and low > 0.5
    gates.append(
        Gate(
            "auc_ci",
            ok,
            True,
            f"AUC {result.auc:.3f}, 95% CI {low:.3f} to {auc_ci.high:.3f}; "
            + (
                "lower bound > 0.5"
                if ok
                else "lower bound <= 0.5: no evidence the similarity separates relevant from "
                "irrelevant hits on these labels"
                if math.isfinite(low)
                else "no CI (run with --n-boot > 0)"
            ),
            {"auc": result.auc, "ci_low": _finite(low), "ci_high": _finite(auc_ci.high)},
        )
    )
    # p_relevant: kept only when it beats raw cosine on held-out queries
    keep = False
    if fit is None:
        gates.append(Gate("p_relevant", False, False, "no relevance model fitted; cosine labels"))
    else:
        held = fit.summary()["held_out"]
        a_p, a_c = float(held["auc_p_relevant"]), float(held["auc_cosine"])
        keep = math.isfinite(a_p) and math.isfinite(a_c) and a_p > a_c
        gates.append(
            Gate(
                "p_relevant",
                keep,
                False,
                f"held-out AUC p_relevant {a_p:.3f} vs cosine {a_c:.3f}: "
                + ("model kept" if keep else "not better, the candidate carries no model"),
                {"auc_p_relevant": a_p, "auc_cosine": a_c},
            )
        )
    y = np.asarray(labels.labels, dtype=int)
    cand_rel = fit.model.to_dict() if (fit is not None and keep) else None
    cand_doc = {"accept": result.accept, "skip": result.skip}
    c_sig, c_acc, c_skip, _ = _signal(labels, cand_doc, cand_rel)
    thr = in_force.thresholds
    usable = thr is not None and all(
        isinstance(thr.get(k), int | float) and not isinstance(thr.get(k), bool)
        for k in ("accept", "skip")
    )
    if thr is not None and not usable:
        gates.append(
            Gate(
                "not_worse",
                True,
                True,
                "the thresholds file in force has no numeric accept/skip (the router ignores it "
                "and uses the settings' defaults); nothing to compare",
            )
        )
        gates.append(Gate("label_change", True, False, "no usable calibration in force"))
        return GateReport(tuple(gates), keep)
    if in_force.thresholds is None:
        gates.append(Gate("not_worse", True, True, "no calibration in force; nothing to compare"))
        gates.append(Gate("label_change", True, False, "no calibration in force"))
        return GateReport(tuple(gates), keep)
    i_sig, i_acc, i_skip, i_name = _signal(labels, in_force.thresholds, in_force.relevance)
    gates.append(
        _not_worse(c_sig >= c_acc, i_sig >= i_acc, y, margin=margin, n_boot=n_boot, seed=seed)
    )
    old = np.array([label_score(v, i_acc, i_skip) for v in i_sig])
    new = np.array([label_score(v, c_acc, c_skip) for v in c_sig])
    share = float((old != new).mean()) if len(y) else float("nan")
    gates.append(
        Gate(
            "label_change",
            True,
            False,
            f"{share:.1%} of labelled hits change label vs the calibration in force "
            f"({in_force.version or 'unversioned file'}, {i_name})",
            {"changed_share": share, "in_force": in_force.version},
        )
    )
    return GateReport(tuple(gates), keep)


def format_gates(report: GateReport) -> list[str]:
    """One line per gate: PASS/FAIL (blocking) or note (not blocking)."""
    out = []
    for g in report.gates:
        tag = ("PASS" if g.passed else "FAIL") if g.blocking else "note"
        out.append(f"{tag:>4} {g.name}: {g.detail}")
    return out


def summarize_versions(store: VersionStore) -> list[dict[str, Any]]:
    """The rows of ``ctx eval thresholds list``, oldest first."""
    current = store.current_id()
    rows = []
    for vid in store.ids():
        v = store.get(vid)
        p = v.provenance
        metrics = p.get("metrics", {})
        rows.append(
            {
                "version": vid,
                "in_force": vid == current,
                "created_at": p.get("created_at", ""),
                "ran_by": p.get("ran_by", ""),
                "rows": p.get("rows"),
                "accept": v.thresholds.get("accept"),
                "skip": v.thresholds.get("skip"),
                "auc": metrics.get("auc"),
                "relevance": v.relevance is not None,
                "gates": "pass" if p.get("gates", {}).get("passed", True) else "FAIL",
                "promoted": bool(p.get("promotions")),
            }
        )
    return rows
