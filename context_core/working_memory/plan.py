"""The step dependency plan and the TTL rule it implies for step outputs.

A step's output is only worth keeping until the last step that reads it has started; the
plan says when that is expected, and the rule turns it into a TTL with a safety factor
(plans slip) and a floor (``min_ttl_s``, ``CTX_WM_MIN_TTL_S``, 60 s by default)::

    ttl = max(min_ttl_s, ceil((latest dependent's estimated start - now) * factor))

A step nobody depends on (or one outside the plan) gets the default TTL. The floor is for a
dependent that is due or already overdue: agents run late, and the late one needs the
value *now*; a 1 s TTL would hand it a miss instead.

The agent states a plan in *relative* time (:class:`StepPlan`, "s3 starts in 120 s"), which
means nothing to a process reading it a minute later. So what is stored is an
:class:`AnchoredPlan`: the same graph with *absolute* epoch start times and the factor, in
one Hash per session. Any view, in any process, computes the remaining time from it, and
:data:`STEP_PUT_LUA` applies the rule inside Redis, atomically with the step write.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from context_core import defaults
from context_core.errors import ContextError
from context_core.working_memory.index import INDEX_ADD_LUA

__all__ = [
    "DEFAULT_MIN_TTL_S",
    "STEP_PUT_LUA",
    "AnchoredPlan",
    "PlannedStep",
    "StepPlan",
    "clamp_ttl",
    "ttl_from_plan",
]

#: Default floor of a plan-derived TTL (``Settings.wm_min_ttl_s``).
DEFAULT_MIN_TTL_S = defaults.WM_MIN_TTL_S


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """A step of the agent's plan; ``est_start_s`` is seconds from now."""

    step_id: str
    depends_on: tuple[str, ...] = ()
    est_start_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StepPlan:
    """The step dependency graph that decides how long each step's output must live."""

    steps: Mapping[str, PlannedStep]

    def __post_init__(self) -> None:
        for sid, step in self.steps.items():
            if sid != step.step_id:
                raise ContextError(f"StepPlan: key {sid!r} holds step {step.step_id!r}")
            if not math.isfinite(step.est_start_s):
                raise ContextError(f"StepPlan: step {sid!r} has est_start_s {step.est_start_s}")
            unknown = [d for d in step.depends_on if d not in self.steps]
            if unknown:
                raise ContextError(
                    f"StepPlan: step {sid!r} depends on unknown step(s) {', '.join(unknown)}"
                )

    @classmethod
    def of(cls, *steps: PlannedStep) -> StepPlan:
        return cls({s.step_id: s for s in steps})

    def dependents(self, step_id: str) -> list[PlannedStep]:
        return [s for s in self.steps.values() if step_id in s.depends_on]


def ttl_from_plan(
    step_id: str,
    plan: StepPlan,
    *,
    default_ttl_s: int,
    factor: float = 2.0,
    min_ttl_s: int = DEFAULT_MIN_TTL_S,
) -> int:
    """Seconds ``step_id``'s output must live: latest dependent's est. start x ``factor``.

    With no dependent step the output has nobody waiting for it: ``default_ttl_s``. The
    result is rounded up and at least ``min_ttl_s`` (a dependent that is due or overdue
    still needs the value, and may be running late).
    """
    deps = plan.dependents(step_id)
    if not deps:
        return int(default_ttl_s)
    latest = max(s.est_start_s for s in deps)
    return clamp_ttl(latest * factor, min_ttl_s)


def clamp_ttl(seconds: float, min_ttl_s: int = 1) -> int:
    """Whole seconds, rounded up, at least ``min_ttl_s`` and never below 1 (EXPIRE with 0
    or less would delete the key)."""
    return max(1, int(min_ttl_s), math.ceil(seconds))


@dataclass(frozen=True, slots=True)
class AnchoredPlan:
    """A :class:`StepPlan` pinned to the wall clock: what is stored for later writers.

    ``start_at`` holds absolute epoch seconds, so the remaining time is right whoever reads
    the plan and whenever; ``factor`` travels with it so every writer applies the same rule.
    """

    applied_at: float
    factor: float
    start_at: Mapping[str, float]
    depends_on: Mapping[str, tuple[str, ...]]

    @classmethod
    def anchor(cls, plan: StepPlan, *, now: float, factor: float = 2.0) -> AnchoredPlan:
        if not (math.isfinite(factor) and factor > 0):
            raise ContextError(f"apply_plan: factor must be a positive number, got {factor}")
        return cls(
            applied_at=now,
            factor=float(factor),
            start_at={sid: now + s.est_start_s for sid, s in plan.steps.items()},
            depends_on={sid: tuple(s.depends_on) for sid, s in plan.steps.items()},
        )

    def until(self, step_id: str) -> float | None:
        """Absolute estimated start of the latest step depending on ``step_id``, if any."""
        starts = [self.start_at[s] for s, deps in self.depends_on.items() if step_id in deps]
        return max(starts) if starts else None

    def ttl(
        self, step_id: str, *, now: float, default_ttl_s: int, min_ttl_s: int = DEFAULT_MIN_TTL_S
    ) -> int:
        """The TTL rule at time ``now`` (mirrored in :data:`STEP_PUT_LUA`)."""
        until = self.until(step_id)
        if until is None:
            return int(default_ttl_s)
        return clamp_ttl((until - now) * self.factor, min_ttl_s)

    def keep_s(self, *, now: float, default_ttl_s: int, min_ttl_s: int = DEFAULT_MIN_TTL_S) -> int:
        """How long to keep the stored plan: the longest TTL it can still hand out.

        TTLs from the plan only shrink as time passes, so a plan kept this long outlives
        every output it governs; never less than the default TTL, so a plan of short steps
        is still there for the session's next writes.
        """
        ttls = [
            self.ttl(s, now=now, default_ttl_s=default_ttl_s, min_ttl_s=min_ttl_s)
            for s in self.start_at
        ]
        return max([int(default_ttl_s), *ttls])

    def relative(self, now: float) -> StepPlan:
        """The plan as seen at ``now``: estimated starts in seconds from then (may be < 0)."""
        return StepPlan.of(
            *(PlannedStep(s, self.depends_on[s], at - now) for s, at in self.start_at.items())
        )

    # ---- storage: Hash wm:{<sid>}:plan:current ------------------------------------------
    def to_hash(self) -> dict[str, str]:
        """``_applied_at``, ``_factor``, ``step:<id>`` = JSON ``[start_at, [deps]]``, and
        ``until:<id>`` (latest dependent's start) for the Lua side of the rule."""
        h = {"_applied_at": repr(self.applied_at), "_factor": repr(self.factor)}
        for s, at in self.start_at.items():
            h[f"step:{s}"] = json.dumps([at, list(self.depends_on[s])])
            until = self.until(s)
            if until is not None:
                h[f"until:{s}"] = repr(until)
        return h

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> AnchoredPlan | None:
        if "_factor" not in h:
            return None
        steps = {k[5:]: json.loads(v) for k, v in h.items() if k.startswith("step:")}
        return cls(
            applied_at=float(h["_applied_at"]),
            factor=float(h["_factor"]),
            start_at={s: float(v[0]) for s, v in steps.items()},
            depends_on={s: tuple(v[1]) for s, v in steps.items()},
        )


# Write a step result with its TTL decided from the stored plan, atomically with the write
# (so a concurrent apply_plan is either seen or re-EXPIREs the key after). Mirrors
# AnchoredPlan.ttl: keep the two in step.
# The step key is listed in the session's key index in the same call (see .index).
# KEYS: 1 step hash, 2 plan hash, 3 key index.  ARGV: 1 now, 2 explicit ttl or '',
# 3 default ttl, 4 step id, 5 min ttl (the floor), 6.. field, value pairs.
# Returns the TTL set.
STEP_PUT_LUA = (
    INDEX_ADD_LUA
    + """
local ttl = tonumber(ARGV[2])
if not ttl then
  local plan = redis.call('HMGET', KEYS[2], '_factor', 'until:' .. ARGV[4])
  if plan[1] and plan[2] then
    local left = (tonumber(plan[2]) - tonumber(ARGV[1])) * tonumber(plan[1])
    ttl = math.max(1, tonumber(ARGV[5]), math.ceil(left))
  else
    ttl = tonumber(ARGV[3])
  end
end
redis.call('DEL', KEYS[1])
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ttl)
index_add(KEYS[3], ttl, KEYS[1])
return ttl
"""
)
