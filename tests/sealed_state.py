"""Tests that must look inside a sealed L1 state (the trace, the last API result ...) open it
here with the service's own keys: CTX_STATE_KEYS when the test set it, else the automatic key
the service keeps in Redis (``svc:state-seal-key``, key id ``auto``). Clients cannot do this:
the answers' clear ``session`` info is all they read."""

from __future__ import annotations

from typing import Any

from redis_cluster import redis_client

from context_app.service.deps import SEAL_KEY, auto_keyring
from context_core.config import Settings
from context_core.gateway.identity import DEFAULT_ORG
from context_core.session.seal import StateKeyring, open_state

__all__ = ["Held", "keyring_of", "opened"]


class Held(str):
    """A sealed state as an answer returned it, with its session id (the answer's clear
    ``session`` info): sent in a JSON body it is the plain string."""

    sid: str

    @classmethod
    def of(cls, answer: dict[str, Any]) -> Held:
        held = cls(answer["state"])
        held.sid = answer["session"]["session_id"]
        return held


def keyring_of(settings: Settings) -> StateKeyring:
    """The keys the service built on ``settings`` seals with."""
    if settings.state_keys is not None:
        return StateKeyring.from_settings(settings)
    client = redis_client(settings.redis_url)
    try:
        raw = client.get(SEAL_KEY)
    finally:
        client.close()
    assert raw is not None, f"no {SEAL_KEY} in Redis: has the service started?"
    return auto_keyring(raw.decode() if isinstance(raw, bytes) else str(raw))


def opened(
    settings: Settings, state: str, session_id: str, org: str = DEFAULT_ORG
) -> dict[str, Any]:
    """The L1 fields sealed in ``state`` (as the service's wire JSON dict)."""
    wire = open_state(state, keyring_of(settings), org=org, session_id=session_id)
    return wire.model_dump(mode="json")
