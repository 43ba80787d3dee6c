"""L2 working memory: a session's tool results, step outputs and sensor series in Redis.

Why Redis keys look like ``wm:{<sid>}:<kind>:<ident>``: the braces are a Redis Cluster hash
tag, so one session's keys share a slot and the multi-key Lua scripts / transactions stay
legal on a cluster. Every key is built from a validated session id (:mod:`.keys`), and
:class:`SessionMemory` (bound to one session) is the only door to them: there is no method
taking a raw key for reading, so a session cannot read another's data.

Why everything decays: L2 is minutes-long memory. The default TTL is 15 minutes. A step's
output lives until the latest step that depends on it is expected to start, times a safety
factor (2 by default), and at least a floor ``min_ttl_s`` (``CTX_WM_MIN_TTL_S``, 60 s)::

    ttl = max(min_ttl_s, ceil((latest dependent's estimated start - now) * factor))

The floor exists because agents run late: when a dependent is due or overdue the remaining
time is ~0 or negative, yet that late step needs the value right now. The same rule runs in
Python (:meth:`AnchoredPlan.ttl`, used by ``apply_plan``) and in Lua (:data:`STEP_PUT_LUA`,
used by ``put_step_result``); an explicit ``ttl_s`` bypasses it.

:meth:`SessionMemory.apply_plan` stores the plan in Redis (``wm:{<sid>}:plan:current``) with
*absolute* start times and the factor, and re-EXPIREs the outputs already written. A later
:meth:`SessionMemory.put_step_result`, through any view in any process, reads that plan in
the same Lua call as the write, so "now" is the time of the write, not of the plan. Steps
outside the plan, or that nothing depends on, get the default TTL, as do all writes once
the stored plan has expired (it is kept as long as the longest TTL it can give). Pending
async tasks are the one exception: they have no TTL, since a forgotten task id is a lost
task.

How a session finds its own keys: a Set ``wm:{<sid>}:index`` (same hash tag, same slot)
lists them; every write adds its key inside the same Lua script as the write, and the index
lives at least as long as its longest member (no TTL while pending tasks exist).
:meth:`SessionMemory.keys`, :meth:`~SessionMemory.expire_all` (used by the lifecycle events)
and :meth:`~SessionMemory.clear` work from it, so their cost is O(keys of that session),
never a SCAN of the keyspace (which on Redis Cluster would have to walk every master).
Details and invariants: :mod:`.index`.

Why the task contract does not decay like the rest: it is what the user asked for, and a
session can run for an hour. The contract lives ``CTX_WM_CONTRACT_TTL_S`` (2 h) from the
session's last activity, refreshed by every event and route (:meth:`SessionMemory.touch`),
and its version history is kept ``CTX_WM_CONTRACT_HISTORY_TTL_S`` (30 d) for audit, bounded
to ``CTX_WM_CONTRACT_HISTORY_VERSIONS`` (50) versions of ``CTX_WM_CONTRACT_HISTORY_DAYS``
(7 d), older ones archived into the audit log as digests. A
session idle for ``CTX_SESSION_IDLE_S`` (90 s) is timed out by a sweep over the global
``ctx:activity`` Sorted Set: its data goes, its contract stays, marked ``expired``, until
the session resumes (:mod:`.lifetime`).

Every write passes the sanitize gateway first (API responses through ``clean_response``, so
they are also capped), so secrets never reach Redis.

Modules: :mod:`.keys` (key building, id validation), :mod:`.plan` (step plan and TTL rule),
:mod:`.base` (what every session view holds), :mod:`.index` (per-session key index, the
write scripts keeping it, and the sweeps over it), :mod:`.contract` (versioned task
contract and its status), :mod:`.lifetime` (activity, timeout, expired keys),
:mod:`.preferences` (per-user preferences), :mod:`.values` (``Loaded`` and value decoding),
:mod:`.memory` (the stores).
"""

from context_core.working_memory.contract import TaskContract
from context_core.working_memory.memory import SessionMemory, WorkingMemory
from context_core.working_memory.plan import AnchoredPlan, PlannedStep, StepPlan, ttl_from_plan
from context_core.working_memory.preferences import Preference, Preferences
from context_core.working_memory.values import Loaded

__all__ = [
    "AnchoredPlan",
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
