"""The step dependency plan and the TTL rule it implies for step outputs.

A step's output is only worth keeping until the last step that reads it has started; the
plan says when that is expected, and :func:`ttl_from_plan` turns it into a TTL with a safety
factor (plans slip).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from context_core.errors import ContextError

__all__ = ["PlannedStep", "StepPlan", "ttl_from_plan"]


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


def ttl_from_plan(step_id: str, plan: StepPlan, *, default_ttl_s: int, factor: float = 2.0) -> int:
    """Seconds ``step_id``'s output must live: latest dependent's est. start x ``factor``.

    With no dependent step the output has nobody waiting for it: ``default_ttl_s``. The
    result is rounded up and at least 1 s (a dependent already due still needs the value).
    """
    deps = plan.dependents(step_id)
    if not deps:
        return int(default_ttl_s)
    latest = max(s.est_start_s for s in deps)
    return max(1, math.ceil(latest * factor))
