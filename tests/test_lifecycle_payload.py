"""The lifecycle's quick payload check (``_payload_fits``) says yes only where
``Signature.bind`` would bind: an event whose payload does not fit still gets the exact
``bad payload`` message the signature gives (tests/test_lifecycle.py covers the messages)."""

from __future__ import annotations

import inspect
import itertools
import types
from typing import Any

import pytest

from context_core.lifecycle import manager as lifecycle
from context_core.lifecycle.manager import LifecycleEvent, LifecycleManager


def _handler(ev: LifecycleEvent) -> Any:
    """The event's handler bound to a stand-in (its signature is the bound method's)."""
    return types.MethodType(getattr(LifecycleManager, f"_{ev.value}"), object())


def _binds(fn: Any, payload: dict[str, Any]) -> bool:
    try:
        inspect.signature(fn).bind(None, **payload)
    except TypeError:
        return False
    return True


def _payloads(fn: Any) -> list[dict[str, Any]]:
    """Every subset of the handler's keyword names, each with and without an unknown key
    and with the state's own name."""
    names = [n for n in list(inspect.signature(fn).parameters)[1:]]
    out: list[dict[str, Any]] = []
    for k in range(len(names) + 1):
        for combo in itertools.islice(itertools.combinations(names, k), 64):
            base = dict.fromkeys(combo, 1)
            out += [base, {**base, "no_such_field": 1}, {**base, "state": 1}]
    return out


@pytest.mark.parametrize("ev", list(LifecycleEvent), ids=lambda e: e.value)
def test_the_quick_check_never_accepts_what_bind_refuses(ev: LifecycleEvent) -> None:
    fn = _handler(ev)
    seen = {True: 0, False: 0}
    for payload in _payloads(fn):
        fits = lifecycle._payload_fits(fn, payload)
        binds = _binds(fn, payload)
        assert not fits or binds, f"{ev.value}: {sorted(payload)} fits but does not bind"
        # a payload it is unsure of goes to bind; for plain keyword handlers it is never unsure
        if lifecycle._payload_shape(fn) is not None:
            assert fits == binds, f"{ev.value}: {sorted(payload)}: fits {fits}, binds {binds}"
        seen[binds] += 1
    assert seen[True] and seen[False]  # both kinds were tried


def test_signatures_the_check_does_not_cover_go_to_bind() -> None:
    def positional_rest(state: Any, a: int, /, *rest: Any) -> None: ...

    def keyword_state(*, state: Any) -> None: ...

    def open_kwargs(state: Any, *, a: int, **more: Any) -> None: ...

    assert lifecycle._payload_shape(positional_rest) is None
    assert lifecycle._payload_fits(positional_rest, {}) is False
    assert lifecycle._payload_shape(keyword_state) is None
    assert lifecycle._payload_fits(open_kwargs, {"a": 1, "anything": 2}) is True
    assert lifecycle._payload_fits(open_kwargs, {"anything": 2}) is False  # a is required
    assert lifecycle._payload_fits(open_kwargs, {"a": 1, "state": 2}) is False
