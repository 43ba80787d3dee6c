"""A candidate calibration in shadow: routes also label their hits under it, for comparison.

``ctx eval thresholds shadow <version>`` writes a small marker,
``<reports>/calibrations/shadow.json`` (next to ``thresholds.json``; the path comes from
:func:`shadow_path_for`), holding the candidate's cosine pair and, when it has one, its
relevance model. While the marker is in force every route still labels its hits with the
calibration *in force* (what the agent gets does not change) and additionally records in its
trace, under ``confidence.shadow``, the labels the candidate would have given the same hits.
``ctx eval thresholds shadow-report`` then reads the traces.

The marker is read like ``thresholds.json``: at most one ``os.stat`` per
``CTX_POLICY_RECHECK_S`` seconds (a shadow start or stop reaches routes within that bound),
re-read when it changes, a malformed marker logged and ignored. It is **bounded**: ``until``
(an ISO-8601 UTC time) and ``max_routes`` end it by themselves. The route count is kept per
process (reset when the marker changes): a service with N worker processes shadows at most
N x ``max_routes`` routes, and the marker's ``until`` is the bound that holds across processes.
``ctx eval thresholds shadow-stop`` removes the marker.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from context_core.routing.confidence import ConfidencePolicy, relevance_policy
from context_core.routing.file_watch import NOT_DUE, FileKey, FileWatch
from context_core.routing.relevance import RelevanceModel

__all__ = [
    "CALIBRATIONS_DIR",
    "SHADOW_FILE",
    "Shadow",
    "ShadowSource",
    "calibrations_dir_for",
    "shadow_path_for",
]

log = logging.getLogger(__name__)

CALIBRATIONS_DIR = "calibrations"
SHADOW_FILE = "shadow.json"

Label = Literal["confident", "low_confidence", "below_skip"]


def calibrations_dir_for(thresholds_path: Path | str) -> Path:
    """Where calibration versions live for a thresholds file: ``<dir>/calibrations`` for the
    router's ``thresholds.json``, ``<dir>/calibrations_<stem>`` for any other file."""
    path = Path(thresholds_path)
    if path.name == "thresholds.json":
        return path.with_name(CALIBRATIONS_DIR)
    return path.with_name(f"{CALIBRATIONS_DIR}_{path.stem}")


def shadow_path_for(thresholds_path: Path | str) -> Path:
    """The shadow marker that goes with a thresholds file."""
    return calibrations_dir_for(thresholds_path) / SHADOW_FILE


@dataclass(frozen=True, slots=True)
class Shadow:
    """A candidate in shadow: its cosine pair and (optionally) its relevance model."""

    version: str
    accept: float
    skip: float
    relevance: RelevanceModel | None
    until: dt.datetime | None
    max_routes: int | None

    def expired(self, now: dt.datetime, routes: int) -> bool:
        if self.until is not None and now >= self.until:
            return True
        return self.max_routes is not None and routes >= self.max_routes

    @classmethod
    def from_dict(cls, doc: Any) -> Shadow:
        """Parse a marker document; ValueError names the bad field."""
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        version = doc.get("version")
        if not isinstance(version, str) or not version:
            raise ValueError('"version" must be a non-empty string')
        thr = doc.get("thresholds")
        if not isinstance(thr, dict):
            raise ValueError('"thresholds" must be an object with "accept" and "skip"')
        try:
            accept, skip = float(thr["accept"]), float(thr["skip"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f'"thresholds" needs numeric "accept" and "skip" ({e})') from None
        if not -1.0 <= skip <= accept <= 1.0:
            raise ValueError(f'"thresholds": need -1 <= skip <= accept <= 1, got {accept}/{skip}')
        rel = doc.get("relevance")
        relevance = RelevanceModel.from_dict(rel) if rel is not None else None
        if relevance is not None and (relevance.accept is None or relevance.skip is None):
            raise ValueError('"relevance" has no accept/skip cut points on p_relevant')
        until_raw = doc.get("until")
        until = None
        if until_raw is not None:
            try:
                until = dt.datetime.fromisoformat(str(until_raw))
            except ValueError:
                raise ValueError(f'"until" must be an ISO-8601 time, got {until_raw!r}') from None
            if until.tzinfo is None:
                until = until.replace(tzinfo=dt.UTC)
        max_routes = doc.get("max_routes")
        if max_routes is not None and (
            isinstance(max_routes, bool) or not isinstance(max_routes, int) or max_routes < 1
        ):
            raise ValueError(f'"max_routes" must be a positive integer, got {max_routes!r}')
        return cls(version, accept, skip, relevance, until, max_routes)

    def label(
        self,
        scores: Sequence[float],
        p_values: Sequence[float] | None,
        hot: Sequence[bool],
        rule: Literal["design", "per_hit"],
    ) -> dict[str, Any]:
        """The trace's ``confidence.shadow``: the labels the candidate gives these hits.

        ``p_values`` are the hits' ``p_relevant`` under the candidate's own model (None when
        it has none: its cosine pair labels them). A hot hit is capped at ``low_confidence``
        as the router caps it.
        """
        if self.relevance is not None and p_values is not None:
            policy = relevance_policy(self.relevance, rule, f"shadow {self.version}")
            labels = policy.label_hits(p_values)
            signal = "p_relevant"
            accept, skip = policy.accept, policy.skip
        else:
            policy = ConfidencePolicy(self.accept, self.skip, f"shadow {self.version}", rule=rule)
            labels = policy.label_hits(scores)
            signal = "cosine"
            accept, skip = self.accept, self.skip
        capped: list[Label] = [
            "low_confidence" if h and lab == "confident" else lab
            for lab, h in zip(labels, hot, strict=True)
        ]
        out: dict[str, Any] = {
            "version": self.version,
            "accept": accept,
            "skip": skip,
            "signal": signal,
            "labels": capped,
        }
        if signal == "p_relevant" and p_values is not None:
            out["p_relevant"] = [round(float(p), 6) for p in p_values]
        return out


class ShadowSource:
    """The shadow marker in force, re-read when it changes; None when there is none, it is
    malformed, or it has run its course (time or route count)."""

    def __init__(
        self,
        thresholds_path: Path | str,
        *,
        recheck_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = shadow_path_for(thresholds_path)
        # the marker is stat-ed at most once per recheck_s seconds (0: on every take)
        self.recheck_s = float(recheck_s)
        self._watch = FileWatch(self.path, self.recheck_s, clock=clock)
        self._lock = threading.Lock()
        self._key: FileKey | Literal["unread"] | None = "unread"
        self._shadow: Shadow | None = None
        self._routes = 0

    def take(self) -> Shadow | None:
        """The shadow for this route (counting it against ``max_routes``), or None."""
        looked = self._watch.look()
        key = self._key if looked == NOT_DUE else looked
        with self._lock:
            if key != self._key and key != "unread":
                self._key, self._routes = key, 0
                self._shadow = self._load() if key is not None else None
            shadow = self._shadow
            if shadow is None:
                return None
            if shadow.expired(dt.datetime.now(dt.UTC), self._routes):
                return None
            self._routes += 1
            return shadow

    def _load(self) -> Shadow | None:
        try:
            shadow = Shadow.from_dict(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            log.warning(
                "shadow marker %s is malformed: %s; no shadow labels are recorded. Fix: "
                "`ctx eval thresholds shadow-stop`, then start the shadow again.",
                self.path,
                e,
            )
            return None
        log.info("calibration %s in shadow (from %s)", shadow.version, self.path)
        return shadow
