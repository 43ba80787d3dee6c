"""L2 working memory: a session's tool results, step outputs and sensor series in Redis.

Why Redis keys look like ``wm:{<sid>}:<kind>:<ident>``: the braces are a Redis Cluster hash
tag, so one session's keys share a slot and the multi-key Lua scripts / transactions stay
legal on a cluster. Every key is built from a validated session id (:mod:`.keys`), and
:class:`SessionMemory` (bound to one session) is the only door to them: there is no method
taking a raw key for reading, so a session cannot read another's data.

Why everything decays: L2 is minutes-long memory. The default TTL is 15 minutes; a step's
output lives until the latest step that depends on it is expected to start, times two
(:func:`ttl_from_plan`), and :meth:`SessionMemory.apply_plan` re-EXPIREs keys when the plan
changes. Pending async tasks are the one exception: they have no TTL, since a forgotten task
id is a lost task.

Every write passes the sanitize gateway first (API responses through ``clean_response``, so
they are also capped), so secrets never reach Redis.

Modules: :mod:`.keys` (key building, id validation), :mod:`.plan` (step plan and TTL rule),
:mod:`.contract` (versioned task contract), :mod:`.preferences` (per-user preferences),
:mod:`.memory` (the stores).
"""

from context_core.working_memory.contract import TaskContract
from context_core.working_memory.memory import Loaded, SessionMemory, WorkingMemory
from context_core.working_memory.plan import PlannedStep, StepPlan, ttl_from_plan
from context_core.working_memory.preferences import Preference, Preferences

__all__ = [
    "Loaded",
    "PlannedStep",
    "Preference",
    "Preferences",
    "SessionMemory",
    "StepPlan",
    "TaskContract",
    "WorkingMemory",
    "ttl_from_plan",
]
