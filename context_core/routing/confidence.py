"""Calibrated confidence thresholds for L3 hits, bound to the embedding model they were fit for.

An L3 hit is only as useful as our belief that it answers the step. The calibration job
(``ctx eval calibrate``) fits two cut points on labelled retrieval results and writes them to
``reports/thresholds.json``; this module reads that file and labels the hits of a route.

Labelling a route's hit list (:meth:`ConfidencePolicy.label_hits`) follows one of two rules
(``CTX_CONFIDENCE_RULE``):

* ``"design"`` (default, the reference design): if **every** hit scores below ``skip``, L3 is
  left out (all ``"below_skip"``); otherwise hits ``>= accept`` are ``"confident"`` and **all
  the others** ``"low_confidence"`` (passed on "for reference; real-time data wins"), including
  the ones below skip.
* ``"per_hit"`` (the earlier behaviour, kept as an option): each hit on its own,
  ``>= accept`` confident, ``[skip, accept)`` low-confidence, ``< skip`` dropped.

A NaN score is never trusted: ``"below_skip"`` under either rule, and it does not count as a
hit at or above skip.

Scores are **cosine similarities** (higher = closer, identical text ~ 1.0), the convention of
:class:`context_core.knowledge.store.Hit`. A distance (lower = closer) fed in by mistake would
invert every label, so :meth:`ConfidencePolicy.label` refuses values outside [-1, 1] and the
tests pin that a search for a stored text itself comes back ``confident``.

**Thresholds belong to a model.** Cosine scales differ between embedding models (MiniLM's
0.49/0.28 mean nothing for bge-m3), so ``thresholds.json`` records the model it was calibrated
with (top-level ``"model"``, else ``provenance.model``). :class:`PolicySource` compares it with
the encoder's model, by the name a collection records (:func:`model_name`): a file for another
model is refused (an error log naming both models and the fix; the settings' defaults apply)
or, with ``CTX_THRESHOLDS_MODEL_MISMATCH=warn``, used with a loud warning. A file that names no
model (written before the binding existed) is used with a warning.

**Reload without restart.** :meth:`PolicySource.current` stats the file at most once per
``CTX_POLICY_RECHECK_S`` seconds (default 1; 0: on every call) and re-reads it when its
``(mtime_ns, size, inode)`` changed, so a calibration written while the service runs
(``write_thresholds`` replaces the file atomically: new inode) is in force on the routes that
start at most ``CTX_POLICY_RECHECK_S`` after it was written (a route stats nothing in between:
the three files a route looks at cost three ``os.stat`` calls otherwise).

A missing thresholds file is normal (before the first calibration): the settings' defaults
(``CTX_ACCEPT_THRESHOLD`` 0.72, ``CTX_SKIP_THRESHOLD`` 0.65) apply silently. A *malformed* file
is an operator problem: the defaults apply and a warning names the file and what is wrong.

**The relevance model.** Next to ``thresholds.json`` the calibration jobs write
``relevance_model.json`` (:mod:`context_core.routing.relevance`): a calibrated ``p_relevant`` per
hit
with its own accept/skip on that probability. :meth:`PolicySource.relevance` loads it under the
same rules (at most one ``os.stat`` per ``CTX_POLICY_RECHECK_S``, re-read on change,
refused for another embedding model unless ``CTX_THRESHOLDS_MODEL_MISMATCH=warn``, a
malformed file warned about and ignored). When it is in force the router labels L3 hits by
``p_relevant`` (:func:`relevance_policy`); when it is not, the cosine thresholds above
apply unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from context_core import defaults
from context_core.config import Settings
from context_core.routing.file_watch import FileKey, FileWatch, Reloading
from context_core.routing.relevance import RelevanceModel, relevance_path_for

__all__ = [
    "DEFAULT_ACCEPT",
    "DEFAULT_SKIP",
    "RULES",
    "ConfidenceLabel",
    "ConfidencePolicy",
    "ConfidenceRule",
    "PolicySource",
    "label_score",
    "model_name",
    "relevance_policy",
    "thresholds_model",
]

log = logging.getLogger(__name__)

DEFAULT_ACCEPT = defaults.ACCEPT_THRESHOLD
DEFAULT_SKIP = defaults.SKIP_THRESHOLD

ConfidenceLabel = Literal["confident", "low_confidence", "below_skip"]
ConfidenceRule = Literal["design", "per_hit"]
RULES: tuple[ConfidenceRule, ...] = ("design", "per_hit")

# Float noise of a normalised dot product can land a hair outside [-1, 1]; a distance
# metric (euclidean, 1 - cos) easily goes far beyond. This tolerance separates the two.
_COSINE_SLACK = 1e-3


def label_score(score: float, accept: float, skip: float) -> ConfidenceLabel:
    """The three-way label of one similarity: ``>= accept`` confident, ``>= skip``
    low-confidence, else (and for NaN) below skip. The one statement of the rule: the router
    applies it through :class:`ConfidencePolicy`, calibration reports through this function."""
    if score >= accept:
        return "confident"
    if score >= skip:
        return "low_confidence"
    return "below_skip"  # NaN compares false: never trusted


@dataclass(frozen=True, slots=True)
class ConfidencePolicy:
    """Two cut points on cosine similarity, the rule that applies them, and their provenance.

    ``source`` is a human-readable provenance string (a file path, or which defaults), shown
    in health reports and traces so nobody wonders which thresholds a run used. ``model`` is
    the embedding model the thresholds were calibrated for (None: unknown, e.g. defaults or a
    legacy file).
    """

    accept: float = DEFAULT_ACCEPT
    skip: float = DEFAULT_SKIP
    source: str = "built-in defaults"
    model: str | None = None
    rule: ConfidenceRule = "design"
    version: str | None = None  # the calibration version (``reports/calibrations/<v>``)

    def __post_init__(self) -> None:
        problem = _check_pair(self.accept, self.skip)
        if problem:
            raise ValueError(f"invalid confidence thresholds: {problem}")
        if self.rule not in RULES:
            raise ValueError(f"unknown confidence rule {self.rule!r}; use one of {list(RULES)}")

    @classmethod
    def defaults(cls, settings: Settings | None = None) -> ConfidencePolicy:
        """The configured defaults (``CTX_ACCEPT_THRESHOLD`` / ``CTX_SKIP_THRESHOLD``)."""
        if settings is None:
            return cls()
        return cls(
            accept=settings.accept_threshold,
            skip=settings.skip_threshold,
            source="settings (CTX_ACCEPT_THRESHOLD / CTX_SKIP_THRESHOLD)",
            rule=settings.confidence_rule,
        )

    @classmethod
    def load(cls, settings: Settings) -> ConfidencePolicy:
        """Thresholds from ``settings.resolved_thresholds_path`` if valid, else the defaults.

        One-shot and model-blind (the file's model is recorded, not checked): long-running
        code should use :class:`PolicySource`, which checks the model and reloads.
        """
        return cls.from_file(settings.resolved_thresholds_path, fallback=cls.defaults(settings))

    @classmethod
    def from_file(cls, path: Path, *, fallback: ConfidencePolicy | None = None) -> ConfidencePolicy:
        """Read a thresholds file; on any problem log a warning and return ``fallback``.

        The rule comes from ``fallback`` (a setting, not part of a calibration).
        """
        fallback = fallback or cls()
        if not path.exists():
            log.debug("no thresholds file at %s; using %s", path, fallback.source)
            return fallback
        raw, problem = _read_document(path)
        if problem:
            return _fallback(fallback, path, problem)
        assert raw is not None
        return cls._from_document(raw, path, fallback.rule)

    @classmethod
    def _from_document(
        cls, raw: dict[str, Any], path: Path, rule: ConfidenceRule
    ) -> ConfidencePolicy:
        policy = cls(
            accept=float(raw["accept"]),
            skip=float(raw["skip"]),
            source=str(path),
            model=thresholds_model(raw),
            rule=rule,
            version=raw["version"] if isinstance(raw.get("version"), str) else None,
        )
        log.debug("confidence thresholds accept=%.4f skip=%.4f from %s", *policy.pair, path)
        return policy

    @property
    def pair(self) -> tuple[float, float]:
        return (self.accept, self.skip)

    def label(self, score: float) -> ConfidenceLabel:
        """Label one cosine similarity on its own (the ``per_hit`` rule).

        NaN is never trusted; out-of-range values raise.
        """
        if math.isnan(score):
            return "below_skip"
        if not -1.0 - _COSINE_SLACK <= score <= 1.0 + _COSINE_SLACK:
            raise ValueError(
                f"score {score!r} is outside [-1, 1]: ConfidencePolicy expects a cosine "
                "similarity (higher = closer), not a distance; convert with 1 - distance "
                "or fix the vector store's metric"
            )
        return label_score(score, self.accept, self.skip)

    def label_hits(self, scores: Sequence[float]) -> list[ConfidenceLabel]:
        """Label a route's whole hit list under :attr:`rule` (see the module docstring).

        Returns one label per score, in order. Every score is range-checked as in
        :meth:`label`.
        """
        own = [self.label(s) for s in scores]
        if self.rule == "per_hit":
            return own
        if all(lab == "below_skip" for lab in own):
            return own  # every hit below skip: L3 is left out
        return [
            lab if lab == "confident" or math.isnan(s) else "low_confidence"
            for s, lab in zip(scores, own, strict=True)
        ]

    def with_rule(self, rule: ConfidenceRule) -> ConfidencePolicy:
        return replace(self, rule=rule)

    def to_dict(self) -> dict[str, Any]:
        """``{accept, skip, source, model, rule, version}``: what every trace record carries
        (``version`` is the promoted calibration's id, None for defaults or an unversioned
        file)."""
        return {
            "accept": self.accept,
            "skip": self.skip,
            "source": self.source,
            "model": self.model,
            "rule": self.rule,
            "version": self.version,
        }


def relevance_policy(
    model: RelevanceModel, rule: ConfidenceRule = "design", source: str = ""
) -> ConfidencePolicy:
    """The model's cut points on ``p_relevant`` as a policy, so the router's one labelling rule
    (:meth:`ConfidencePolicy.label_hits`) applies to probabilities as it does to cosines."""
    if model.accept is None or model.skip is None:
        raise ValueError("the relevance model has no accept/skip thresholds on p_relevant")
    where = source or str(model.provenance.get("loaded_from") or "fitted relevance model")
    return ConfidencePolicy(
        accept=model.accept,
        skip=model.skip,
        source=f"p_relevant ({model.kind}) from {where}",
        model=model.model,
        rule=rule,
    )


def model_name(name: str) -> str:
    """``name`` as a collection records its model (``Encoder.name``, ``check_model``).

    A registry name stays as it is; a registry model's hub id (``BAAI/bge-m3``) becomes its
    registry name; an existing local directory becomes its resolved path (what
    :func:`context_core.knowledge.embedding.load_encoder` records); anything else is kept verbatim.
    """
    from context_core.knowledge.embedding import MODEL_REGISTRY

    name = str(name).strip()
    if name in MODEL_REGISTRY:
        return name
    for spec in MODEL_REGISTRY.values():
        if name == spec.model_id:
            return spec.name
    path = Path(name).expanduser()
    try:
        if name and path.is_dir():
            return str(path.resolve())
    except OSError:
        pass
    return name


def thresholds_model(doc: Any) -> str | None:
    """The model a thresholds document names: top-level ``model``, else ``provenance.model``."""
    if not isinstance(doc, dict):
        return None
    value = doc.get("model")
    if not (isinstance(value, str) and value.strip()):
        prov = doc.get("provenance")
        value = prov.get("model") if isinstance(prov, dict) else None
    return value.strip() if isinstance(value, str) and value.strip() else None


_UNREAD: Literal["unread"] = "unread"


@dataclass(frozen=True, slots=True)
class _Loaded:
    """One (re)load of the thresholds file, swapped in as a whole so readers never see a
    policy from one load and the file key of another."""

    key: FileKey | Literal["unread"] | None
    policy: ConfidencePolicy
    mismatch: bool = False
    file_model: str | None = None
    loaded_at: float = 0.0


@dataclass(frozen=True, slots=True)
class _RelevanceLoaded:
    """One (re)load of ``relevance_model.json``: the model in force (None: cosine labels)."""

    key: FileKey | Literal["unread"] | None
    model: RelevanceModel | None
    policy: ConfidencePolicy | None = None
    mismatch: bool = False
    file_model: str | None = None
    problem: str | None = None
    loaded_at: float = 0.0

    def status(self, path: Path) -> dict[str, Any] | None:
        if self.key is None:
            return None
        m = self.model
        return {
            "path": str(path),
            "in_force": m is not None,
            "kind": m.kind if m is not None else None,
            "features": list(m.features) if m is not None else None,
            "accept": m.accept if m is not None else None,
            "skip": m.skip if m is not None else None,
            "file_model": self.file_model,
            "mismatch": self.mismatch,
            "problem": self.problem,
            "loaded_at": self.loaded_at,
        }


class PolicySource:
    """The thresholds in force, re-read when ``thresholds.json`` changes, checked against
    the encoder's model.

    ``model`` is the encoder's name (``Encoder.name``); None means ``settings.embed_model``.
    Thread-safe; :meth:`current` costs nothing but a clock read within
    ``settings.policy_recheck_s`` of its last look at the file, else one ``os.stat`` when
    nothing changed. ``clock`` (monotonic seconds) is injectable for tests.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        model: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(settings.resolved_thresholds_path)
        self.recheck_s = float(settings.policy_recheck_s)
        self.model = model_name(model if model is not None else settings.embed_model)
        self.on_mismatch: Literal["refuse", "warn"] = settings.thresholds_model_mismatch
        self._defaults = ConfidencePolicy.defaults(settings)
        lock = threading.Lock()
        self._thresholds = Reloading(
            FileWatch(self.path, self.recheck_s, clock=clock),
            self._load,
            _Loaded(_UNREAD, self._defaults),
            lock,
        )
        self.relevance_path = relevance_path_for(self.path)
        self._relevance = Reloading(
            FileWatch(self.relevance_path, self.recheck_s, clock=clock),
            self._load_relevance,
            _RelevanceLoaded(_UNREAD, None),
            lock,
        )

    def current(self) -> ConfidencePolicy:
        """The policy for this route: the file's thresholds when valid (and for this model),
        else the settings' defaults."""
        return self._snapshot().policy

    def status(self) -> dict[str, Any]:
        """For ``/metrics`` and health reports: the pair in force and where it came from.

        ``{accept, skip, source, model, rule}`` of the policy in force, plus ``mismatch``
        (True when the file was calibrated for another model: refused, or used under
        ``warn``), ``file_model`` (the model the file names), ``encoder_model``, ``path`` and
        ``loaded_at`` (epoch seconds of the last (re)load).
        """
        snap = self._snapshot()
        return {
            **snap.policy.to_dict(),
            "mismatch": snap.mismatch,
            "file_model": snap.file_model,
            "encoder_model": self.model,
            "path": str(self.path),
            "loaded_at": snap.loaded_at,
            "relevance": self._relevance_snapshot().status(self.relevance_path),
        }

    def relevance(self) -> RelevanceModel | None:
        """The relevance model in force (None: no file, refused or malformed), re-read when
        ``relevance_model.json`` changes."""
        return self._relevance_snapshot().model

    def relevance_policy(self) -> ConfidencePolicy | None:
        """The model's cut points on ``p_relevant`` (under the settings' rule), or None."""
        return self._relevance_snapshot().policy

    def relevance_in_force(self) -> tuple[RelevanceModel | None, ConfidencePolicy | None]:
        """Model and cut points from one (re)load, so a route never mixes two files."""
        snap = self._relevance_snapshot()
        return (snap.model, snap.policy) if snap.model is not None else (None, None)

    def _relevance_snapshot(self) -> _RelevanceLoaded:
        return self._relevance.current()

    def _load_relevance(self, key: FileKey | None) -> _RelevanceLoaded:
        now = dt.datetime.now(dt.UTC).timestamp()
        path = self.relevance_path
        if key is None:
            return _RelevanceLoaded(None, None, loaded_at=now)
        try:
            model = RelevanceModel.load(path)
        except (OSError, ValueError) as e:
            log.warning(
                "relevance model %s is malformed: %s; L3 hits are labelled by cosine "
                "(accept/skip from the thresholds). Re-run `ctx eval calibrate` or remove it.",
                path,
                e,
            )
            return _RelevanceLoaded(key, None, problem=str(e), loaded_at=now)
        model = model.with_provenance(loaded_from=str(path))
        policy = relevance_policy(model, self._defaults.rule, str(path))
        file_model = model.model
        if file_model is not None and model_name(file_model) != self.model:
            if self.on_mismatch == "warn":
                log.warning(
                    "RELEVANCE MODEL FOR ANOTHER EMBEDDING MODEL IN USE: %s was fitted for %r "
                    "but the encoder is %r; used anyway because "
                    "CTX_THRESHOLDS_MODEL_MISMATCH=warn. Re-run `ctx eval calibrate` with "
                    "model %r.",
                    path,
                    file_model,
                    self.model,
                    self.model,
                )
                return _RelevanceLoaded(
                    key, model, policy, mismatch=True, file_model=file_model, loaded_at=now
                )
            log.error(
                "relevance model %s was fitted for embedding model %r, but the encoder is %r: "
                "refused; L3 hits are labelled by cosine. Fix: re-run `ctx eval calibrate` "
                "with model %r (or set CTX_THRESHOLDS_MODEL_MISMATCH=warn).",
                path,
                file_model,
                self.model,
                self.model,
            )
            return _RelevanceLoaded(key, None, mismatch=True, file_model=file_model, loaded_at=now)
        if file_model is None:
            log.warning("relevance model %s names no embedding model; using it for %r", path,
                        self.model)  # fmt: skip
        log.log(
            logging.DEBUG if self._relevance.state.key is _UNREAD else logging.INFO,
            "relevance model (%s, features %s, accept p>=%.3f skip p>=%.3f) loaded from %s",
            model.kind,
            ",".join(model.features),
            policy.accept,
            policy.skip,
            path,
        )
        return _RelevanceLoaded(key, model, policy, file_model=file_model, loaded_at=now)

    def _snapshot(self) -> _Loaded:
        return self._thresholds.current()

    def _load(self, key: FileKey | None) -> _Loaded:
        now = dt.datetime.now(dt.UTC).timestamp()
        if key is None:
            log.debug("no thresholds file at %s; using %s", self.path, self._defaults.source)
            return _Loaded(key, self._defaults, loaded_at=now)
        raw, problem = _read_document(self.path)
        if problem:
            return _Loaded(key, _fallback(self._defaults, self.path, problem), loaded_at=now)
        assert raw is not None
        policy = ConfidencePolicy._from_document(raw, self.path, self._defaults.rule)
        if policy.model is None:
            log.warning(
                "thresholds file %s names no embedding model (written before thresholds were "
                "bound to their model); using accept=%.4f skip=%.4f for model %r. Re-run "
                "`ctx eval calibrate` to record the model.",
                self.path,
                policy.accept,
                policy.skip,
                self.model,
            )
            return _Loaded(key, policy, loaded_at=now)
        if model_name(policy.model) == self.model:
            # a reload while running is news (INFO); the first read is not (DEBUG)
            log.log(
                logging.DEBUG if self._thresholds.state.key is _UNREAD else logging.INFO,
                "confidence thresholds accept=%.4f skip=%.4f (model %r) loaded from %s",
                policy.accept,
                policy.skip,
                policy.model,
                self.path,
            )
            return _Loaded(key, policy, file_model=policy.model, loaded_at=now)
        if self.on_mismatch == "warn":
            log.warning(
                "THRESHOLDS FOR ANOTHER MODEL IN USE: %s was calibrated for embedding model "
                "%r but the encoder is %r; using accept=%.4f skip=%.4f anyway because "
                "CTX_THRESHOLDS_MODEL_MISMATCH=warn. Their labels are probably wrong: re-run "
                "`ctx eval calibrate` with model %r.",
                self.path,
                policy.model,
                self.model,
                policy.accept,
                policy.skip,
                self.model,
            )
            return _Loaded(key, policy, mismatch=True, file_model=policy.model, loaded_at=now)
        log.error(
            "thresholds file %s was calibrated for embedding model %r, but the encoder is %r: "
            "refused; using accept=%.2f skip=%.2f (%s). Fix: re-run `ctx eval calibrate` with "
            "model %r (or set CTX_THRESHOLDS_MODEL_MISMATCH=warn to use them anyway).",
            self.path,
            policy.model,
            self.model,
            self._defaults.accept,
            self._defaults.skip,
            self._defaults.source,
            self.model,
        )
        refused = replace(
            self._defaults,
            source=f"{self._defaults.source}; {self.path} refused (model {policy.model!r})",
        )
        return _Loaded(key, refused, mismatch=True, file_model=policy.model, loaded_at=now)


def _read_document(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"cannot be read as JSON ({e})"
    problem = _validate_document(raw)
    if problem:
        return None, problem
    return raw, None


def _fallback(fallback: ConfidencePolicy, path: Path, problem: str) -> ConfidencePolicy:
    log.warning(
        "thresholds file %s is malformed: %s; falling back to accept=%.2f skip=%.2f (%s). "
        "Re-run `ctx eval calibrate` or fix the file.",
        path,
        problem,
        fallback.accept,
        fallback.skip,
        fallback.source,
    )
    return fallback


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_pair(accept: Any, skip: Any) -> str | None:
    for name, v in (("accept", accept), ("skip", skip)):
        if not _is_number(v):
            return f'"{name}" must be a finite number, got {v!r}'
        if not -1.0 <= float(v) <= 1.0:
            return f'"{name}" = {v} is outside [-1, 1] (thresholds are cosine similarities)'
    if float(skip) > float(accept):
        return f'"skip" ({skip}) must not exceed "accept" ({accept})'
    return None


def _validate_document(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return f"expected a JSON object, got {type(raw).__name__}"
    missing = [k for k in ("accept", "skip") if k not in raw]
    if missing:
        return f"missing key(s) {', '.join(repr(k) for k in missing)}"
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        return f'"model" must be a string, got {model!r}'
    return _check_pair(raw["accept"], raw["skip"])
