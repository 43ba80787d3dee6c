"""Sealed L1 state (context_core.session.seal) and the auth context encrypted in memory.

Keys are generated here, per test run; none is committed."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re

import pytest

from context_core.config import get_settings
from context_core.errors import ConfigError, PersistenceRefusedError
from context_core.gateway.sanitize import Gateway
from context_core.session.seal import (
    LEGACY_UNTIL,
    SealedStateError,
    StateCodec,
    StateKeyring,
    open_state,
    seal_state,
)
from context_core.session.state import AuthContext, SessionState
from context_core.session.wire import WireState

QUERY = "why does PUMP-7731 rattle at night"
DEVICE = "PUMP-7731-XQ"
ORG = "org-alpha"
HMAC_KEY = b"k" * 32


def _ring(*kids: str) -> StateKeyring:
    return StateKeyring.parse(",".join(StateKeyring.new_entry(k) for k in kids))


def _wire(session_id: str = "s-seal") -> WireState:
    auth = AuthContext.from_token("agent-a", "tok-secret", ("diagnostics",), org=ORG)
    state = SessionState.start(session_id, "u-1", QUERY, gateway=Gateway(), auth=auth)
    state = state.advance(current_step=2, last_device_id=DEVICE)
    state = state.record_tool_call("read_vibration", {"device": DEVICE}, call_id="c1")
    return WireState.of(state, HMAC_KEY, version=3, nonce="ab" * 16)


def _decoded(token: str) -> bytes:
    out = b""
    for part in token.split("."):
        try:
            out += base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except ValueError:
            continue
    return out


def test_the_sealed_state_reveals_nothing_when_decoded() -> None:
    ring = _ring("k1")
    wire = _wire()
    token = seal_state(wire, ring, org=ORG)
    assert re.fullmatch(r"ctx1\.k1\.[A-Za-z0-9_-]+", token)
    raw = _decoded(token) + token.encode()
    for planted in (QUERY, DEVICE, "PUMP", "7731", "rattle", "read_vibration", ORG, "agent-a",
                    "diagnostics", "s-seal", "u-1"):  # fmt: skip
        assert planted.encode() not in raw, planted
    opened = open_state(token, ring, org=ORG, session_id="s-seal")
    assert opened.model_dump(exclude={"sig"}) == wire.model_dump(exclude={"sig"})
    assert opened.user_query == QUERY and opened.version == 3 and opened.trace[0].call_id == "c1"
    assert seal_state(wire, ring, org=ORG) != token  # a fresh nonce every time


def test_tampered_other_org_other_session_other_key_are_refused() -> None:
    ring = _ring("k1")
    token = seal_state(_wire(), ring, org=ORG)
    head, _, data = token.rpartition(".")
    flipped = data[:10] + ("A" if data[10] != "A" else "B") + data[11:]
    with pytest.raises(SealedStateError, match="altered, or sealed for another"):
        open_state(f"{head}.{flipped}", ring, org=ORG, session_id="s-seal")
    with pytest.raises(SealedStateError, match="another session or organisation"):
        open_state(token, ring, org="org-beta", session_id="s-seal")
    with pytest.raises(SealedStateError, match="another session or organisation"):
        open_state(token, ring, org=ORG, session_id="s-other")
    stranger = _ring("k1")  # same key id, another key
    with pytest.raises(SealedStateError, match="does not open"):
        open_state(token, stranger, org=ORG, session_id="s-seal")
    with pytest.raises(SealedStateError, match="key id 'k0'"):
        open_state(token.replace("ctx1.k1.", "ctx1.k0.", 1), ring, org=ORG, session_id="s-seal")
    with pytest.raises(SealedStateError, match="not a sealed state"):
        open_state(json.dumps(_wire().model_dump()), ring, org=ORG, session_id="s-seal")
    with pytest.raises(SealedStateError, match="over the 100"):
        open_state(token, ring, org=ORG, session_id="s-seal", max_chars=100)
    err = SealedStateError("x")
    assert (err.http_status, err.error_code) == (403, "state_refused")


def test_rotation_new_key_seals_old_keys_open_retired_keys_refused() -> None:
    old = _ring("k1")
    old_entry = ",".join(f"{k}:{base64.urlsafe_b64encode(v).decode()}" for k, v in old.keys.items())
    rotated = StateKeyring.parse(StateKeyring.new_entry("k2") + "," + old_entry)
    assert rotated.current == "k2" and set(rotated.keys) == {"k1", "k2"}
    before = seal_state(_wire(), old, org=ORG)
    assert open_state(before, rotated, org=ORG, session_id="s-seal").version == 3
    after = seal_state(_wire(), rotated, org=ORG)
    assert after.startswith("ctx1.k2.")
    retired = StateKeyring("k2", {"k2": rotated.keys["k2"]})
    assert open_state(after, retired, org=ORG, session_id="s-seal").version == 3
    with pytest.raises(SealedStateError, match=r"key id 'k1'.*no longer holds"):
        open_state(before, retired, org=ORG, session_id="s-seal")


def test_legacy_signed_states_open_only_within_the_migration_window() -> None:
    codec = StateCodec(_ring("k1"), legacy_key=HMAC_KEY)
    assert codec.legacy_until == LEGACY_UNTIL == get_settings().state_legacy_until
    signed = _wire()
    inside = LEGACY_UNTIL - dt.timedelta(seconds=1)
    assert codec.open(signed, org=ORG, session_id="s-seal", now=inside) is signed
    forged = signed.model_copy(update={"user_query": "something else"})
    with pytest.raises(SealedStateError, match="signature does not match"):
        codec.open(forged, org=ORG, session_id="s-seal", now=inside)
    with pytest.raises(SealedStateError, match="belongs to session"):
        codec.open(signed, org=ORG, session_id="s-x", now=inside)
    with pytest.raises(SealedStateError, match="accepted until 2027-01-31"):
        codec.open(signed, org=ORG, session_id="s-seal", now=LEGACY_UNTIL)
    sealed = codec.seal(signed, org=ORG)  # the answer moves the session to the sealed form
    assert codec.open(sealed, org=ORG, session_id="s-seal", now=LEGACY_UNTIL).nonce == "ab" * 16
    no_legacy = StateCodec(_ring("k1"))
    with pytest.raises(SealedStateError):
        no_legacy.open(signed, org=ORG, session_id="s-seal", now=inside)


def test_keys_come_from_settings_and_bad_keys_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="CTX_STATE_KEYS is not set"):
        StateKeyring.from_settings(get_settings())
    entry = StateKeyring.new_entry("k9")
    monkeypatch.setenv("CTX_STATE_KEYS", entry)
    ring = StateKeyring.from_settings(get_settings())
    assert ring.current == "k9" and entry.split(":")[1] not in repr(ring)
    for spec, msg in [
        ("k1", "not '<key id>:<base64url key>'"),
        ("k1:" + base64.urlsafe_b64encode(b"short").decode(), "5 bytes; AES-256 needs 32"),
        ("k 1:" + entry.split(":")[1], "must be 1-32 characters"),
        (f"{entry},{entry}", "twice"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(msg)):
            StateKeyring.parse(spec)


def test_the_auth_context_is_encrypted_in_memory_and_opened_on_use() -> None:
    auth = AuthContext.from_token("agent-zq81", "tok-x", ("repairs",), org="org-zq81")
    raw = auth._box
    for planted in (b"agent-zq81", b"org-zq81", b"repairs", auth.open().token_sha256.encode()):
        assert planted not in raw
    assert auth.org == "org-zq81" and auth.scopes == ("repairs",)
    assert auth.has_scope("repairs") and not auth.has_scope("admin")
    assert repr(auth) == "AuthContext(agent_id='agent-zq81', scopes=('repairs',))"
    assert auth == AuthContext.from_token("agent-zq81", "tok-x", ("repairs",), org="org-zq81")
    with pytest.raises(AttributeError):
        auth.org = "other"  # type: ignore[misc]
    with pytest.raises(PersistenceRefusedError):
        import pickle

        pickle.dumps(auth)
