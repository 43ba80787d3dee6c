"""Shared-state sync between cooperating agents that work on one task contract.

A planner, an executor and a verifier act on one session's task contract (L2,
:mod:`.contract`). Each agent keeps, in its L1 :class:`~context_core.session.state.SessionState`,
``shared_state_ref``: the contract version it last read or wrote. Three parts here:

* **Reading and writing with the reference.** :func:`read_shared` reads the contract and
  returns the agent's state pointing at that version; :func:`write_shared` writes a new version
  *based on* the state's ``shared_state_ref`` (the optimistic lock of
  :meth:`~.contract.ContractOps.update_contract`): when another agent wrote in between, it
  raises :class:`~context_core.errors.VersionConflictError` with ``current_version`` and
  nothing is written. :func:`update_shared` is the read-modify-write loop around it that
  retries on a conflict, so concurrent writers never lose an update.
* **The cheap check.** :func:`contract_since` answers "still version N?" with one ``HGET``
  of the contract's ``_version`` field, and reads the whole hash only when it changed (the
  same read serves ``GET /v1/sessions/{id}/contract?since_version=N``).
* **Polling.** :class:`ContractPoller` runs that check every ``interval_s`` (default
  :data:`DEFAULT_POLL_INTERVAL_S`, 500 ms) and hands each new version to a callback (on its
  own thread, :meth:`~ContractPoller.start`) or to the caller's loop (iterating it). Polls are
  scheduled at a fixed rate and optional jitter only ever *shortens* a wait, so a new version
  is seen at most ``interval_s`` (plus one round trip) after it was written. :meth:`stop`
  wakes a waiting poller at once.

Here the poller reads through the library's own contract reader against Redis (a
:class:`~.contract.ContractOps`, i.e. a ``SessionMemory``). Any other
:class:`ContractSource` works too: :class:`context_app.contract_client.HttpContractSource`
polls the service's ``GET /v1/sessions/{id}/contract?since_version=N`` (no HTTP here).
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from context_core.errors import ContextError, VersionConflictError
from context_core.session.state import SessionState
from context_core.working_memory.contract import ContractOps, TaskContract

__all__ = [
    "DEFAULT_POLL_INTERVAL_S",
    "ContractPoller",
    "ContractSource",
    "contract_since",
    "read_shared",
    "update_shared",
    "write_shared",
]

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 0.5
"""How often a :class:`ContractPoller` checks the contract's version (seconds)."""

_DEFAULT_RETRIES = 100


def _is_version(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _same_session(sm: ContractOps, state: SessionState) -> None:
    if state.session_id != sm.session_id:
        raise ContextError(
            f"the agent's state is for session {state.session_id!r}, the contract for "
            f"{sm.session_id!r}: use the SessionMemory of the state's own session"
        )


def contract_since(sm: ContractOps, since_version: int) -> TaskContract | None:
    """``None`` when the contract is still at ``since_version`` (one ``HGET``), else the
    current contract in full (any other version is news, a lower one too: version 0 means
    the contract is gone)."""
    if not _is_version(since_version):
        raise ContextError(f"since_version must be a non-negative int, got {since_version!r}")
    if sm.contract_version() == since_version:
        return None
    return sm.contract()


class ContractSource(Protocol):
    """What a :class:`ContractPoller` reads besides Redis: the contract of one session,
    unless it is still at ``since_version`` (``None``: always the contract)."""

    @property
    def session_id(self) -> str: ...

    def changed_since(self, since_version: int | None) -> TaskContract | None: ...


def _redis_changed_since(sm: ContractOps, since_version: int | None) -> TaskContract | None:
    return sm.contract() if since_version is None else contract_since(sm, since_version)


def read_shared(sm: ContractOps, state: SessionState) -> tuple[TaskContract, SessionState]:
    """The current contract, and ``state`` with ``shared_state_ref`` set to its version."""
    _same_session(sm, state)
    contract = sm.contract()
    return contract, state.advance(shared_state_ref=contract.version)


def write_shared(
    sm: ContractOps,
    state: SessionState,
    fields: Mapping[str, Any],
    *,
    corrected: bool = False,
) -> tuple[TaskContract, SessionState]:
    """Write ``fields`` as a new contract version based on ``state.shared_state_ref``.

    Returns the version written and ``state`` pointing at it. When another agent wrote since
    this one read, nothing is written and :class:`VersionConflictError` says both versions
    (``current_version``, ``expected_version``): read again, redo the change, retry (or use
    :func:`update_shared`). A state that never read the contract is refused.
    """
    _same_session(sm, state)
    base = state.shared_state_ref
    if base is None:
        raise ContextError(
            "write_shared: this agent's state has no shared_state_ref (it never read the "
            "contract); call read_shared() first, so the write names the version it is based on"
        )
    try:
        contract = sm.update_contract(fields, expected_version=base, corrected=corrected)
    except VersionConflictError as e:
        raise VersionConflictError(
            f"stale write refused: this agent acted on version {base} of the task contract of "
            f"session {sm.session_id!r} (its L1 shared_state_ref), which is now at version "
            f"{e.current_version}; read_shared() again, redo the change, and retry",
            current_version=e.current_version,
            expected_version=base,
        ) from e
    return contract, state.advance(shared_state_ref=contract.version)


def update_shared(
    sm: ContractOps,
    state: SessionState,
    change: Callable[[TaskContract], Mapping[str, Any]],
    *,
    corrected: bool = False,
    retries: int = _DEFAULT_RETRIES,
) -> tuple[TaskContract, SessionState]:
    """Read-modify-write with retry: ``change(current)`` returns the fields to write, and is
    called again on a fresh read whenever another writer got in first. Gives up after
    ``retries`` conflicts with the last :class:`VersionConflictError`."""
    if retries < 0:
        raise ContextError(f"update_shared: retries must be >= 0, got {retries}")
    attempt = 0
    while True:
        current, state = read_shared(sm, state)
        try:
            return write_shared(sm, state, change(current), corrected=corrected)
        except VersionConflictError:
            attempt += 1
            if attempt > retries:
                raise


class ContractPoller:
    """Polls one session's contract version and reports each new version.

    ``source`` is the session's ``SessionMemory`` (one ``HGET`` per poll while nothing
    changed) or any :class:`ContractSource`. ``since_version`` is the version the agent
    already knows (e.g. its ``shared_state_ref``); ``None`` reports the current contract on
    the first poll. Use it one of two ways:

    * callback: ``ContractPoller(sm, on_change=f).start()`` polls on a daemon thread and calls
      ``f(contract)`` there for each new version; :meth:`stop` (or leaving ``with poller:``)
      ends it;
    * iterator: ``for contract in poller:`` (or :meth:`changes`, with a timeout) polls in the
      caller's thread until :meth:`stop` is called (from another thread or inside the loop).

    A failed poll (Redis unreachable) or a failing callback is passed to ``on_error`` (logged
    when none is given) and polling goes on. ``jitter`` (0 <= jitter < 1) shortens each wait
    by up to that fraction of ``interval_s``, so pollers started together spread out.
    """

    def __init__(
        self,
        source: ContractOps | ContractSource,
        *,
        interval_s: float = DEFAULT_POLL_INTERVAL_S,
        since_version: int | None = None,
        on_change: Callable[[TaskContract], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ContextError(f"ContractPoller: interval_s must be > 0, got {interval_s!r}")
        if not 0.0 <= jitter < 1.0:
            raise ContextError(f"ContractPoller: jitter must be in [0, 1), got {jitter!r}")
        if since_version is not None and not _is_version(since_version):
            raise ContextError(
                f"ContractPoller: since_version must be a non-negative int, got {since_version!r}"
            )
        self.source = source
        self.session_id = source.session_id
        self._changed_since: Callable[[int | None], TaskContract | None]
        if isinstance(source, ContractOps):
            self._changed_since = functools.partial(_redis_changed_since, source)
        else:
            self._changed_since = source.changed_since
        self.interval_s = float(interval_s)
        self.jitter = float(jitter)
        self.on_change = on_change
        self.on_error = on_error
        self._rng = rng or random.Random()
        self._seen = since_version
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0
        self.errors = 0

    @property
    def seen_version(self) -> int | None:
        """The last version reported (or the ``since_version`` it started from)."""
        return self._seen

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self) -> TaskContract | None:
        """Check once now: the new contract when its version differs from the last one seen,
        else ``None``. Errors propagate (the loops below catch them)."""
        self.polls += 1
        contract = self._changed_since(self._seen)
        if contract is not None:
            self._seen = contract.version
        return contract

    def _wait_s(self) -> float:
        if not self.jitter:
            return self.interval_s
        return self.interval_s * (1.0 - self.jitter * self._rng.random())

    def _failed(self, e: Exception) -> None:
        self.errors += 1
        if self.on_error is not None:
            self.on_error(e)
        else:
            log.warning("contract poller of session %s: %s", self.session_id, e)

    def _checks(self, deadline: float | None = None) -> Iterator[TaskContract | None]:
        """One item per poll (``None``: unchanged or failed), at a fixed rate, until
        :meth:`stop` or ``deadline`` (monotonic)."""
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                result = self.poll()
            except Exception as e:  # a poller outlives a Redis blip; on_error decides
                self._failed(e)
                result = None
            yield result
            next_at += self._wait_s()
            now = time.monotonic()
            if next_at < now:  # a slow poll or callback: no burst of catch-up polls
                next_at = now
            if deadline is not None and next_at >= deadline:
                return
            if self._stop.wait(next_at - now):
                return

    def changes(self, *, timeout: float | None = None) -> Iterator[TaskContract]:
        """Each new version, polled in the caller's thread, until :meth:`stop` or
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for contract in self._checks(deadline):
            if contract is not None:
                yield contract

    def __iter__(self) -> Iterator[TaskContract]:
        return self.changes()

    def start(self) -> ContractPoller:
        """Poll on a daemon thread, calling ``on_change`` for each new version."""
        if self.on_change is None:
            raise ContextError("ContractPoller.start needs on_change (or iterate the poller)")
        if self.running:
            raise ContextError("ContractPoller is already running")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"contract-poller-{self.session_id}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        callback = self.on_change
        assert callback is not None
        for contract in self._checks():
            if contract is None:
                continue
            try:
                callback(contract)
            except Exception as e:
                self._failed(e)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop polling (a waiting poller wakes at once) and join its thread, unless called
        from the poller's own callback."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if t.is_alive():
                raise ContextError(
                    f"contract poller of session {self.session_id!r} did not stop within "
                    f"{timeout} s (a callback still running?)"
                )
            self._thread = None

    def __enter__(self) -> ContractPoller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
