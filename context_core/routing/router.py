"""ContextRouter: turns "the agent is about to do step X" into a bundle of provenanced context.

Why a router and not "stuff everything in the prompt": each step needs different context
(comparing vibration needs the live series and the manual's limits; calling an API needs the
cached response), every piece must say where it came from and how much to trust it, and L3
must never override real-time data. The :mod:`context_core.routing.intents` registry says what a
step
needs; this module fetches it and labels it.

Per route:

1. L3 (if the intent wants it) starts first on a small thread pool (on the event loop, in
   a greenlet of its own, when the store awaits there: the edge server's client), so
   embedding + vector search overlap the Redis reads; the result is awaited for at most
   ``l3_timeout_ms`` from submission. An error or a timeout leaves L3 out and sets
   ``degraded=True``: the agent still gets L1 + L2, which are authoritative.
2. L1 fields come from the in-process :class:`SessionState`.
3. The session is touched once (:meth:`SessionMemory.touch`): a route is session activity,
   so it slides the task contract's TTL (the contract lives for the task) and the idle
   clock. Then the L2 keys are read from the session's working memory (preferences from the
   session user's, :func:`context_core.routing.reads.read_prefs`); a *required* miss raises
   :class:`ContextMissError` after the trace record (with the miss) is written. A missing
   key this session had written is traced ``expired``, decided in Redis
   (:meth:`SessionMemory.key_expired`), so every process agrees.
4. Shared-namespace keys are read with the agent's id and the spec's declared purpose; a
   denied read is traced and left out (a *required* denied read re-raises).
5. L3 hits are labelled by the thresholds in force (:class:`ConfidencePolicy`, or a
   :class:`PolicySource` that reloads ``thresholds.json`` when it changes and refuses one
   calibrated for another model), under the policy's rule (``CTX_CONFIDENCE_RULE``, see
   :mod:`context_core.routing.confidence`). Design rule: when every hit is below skip L3 is left out
   entirely; otherwise confident hits are used and all other hits are passed with the note
   "for reference; real-time data wins".

   Hot (unmerged) knowledge is trust-scoped: the search only looks at the hot scopes the
   calling agent may see (system answers, its own private answers, and answers in the
   namespaces the intent declares, when the reader is granted the declared purpose and the
   writer holds ``write``; :func:`context_core.knowledge.memory.hot_visible`). A hot hit is
   never ``confident`` whatever its cosine: at most ``low_confidence``, with its confidence
   capped below ``accept`` and provenance naming it unreviewed and its writer, until the
   merge job has moved it into main. A merged answer keeps its scope: main is searched for
   curated points and the reader's scopes only
   (:func:`context_core.knowledge.memory.reader_filter`), and each merged hit passes the same
   ACL check, so org A's shared answer never reaches org B's agents after the merge either.
6. The bundle budget (:func:`context_core.routing.bundle.apply_budget`): at most ``max_fragments``
   fragments (the router's, or the intent's ``max_fragments``) are delivered, chosen by a
   documented priority; the others are listed in ``context_used["by_reference"]``.
   ``context_used["l1"/"l2"/"l3"/"l3_reference"/"ns"]`` list only what was delivered.
7. Fallback: a step query that refers to earlier teaching (:func:`teaching_cue`) with no
   main-collection hit at or above skip sets ``context_used["fallback"]``.
8. Delta (opt-in, ``delta=True``; :mod:`context_core.routing.delta`): the bundle's manifest is
   logged in the session's bundle log and diffed against ``since_bundle`` (one script call,
   timed as ``timings_ms["delta"]``); :attr:`ContextBundle.delta` says which fragments the
   base held unchanged, and :meth:`ContextBundle.to_delta_dict` is the delta wire form. A
   failed route (required miss or denied read) logs nothing.
9. One trace record is appended (schema in :mod:`context_core.traces`): ``l2.required``
   names the keys the spec requires (the others were optional), ``l2.contract_lost`` says
   the intent asked for the task contract and this session's contract is gone, each
   delivered fragment carries its citable tokens (:func:`context_core.traces.fragment_cites`)
   so CER can check that the output used it without the trace storing the values, and
   ``by_reference``, ``fallback`` and ``confidence`` (the thresholds and rule in force, with
   their source and model) are recorded too.

Fragment provenance is described in :mod:`context_core.routing.bundle` (the value types, re-exported
here); the exact-key L1/L2/namespace reads live in :mod:`context_core.routing.reads`. The touch
and the namespace reads are counted in the ``l2`` timing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from context_core import defaults
from context_core.concurrency import on_loop_now, spawn, wait_future
from context_core.errors import (
    AccessDeniedError,
    ConfigError,
    ContextMissError,
    PromptBindingError,
)
from context_core.knowledge.memory import UNREVIEWED, hot_scopes, hot_visible, scoped
from context_core.redis.ops import Cmd, Op
from context_core.routing.bundle import (
    LOW_CONFIDENCE_NOTE,
    ContextBundle,
    Fragment,
    Tier,
    apply_budget,
    confirm_path,
    hit_timestamp,
    hot_note,
    hours_since,
    reference_entry,
    teaching_cue,
)
from context_core.routing.bundle import Layer as Layer  # re-export: was defined here
from context_core.routing.confidence import ConfidencePolicy, PolicySource, relevance_policy
from context_core.routing.delta import DEFAULT_KEEP, BundleDelta, BundleLog
from context_core.routing.intents import IntentRegistry, IntentSpec, template_fields
from context_core.routing.reads import L2Trace, read_l1, read_l2, read_namespaces, read_prefs
from context_core.routing.relevance import query_length
from context_core.routing.shadow import ShadowSource
from context_core.traces import TraceWriter, fragment_entry, new_trace_id

if TYPE_CHECKING:
    from context_core.access.namespaces import Grant, NamespaceRegistry
    from context_core.knowledge.memory import KnowledgeMemory
    from context_core.knowledge.store import Hit
    from context_core.routing.prompts import PromptLibrary, RenderedPrompt
    from context_core.routing.relevance import RelevanceModel
    from context_core.session.state import SessionState
    from context_core.working_memory import WorkingMemory

__all__ = ["LOW_CONFIDENCE_NOTE", "ContextBundle", "ContextRouter", "Fragment"]

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAGMENTS = defaults.BUNDLE_MAX_FRAGMENTS


@dataclass
class _L3Outcome:
    hits: list[Hit] = field(default_factory=list)
    error: str | None = None
    ms: float = 0.0


@dataclass(frozen=True)
class _Run:
    """What one route knows from its start: the request, the spec, the policy snapshot."""

    state: SessionState
    intent: str
    spec: IntentSpec
    params: dict[str, Any]
    values: dict[str, Any]
    now: float
    t0: float
    trace_id: str
    agent_id: str | None
    skip_l3: str | None
    policy: ConfidencePolicy
    relevance: RelevanceModel | None
    p_policy: ConfidencePolicy | None


@dataclass(frozen=True)
class _L3Start:
    """Step 1: the L3 search submitted (``future`` None: not wanted) and its query."""

    wanted: bool
    query: str
    future: Future[_L3Outcome] | asyncio.Future[_L3Outcome] | None
    submitted: float


def _l2_trace() -> L2Trace:
    return {"requested": [], "required": [], "found": [], "missing": [], "expired": []}


def _ns_trace() -> dict[str, list[str]]:
    return {"requested": [], "found": [], "denied": []}


@dataclass
class _Exact:
    """Steps 2-4: the L1/L2/namespace fragments (ranked by tier), their traces, and the
    first required miss or denied read (the route raises it after the trace)."""

    ranked: list[tuple[Tier, Fragment]]
    l2_trace: L2Trace = field(default_factory=_l2_trace)
    ns_trace: dict[str, list[str]] = field(default_factory=_ns_trace)
    required_miss: ContextMissError | None = None
    required_denied: AccessDeniedError | None = None
    t_l1: float = 0.0
    t_l2: float = 0.0

    @property
    def failed(self) -> bool:
        return self.required_miss is not None or self.required_denied is not None


@dataclass(frozen=True)
class _L3Found:
    """Step 5: the L3 outcome, whether the route is degraded, whether a search completed."""

    outcome: _L3Outcome
    degraded: bool
    searched: bool
    t_l3: float


@dataclass(frozen=True)
class _Labelled:
    """Step 5, continued: the labelled hits as ranked fragments and as trace entries."""

    ranked: list[tuple[Tier, Fragment]]
    trace: list[dict[str, Any]]
    p_values: Sequence[float] | None
    signal: str
    shadow: dict[str, Any] | None = None


@dataclass(frozen=True)
class _Built:
    """Steps 6-8: the bundle and what the trace repeats of it."""

    bundle: ContextBundle
    delivered: list[Fragment]
    used: dict[str, Any]
    fallback: dict[str, Any] | None
    timings: dict[str, float]
    prompt: RenderedPrompt | None = None
    # a field whose policy is "fail" found no usable value: raised after the trace
    prompt_error: PromptBindingError | None = None


class ContextRouter:
    """Routes a step intent to L1/L2/L3/namespaces and returns a :class:`ContextBundle`.

    Thread-safe: one router serves many sessions concurrently. Call :meth:`close` (or use it
    as a context manager) to stop the L3 thread pool.
    """

    def __init__(
        self,
        *,
        wm: WorkingMemory,
        knowledge: KnowledgeMemory | None,
        policy: ConfidencePolicy | PolicySource,
        tracer: TraceWriter,
        namespaces: NamespaceRegistry | None = None,
        registry: IntentRegistry | None = None,
        l3_timeout_ms: float = defaults.L3_TIMEOUT_MS,
        l3_collection: str | None = None,
        l3_limit: int | None = None,
        l3_workers: int = 4,
        max_fragments: int = DEFAULT_MAX_FRAGMENTS,
        relevance: RelevanceModel | None = None,
        delta_keep: int = DEFAULT_KEEP,
        prompts: PromptLibrary | None = None,
    ) -> None:
        if l3_timeout_ms <= 0:
            raise ConfigError(f"l3_timeout_ms must be positive, got {l3_timeout_ms}")
        if isinstance(max_fragments, bool) or not isinstance(max_fragments, int):
            raise ConfigError(f"max_fragments must be an integer, got {max_fragments!r}")
        if max_fragments < 1:
            raise ConfigError(f"max_fragments must be at least 1, got {max_fragments}")
        if isinstance(delta_keep, bool) or not isinstance(delta_keep, int) or delta_keep < 1:
            raise ConfigError(f"delta_keep must be a positive integer, got {delta_keep!r}")
        self.wm = wm
        self.knowledge = knowledge
        self._policy = policy
        # a candidate calibration in shadow goes with the thresholds file a PolicySource reads
        self._shadow = (
            ShadowSource(policy.path, recheck_s=policy.recheck_s)
            if isinstance(policy, PolicySource)
            else None
        )
        # a fixed relevance model (with a fixed policy); a PolicySource loads its own file
        self._relevance = relevance
        self.max_fragments = max_fragments
        self.tracer = tracer
        self.namespaces = namespaces
        self.registry = registry or IntentRegistry.builtin()
        self.l3_timeout_ms = float(l3_timeout_ms)
        self.l3_collection: str = str(l3_collection or getattr(knowledge, "main", "knowledge_main"))
        self.hot_collection: str = getattr(knowledge, "hot", "hot_knowledge")
        self._model_checked = False
        self.l3_limit = l3_limit
        self.delta_keep = delta_keep
        self.prompts = prompts
        self._bundle_log: BundleLog | None = None
        self._pool = ThreadPoolExecutor(max_workers=l3_workers, thread_name_prefix="ctx-l3")

    @property
    def bundle_log(self) -> BundleLog:
        """Delta recall's log of each session's recent bundle manifests (made on first use;
        it lives like the session's contract: ``CTX_WM_CONTRACT_TTL_S``)."""
        if self._bundle_log is None:
            wm = self.wm
            self._bundle_log = BundleLog(
                wm._client,
                ttl_s=wm.contract_ttl_s,
                keep=self.delta_keep,
                min_replicas=wm.min_replicas,
                wait_ms=wm.replica_wait_ms,
            )
        return self._bundle_log

    @property
    def policy(self) -> ConfidencePolicy:
        """The thresholds in force now (a :class:`PolicySource` re-reads a changed file)."""
        if isinstance(self._policy, PolicySource):
            return self._policy.current()
        return self._policy

    def relevance_in_force(self) -> tuple[RelevanceModel | None, ConfidencePolicy | None]:
        """The relevance model labelling L3 hits now and its cut points on ``p_relevant``
        (``(None, None)``: the cosine thresholds label them)."""
        if isinstance(self._policy, PolicySource):
            return self._policy.relevance_in_force()
        if self._relevance is None:
            return None, None
        return self._relevance, relevance_policy(self._relevance, self._policy.rule)

    def policy_status(self) -> dict[str, Any]:
        """``{accept, skip, source, model, rule, mismatch, loaded_at, ...}`` for /metrics."""
        if isinstance(self._policy, PolicySource):
            return self._policy.status()
        return {**self._policy.to_dict(), "mismatch": False, "loaded_at": None}

    def close(self) -> None:
        # Don't wait: a hung L3 call must not hang shutdown (its thread is a daemon-like
        # worker; the result is discarded).
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ContextRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- template values --------------------------------------------------------------
    @staticmethod
    def _values(state: SessionState, params: Mapping[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {
            k: v for k, v in params.items() if isinstance(v, str | int | float) and v != ""
        }
        device = params.get("device") or state.last_device_id
        section = params.get("section", state.device_prefix)
        values.update(
            session_id=state.session_id,
            step=state.current_step,
            prev_step=state.current_step - 1 if state.current_step > 0 else None,
            device=device,
            device_prefix=section,
            user_query=state.user_query,
        )
        return values

    @staticmethod
    def _l3_query(spec: IntentSpec, values: Mapping[str, Any], params: Mapping[str, Any]) -> str:
        if isinstance(params.get("query"), str) and params["query"].strip():
            return str(params["query"]).strip()
        # Lenient: a missing template value (no device yet) drops out of the query text.
        lenient = {n: values.get(n) or "" for n in template_fields(spec.l3_query)}
        text = spec.l3_query.format_map(lenient)
        return re.sub(r"\s+", " ", text).strip(" :") or str(values.get("user_query", ""))

    # --- the route --------------------------------------------------------------------
    def route(
        self,
        state: SessionState,
        step_intent: str,
        *,
        params: Mapping[str, Any] | None = None,
        agent_id: str | None = None,
        skip_l3: str | None = None,
        delta: bool = False,
        since_bundle: str | None = None,
        preflight: Op[Any] | None = None,
        touch_guard: tuple[str, str, str] | None = None,
    ) -> ContextBundle:
        """The bundle for one step. ``skip_l3`` (a reason, e.g. the service is under load)
        leaves L3 out and marks the bundle degraded, as an L3 timeout would.

        ``preflight``: an operation (:mod:`context_core.redis.ops`) that must succeed before
        anything of the route counts, such as the service's check that the caller owns the
        session and sent its latest state. It goes in the route's own first round trip; if
        it raises, the route raises that before reading the replies, tracing or waiting for
        L3 (the reads sent with it are dropped unseen). ``touch_guard``: the activity touch
        only applies when that guard holds (:meth:`SessionMemory.touch_op`), so a refused
        route touches nothing.

        ``delta``: also log the bundle and diff it against ``since_bundle`` (a ``bundle_id``
        of this session's earlier delta routes; None, unknown or expired: a full delta); the
        result is in :attr:`ContextBundle.delta` (:mod:`context_core.routing.delta`).

        The steps, in order: :meth:`_start_l3` (1), :meth:`_read_exact` (2-4, L1, L2 and the
        shared namespaces), :meth:`_await_l3` and :meth:`_label_l3` (5), :meth:`_assemble`
        (6-9: the budget, the fallback, the delta, the prompt), :meth:`_record` (the trace), then
        :func:`_raise_failure` (a required miss or denied read) or the prompt's unbound
        ``fail`` field."""
        if since_bundle is not None and not delta:
            raise ValueError("route: since_bundle is only meaningful with delta=True")
        t0 = time.perf_counter()
        now = time.time()
        params = dict(params or {})
        spec = self.registry.get(step_intent)
        policy = self.policy  # one snapshot per route, even if the file changes meanwhile
        relevance, p_policy = self.relevance_in_force()
        run = _Run(
            state=state,
            intent=step_intent,
            spec=spec,
            params=params,
            values=self._values(state, params),
            now=now,
            t0=t0,
            trace_id=new_trace_id(),
            agent_id=agent_id,
            skip_l3=skip_l3,
            policy=policy,
            relevance=relevance,
            p_policy=p_policy,
        )
        l3 = self._start_l3(run)
        exact = self._read_exact(run, l3, preflight, touch_guard)
        found = self._await_l3(run, l3, wait=not exact.failed)
        labelled = self._label_l3(run, l3.query, found.outcome.hits)
        built = self._assemble(
            run, l3, exact, found, labelled, delta=delta, since_bundle=since_bundle
        )
        self._record(run, l3, exact, found, labelled, built)
        _raise_failure(run, exact)
        if built.prompt_error is not None:
            raise built.prompt_error
        return built.bundle

    def _start_l3(self, run: _Run) -> _L3Start:
        """Step 1: L3 starts first, so embedding and search overlap the Redis round trips."""
        spec = run.spec
        wanted = bool(spec.l3 and self.knowledge is not None and not run.skip_l3)
        query = self._l3_query(spec, run.values, run.params) if spec.l3 else ""
        future: Future[_L3Outcome] | asyncio.Future[_L3Outcome] | None = None
        if wanted:
            sections = self._sections(spec, run.values)
            args = (query, sections, run.agent_id, _declared(spec))
            if on_loop_now() and getattr(self.knowledge, "awaits_on_loop", False):
                future = spawn(self._search, *args)  # its round trip awaited on the loop
            else:
                future = self._pool.submit(self._search, *args)
        return _L3Start(wanted=wanted, query=query, future=future, submitted=time.perf_counter())

    def _read_exact(
        self,
        run: _Run,
        l3: _L3Start,
        preflight: Op[Any] | None,
        touch_guard: tuple[str, str, str] | None,
    ) -> _Exact:
        """Steps 2-4: L1 from the state; then the touch (a route is session activity), every
        L2 read and the namespace entries in one round trip (a second one only for the "ever
        written?" check of keys that missed). A failing round trip cancels L3."""
        state, spec, values, now = run.state, run.spec, run.values, run.now
        exact = _Exact(ranked=[("l1", f) for f in read_l1(state, spec, now)])
        exact.t_l1 = time.perf_counter()
        sm = self.wm.session(state.session_id)
        ops: list[Op[Any]] = [sm.touch_op(touch_guard)]
        for key_spec in spec.l2_keys:
            if key_spec.kind == "pref":
                org, user = state.auth_context.org, state.user_id
                ops.append(read_prefs(self.wm, org, user, key_spec, values, now, exact.l2_trace))
            else:
                ops.append(read_l2(sm, key_spec, values, run.params, now, exact.l2_trace))
        ns_cmds, ns_interpret = read_namespaces(
            self.namespaces, spec, values, run.agent_id, now, exact.ns_trace
        )
        ops.append(_replies_of(ns_cmds))
        if preflight is not None:
            ops.insert(0, preflight)
        try:
            results = self.wm.run_all(ops, f"route {state.session_id}")
        except BaseException:
            if l3.future is not None:
                l3.future.cancel()
            raise
        if preflight is not None:
            results = results[1:]
        _, *l2_results, ns_replies = results
        _take_l2(exact, spec, l2_results)
        contract_key = sm.key("contract", "current")
        exact.l2_trace["contract_lost"] = contract_key in exact.l2_trace["expired"]
        if exact.required_miss is None:  # else the entries read are dropped unseen
            for ns_frag, denied in ns_interpret(ns_replies):
                if ns_frag is not None:
                    exact.ranked.append(("namespace", ns_frag))
                if denied is not None and exact.required_denied is None:
                    exact.required_denied = denied
        exact.t_l2 = time.perf_counter()
        return exact

    def _await_l3(self, run: _Run, l3: _L3Start, *, wait: bool) -> _L3Found:
        """Step 5: the L3 result, awaited for what is left of ``l3_timeout_ms`` (not awaited,
        and cancelled, when the route is failing anyway: ``wait`` false)."""
        spec, future = run.spec, l3.future
        outcome = _L3Outcome(error=run.skip_l3) if spec.l3 and run.skip_l3 else _L3Outcome()
        # An intent that wants L3 on a router without knowledge memory is degraded too.
        degraded = bool(spec.l3 and not l3.wanted)
        searched = False  # an L3 search ran to completion for this route
        if future is not None and wait:
            remaining = self.l3_timeout_ms / 1000.0 - (time.perf_counter() - l3.submitted)
            try:
                outcome = wait_future(future, max(0.0, remaining))
            except FutureTimeout:
                if isinstance(future, Future):  # a spawned search finishes on its own
                    future.cancel()
                outcome = _L3Outcome(error=f"timeout after {self.l3_timeout_ms:g} ms")
            if outcome.error:
                degraded = True
                log.warning(
                    "L3 degraded for session %s intent %s: %s",
                    run.state.session_id,
                    run.intent,
                    outcome.error,
                )
            else:
                searched = True
        elif future is not None:
            future.cancel()
        return _L3Found(outcome, degraded, searched, t_l3=time.perf_counter())

    def _label_l3(self, run: _Run, query: str, hits: list[Hit]) -> _Labelled:
        """Step 5, continued: ``p_relevant`` for each hit when a fitted relevance model is in
        force (the labels then come from it and its cut points; otherwise from the cosine
        thresholds), and the labelled hits as ranked fragments."""
        relevance, p_policy = run.relevance, run.p_policy
        p_values = (
            relevance.predict_hits(hits, query_length(query))
            if relevance is not None and p_policy is not None and hits
            else None
        )
        ranked, hits_trace = self._label_hits(hits, run.now, run.policy, p_values, p_policy)
        signal = "cosine" if p_policy is None else "p_relevant"
        shadow = self._shadow_labels(run, query, hits)
        return _Labelled(
            ranked=ranked, trace=hits_trace, p_values=p_values, signal=signal, shadow=shadow
        )

    def _shadow_labels(self, run: _Run, query: str, hits: list[Hit]) -> dict[str, Any] | None:
        """``confidence.shadow``: the labels a candidate in shadow gives the same hits (the
        route itself keeps the calibration in force). None without a shadow or L3 hits."""
        shadow = self._shadow.take() if self._shadow is not None and hits else None
        if shadow is None:
            return None
        p_values = (
            shadow.relevance.predict_hits(hits, query_length(query))
            if shadow.relevance is not None
            else None
        )
        hot = [_is_hot(h.payload) for h in hits]
        return shadow.label([float(h.score) for h in hits], p_values, hot, run.policy.rule)

    def _assemble(
        self,
        run: _Run,
        l3: _L3Start,
        exact: _Exact,
        found: _L3Found,
        labelled: _Labelled,
        *,
        delta: bool,
        since_bundle: str | None,
    ) -> _Built:
        """Steps 6-8: the fragment budget, the fallback section, the delta (not for a
        failed route), the timings and the bundle."""
        state, outcome = run.state, found.outcome
        # 6. the budget
        cap = run.spec.max_fragments or self.max_fragments
        delivered, by_reference = apply_budget(exact.ranked + labelled.ranked, cap)
        used = _used(delivered)
        used["by_reference"] = [reference_entry(f) for f in by_reference]
        # 7. fallback: the user refers to earlier teaching and main L3 knows nothing of it
        fallback = None
        if found.searched:
            fallback = self._fallback(
                state, run.params, outcome.hits, run.p_policy or run.policy, labelled.p_values
            )
            if fallback is not None:
                used["fallback"] = fallback
        # 8. delta: log the manifest, diff against the client's base (not for a failed route)
        diff: BundleDelta | None = None
        t_delta = time.perf_counter()
        if delta and not exact.failed:
            diff = self.bundle_log.record(state.session_id, run.intent, delivered, since_bundle)
        delta_ms = (time.perf_counter() - t_delta) * 1000.0
        # 9. the prompt: the delivered fragments (and L1) bound into the intent's template
        prompt, prompt_error = None, None
        if self.prompts is not None and not exact.failed:
            try:
                prompt = self.prompts.render(run.spec.name, state, delivered)
            except PromptBindingError as e:
                prompt_error = e
        total_ms = (time.perf_counter() - run.t0) * 1000.0
        l3_ms = outcome.ms if not outcome.error else (found.t_l3 - l3.submitted) * 1000.0
        timings = {
            "l1": round((exact.t_l1 - l3.submitted) * 1000.0, 3),
            "l2": round((exact.t_l2 - exact.t_l1) * 1000.0, 3),
            "l3": round(l3_ms, 3),
            "total": round(total_ms, 3),
        }
        bundle = ContextBundle(
            session_id=state.session_id,
            step=state.current_step,
            intent=run.intent,
            fragments=tuple(delivered),
            degraded=found.degraded,
            # the delta's script call: the bundle's timings only (the trace's are a fixed set)
            timings_ms=timings if diff is None else {**timings, "delta": round(delta_ms, 3)},
            context_used=used,
            trace_id=run.trace_id,
            resolved_intent=run.spec.name,
            l2_missing=tuple(exact.l2_trace["missing"]),
            delta=diff,
            prompt=prompt,
        )
        return _Built(bundle, delivered, used, fallback, timings, prompt, prompt_error)

    def _record(
        self,
        run: _Run,
        l3: _L3Start,
        exact: _Exact,
        found: _L3Found,
        labelled: _Labelled,
        built: _Built,
    ) -> None:
        """The route's trace record (written for a failing route too, before it raises)."""
        spec, error = run.spec, found.outcome.error
        self.tracer.write_route(
            {
                "trace_id": run.trace_id,
                "session_id": run.state.session_id,
                "step": run.state.current_step,
                "intent": run.intent,
                "agent_id": run.agent_id,
                "l2": exact.l2_trace,
                "l3": {
                    "requested": bool(spec.l3),
                    "query": l3.query,
                    "hits": labelled.trace,
                    "used": any(f.layer == "L3" for f in built.delivered),
                    "error": error
                    if l3.wanted or run.skip_l3
                    else (None if not spec.l3 else "no knowledge memory configured"),
                    **({"confidence_signal": labelled.signal} if spec.l3 else {}),
                },
                "ns": exact.ns_trace,
                "fragments": [fragment_entry(f) for f in built.delivered],
                "by_reference": built.used["by_reference"],
                "fallback": built.fallback,
                "confidence": _confidence_trace(
                    run.policy, run.p_policy, run.relevance, labelled.shadow
                ),
                "degraded": found.degraded,
                "timings_ms": built.timings,
                **({"prompt": built.prompt.trace()} if built.prompt is not None else {}),
            },
            validate=False,  # built here from typed parts; tests/test_router.py checks them
        )

    def _fallback(
        self,
        state: SessionState,
        params: Mapping[str, Any],
        hits: Sequence[Hit],
        policy: ConfidencePolicy,
        p_values: Sequence[float] | None = None,
    ) -> dict[str, Any] | None:
        """The fallback section when the step's query refers to earlier teaching and no
        main-collection hit reaches skip (hot answers are unreviewed: they do not count).

        ``p_values`` (with ``policy`` the relevance model's cut points) replaces the cosines
        when the hits were labelled by ``p_relevant``."""
        raw = params.get("query")
        text = raw if isinstance(raw, str) and raw.strip() else state.user_query
        cue = teaching_cue(text or "")
        if cue is None:
            return None
        values = [float(h.score) for h in hits] if p_values is None else list(p_values)
        main = [
            v
            for h, v in zip(hits, values, strict=True)
            if not _is_hot(h.payload) and not math.isnan(v)
        ]
        best = max(main, default=None)
        if best is not None and best >= policy.skip:
            return None
        what = "best main hit" if p_values is None else "best main hit p_relevant"
        found = "no main-collection hit" if best is None else f"{what} {best:.3f}"
        return {
            "triggered": True,
            "reason": (
                f"the query refers to earlier teaching ({cue!r}) and L3 has nothing for it "
                f"({found} < skip {policy.skip:.3f}); answer, ask the user to confirm, and "
                "post the confirmed answer"
            ),
            "confirm_at": confirm_path(state.session_id),
        }

    # --- layers -----------------------------------------------------------------------
    def _check_model(self) -> None:
        """Once per router: the collection's recorded model must be the encoder's.

        Vectors of the same dimension from another model would search "fine" and return
        garbage; this turns that into a clear ModelMismatchError (and a degraded route).
        """
        if self._model_checked or self.knowledge is None:
            return
        from context_core.knowledge.store import check_model

        info = self.knowledge.store.info(self.l3_collection)
        if info is not None:
            enc = self.knowledge.encoder
            check_model(
                self.l3_collection,
                recorded_model=info.model,
                recorded_dim=info.dim,
                model=enc.name,
                dim=enc.dim,
            )
        self._model_checked = True

    @staticmethod
    def _sections(spec: IntentSpec, values: Mapping[str, Any]) -> list[str | None]:
        out: list[str | None] = []
        for tpl in spec.l3_sections or ("",):
            lenient = {n: values.get(n) or "" for n in template_fields(tpl)}
            sec = tpl.format_map(lenient).strip() or None
            if sec not in out:
                out.append(sec)
        return out

    def _search(
        self,
        query: str,
        sections: list[str | None],
        reader: str | None = None,
        declared: Mapping[str, frozenset[str]] | None = None,
    ) -> _L3Outcome:
        """Embed once, search each section, merge by score (ids de-duplicated).

        Hot points, and answers merged from them into main, are searched in ``reader``'s
        scopes only, and each hit carrying a scope (hot or merged) is checked against the
        namespaces' current ACLs (:func:`hot_visible`) before it may count.
        """
        t = time.perf_counter()
        assert self.knowledge is not None
        declared = declared or {}
        scopes = hot_scopes(reader, declared)
        acls: dict[str, dict[str, Grant]] = {}
        try:
            self._check_model()
            vector = cast("Sequence[float]", self.knowledge.encoder.encode_query(query))
            best: dict[str, Hit] = {}
            for section in sections:
                for hit in self.knowledge.search_vector(
                    vector,
                    section=section,
                    limit=self.l3_limit,
                    collection=self.l3_collection,
                    hot_scopes=scopes,
                    query=query,  # its sparse vector, for the sparse/hybrid modes
                ):
                    if scoped(hit.payload) and not hot_visible(
                        hit.payload, reader, declared, self.namespaces, acl_cache=acls
                    ):
                        continue
                    if hit.id not in best or hit.score > best[hit.id].score:
                        best[hit.id] = hit
        except Exception as e:  # any L3 failure degrades; it never fails the route
            log.warning("L3 search failed: %s: %s", type(e).__name__, e)
            return _L3Outcome(error=f"{type(e).__name__}: {e}", ms=(time.perf_counter() - t) * 1e3)
        if any(h.sparse_score is not None for h in best.values()):  # fused: rank order
            hits = sorted(best.values(), key=lambda h: (h.rank or len(best) + 1, -h.score))
        else:
            hits = sorted(best.values(), key=lambda h: h.score, reverse=True)
        return _L3Outcome(hits=hits, ms=(time.perf_counter() - t) * 1000.0)

    def _label_hits(
        self,
        hits: list[Hit],
        now: float,
        policy: ConfidencePolicy,
        p_values: Sequence[float] | None = None,
        p_policy: ConfidencePolicy | None = None,
    ) -> tuple[list[tuple[Tier, Fragment]], list[dict[str, Any]]]:
        """Label the hit list under the policy's rule; keep confident and low-confidence hits
        as fragments (with their budget tier).

        With ``p_values`` (each hit's ``p_relevant``) and ``p_policy`` (the relevance model's
        cut points) the labels come from the probabilities; ``relevance`` and ``confidence``
        stay the cosine, and each L3 fragment carries its ``p_relevant`` and which signal
        labelled it.

        A hot hit is capped at ``low_confidence`` (and its confidence just below ``accept``):
        nobody reviewed it, so no agent's answer is ever another agent's confident context.
        """
        ranked: list[tuple[Tier, Fragment]] = []
        traced: list[dict[str, Any]] = []
        cap = round(policy.accept - 1e-4, 4)
        by_p = p_values is not None and p_policy is not None
        if p_values is not None and p_policy is not None:
            labels = p_policy.label_hits(p_values)
            probs: Sequence[float | None] = p_values
        else:
            labels = policy.label_hits([float(h.score) for h in hits])
            probs = [None] * len(hits)
        for hit, label, p in zip(hits, labels, probs, strict=True):
            payload = hit.payload
            hot = _is_hot(payload)
            if hot and label == "confident":
                label = "low_confidence"
            entry: dict[str, Any] = {
                "id": hit.id,
                "score": float(hit.score),
                "label": label,
                "source": str(payload.get("source", "")),
                "section": payload.get("section"),
            }
            if p is not None:
                entry["p_relevant"] = round(p, 6)
            traced.append(entry)
            if label == "below_skip":
                continue
            coll = self.hot_collection if hot else self.l3_collection
            score = round(float(hit.score), 4)
            content: dict[str, Any] = {
                "text": payload.get("text", ""),
                "title": payload.get("title", ""),
                "heading_path": list(payload.get("heading_path", []) or []),
                "page": payload.get("source", ""),
            }
            note = "" if label == "confident" else LOW_CONFIDENCE_NOTE
            if hot:
                writer = payload.get("written_by") or None
                content.update(
                    trust=UNREVIEWED, written_by=writer, namespace=payload.get("namespace")
                )
                note = hot_note(writer, payload.get("namespace"))
            elif payload.get("merged_from"):
                content.update(
                    trust=str(payload.get("trust") or "reviewed"),
                    merged_from=payload.get("merged_from"),
                    written_by=payload.get("written_by"),
                )
            frag = Fragment(
                layer="L3",
                source=f"L3:{coll}:{hit.id}",
                content=content,
                relevance=score,
                freshness_hours=hours_since(hit_timestamp(payload), now),
                confidence=min(score, cap) if hot else score,
                label=label,
                note=note,
                p_relevant=round(p, 4) if p is not None else None,
                confidence_signal="p_relevant" if by_p else "cosine",
            )
            ranked.append(("confident_l3" if label == "confident" else "low_l3", frag))
        return ranked, traced


def _take_l2(exact: _Exact, spec: IntentSpec, l2_results: Sequence[Any]) -> None:
    """Rank the L2 replies by tier (required, contract, optional); note the first required
    miss."""
    for key_spec, got in zip(spec.l2_keys, l2_results, strict=True):
        if key_spec.kind == "pref":
            frags, err = got
        else:
            frag, err = got
            frags = [frag] if frag is not None else []
        tier: Tier = (
            "required"
            if key_spec.required
            else "contract"
            if key_spec.kind == "contract"
            else "optional_l2"
        )
        exact.ranked += [(tier, f) for f in frags]
        if err is not None and key_spec.required and exact.required_miss is None:
            exact.required_miss = err


def _raise_failure(run: _Run, exact: _Exact) -> None:
    """After the trace: a required miss (naming the intent and the trace), else a required
    namespace read that was denied."""
    required_miss = exact.required_miss
    if required_miss is not None:
        cause = str(required_miss).partition("; ")[2]
        raise ContextMissError(
            required_miss.key,
            f"intent {run.spec.name!r} requires it (trace {run.trace_id}); "
            + (cause or "run the step that produces it first or re-fetch the data"),
        ) from required_miss
    if exact.required_denied is not None:
        raise exact.required_denied


def _confidence_trace(
    policy: ConfidencePolicy,
    p_policy: ConfidencePolicy | None,
    model: RelevanceModel | None,
    shadow: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace's ``confidence``: the cosine thresholds in force (with the calibration
    ``version``), when a relevance model labelled the hits its cut points on ``p_relevant``
    (``relevance``), and a shadow candidate's labels (``shadow``) while one runs."""
    out = policy.to_dict()
    if shadow is not None:
        out["shadow"] = shadow
    if p_policy is not None and model is not None:
        out["relevance"] = {
            "accept": p_policy.accept,
            "skip": p_policy.skip,
            "source": p_policy.source,
            "model": p_policy.model,
            "kind": model.kind,
            "features": list(model.features),
        }
    return out


def _used(delivered: Sequence[Fragment]) -> dict[str, Any]:
    """``context_used`` for the delivered fragments: what the output should cite."""
    used: dict[str, Any] = {"l1": [], "l2": [], "l3": [], "l3_reference": [], "ns": []}
    for f in delivered:
        if f.layer == "L1":
            used["l1"].append(f.source.removeprefix("L1:session."))
        elif f.layer == "L2":
            used["l2"].append(f.source.removeprefix("L2:"))
        elif f.layer == "NS":
            used["ns"].append(f.source.removeprefix("NS:"))
        else:
            point = f.source.rpartition(":")[2]
            used["l3" if f.label == "confident" else "l3_reference"].append(point)
    return used


def _is_hot(payload: Mapping[str, Any]) -> bool:
    """An unmerged hot point: only hot points carry ``expires_at`` (the merge drops it) and
    ``trust = "unreviewed"``; either marks it, so a doubtful point is treated as unreviewed."""
    return "expires_at" in payload or payload.get("trust") == UNREVIEWED


def _declared(spec: IntentSpec) -> dict[str, frozenset[str]]:
    """Namespace -> purposes the intent declares: the shared hot scopes a route may read."""
    out: dict[str, set[str]] = {}
    for ns in spec.namespaces:
        out.setdefault(ns.namespace, set()).add(ns.purpose)
    return {name: frozenset(p) for name, p in out.items()}


def _replies_of(cmds: list[Cmd]) -> Op[list[Any]]:
    """Operation: send ``cmds`` (none: no round) and return their raw replies."""
    if not cmds:
        return []
    return list((yield cmds))
