"""L1 sealed for the wire: AES-GCM with key ids, rotation and a migration window for signed states.

A sealed state is one opaque string, ``ctx1.<key id>.<base64url(nonce || ciphertext || tag)>``:
AES-256-GCM (``cryptography``'s :class:`~cryptography.hazmat.primitives.ciphers.aead.AESGCM`)
over the compact JSON of a :class:`~context_core.session.wire.WireState`'s fields (all but
``sig``), with a fresh 96-bit random nonce per seal. The associated data binds the format, the
key id, the organisation of the caller's credential and the session id, so a state opens only
for the same organisation and session it was sealed for: replayed into another organisation or
session (or with its key id edited) it fails authentication, as an edited byte does.

Keys (:class:`StateKeyring`): ``CTX_STATE_KEYS="k2:<base64url 32 bytes>,k1:<...>"``, the first
is current (it seals), every listed key opens. Rotation: put the new key first, keep the old
ones listed as long as states sealed with them may come back (a session's lifetime,
``CTX_WM_CONTRACT_TTL_S``), then drop them; a state whose key id is no longer listed is refused
naming that id. Keys come from the environment or a secrets manager, never from the repository;
``python -m context_core.session.seal <kid>`` prints a new entry.

Migration (:class:`StateCodec`): a state in the old signed form (a ``WireState`` object with
its HMAC ``sig``) is still accepted until ``CTX_STATE_LEGACY_UNTIL`` (default
:data:`LEGACY_UNTIL`), and refused after it with a message saying so; answers always carry the
sealed form, so one round trip moves a session over.

Bounds: a token over ``max_chars`` (default :data:`MAX_TOKEN_CHARS`) is refused before any
decoding; opening is one AES-GCM pass over it.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import ValidationError

from context_core import defaults
from context_core.errors import ConfigError, SealedStateError
from context_core.session.wire import WireState

if TYPE_CHECKING:
    from context_core.config import Settings

__all__ = [
    "LEGACY_UNTIL",
    "MAX_TOKEN_CHARS",
    "PREFIX",
    "SealedStateError",
    "StateCodec",
    "StateKeyring",
    "open_state",
    "seal_state",
]

PREFIX = "ctx1"
LEGACY_UNTIL = defaults.STATE_LEGACY_UNTIL
"""Default end of the migration window for signed (unencrypted) states."""
MAX_TOKEN_CHARS = 512 * 1024
_KID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_NONCE_BYTES = 12
_OPENED_SIG = "0" * 64  # an opened state was authenticated by AES-GCM, not by an HMAC
_ENCODER = msgspec.json.Encoder()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class StateKeyring:
    """Key id -> AES-256 key; ``current`` seals, all open."""

    current: str
    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise ConfigError(f"CTX_STATE_KEYS: the current key id {self.current!r} is not listed")
        for kid, key in self.keys.items():
            if not _KID.fullmatch(kid):
                raise ConfigError(
                    f"CTX_STATE_KEYS: key id {kid!r} must be 1-32 characters of A-Z a-z 0-9 _ -"
                )
            if len(key) != 32:
                raise ConfigError(
                    f"CTX_STATE_KEYS: key {kid!r} is {len(key)} bytes; AES-256 needs 32 "
                    "(generate one with python -m context_core.session.seal <kid>)"
                )

    def __repr__(self) -> str:  # never the keys
        return f"StateKeyring(current={self.current!r}, ids={sorted(self.keys)})"

    @classmethod
    def parse(cls, spec: str) -> StateKeyring:
        """``"kid:base64url-key,kid2:..."``; the first entry is the current key."""
        keys: dict[str, bytes] = {}
        for n, entry in enumerate(p.strip() for p in spec.split(",")):
            kid, sep, b64 = entry.partition(":")
            if not sep or not kid:
                raise ConfigError(
                    f"CTX_STATE_KEYS entry {n + 1} is not '<key id>:<base64url key>' "
                    "(entries are separated by commas, the first seals)"
                )
            if kid in keys:
                raise ConfigError(f"CTX_STATE_KEYS lists key id {kid!r} twice")
            try:
                keys[kid] = _b64decode(b64.strip())
            except (binascii.Error, ValueError) as e:
                raise ConfigError(f"CTX_STATE_KEYS: key {kid!r} is not base64url ({e})") from e
        if not keys:
            raise ConfigError("CTX_STATE_KEYS is empty")
        return cls(next(iter(keys)), keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> StateKeyring:
        if settings.state_keys is None:
            raise ConfigError(
                "CTX_STATE_KEYS is not set: sealed L1 states need at least one AES-256 key "
                "('<kid>:<base64url 32 bytes>'; python -m context_core.session.seal <kid>)"
            )
        return cls.parse(settings.state_keys.get_secret_value())

    @staticmethod
    def new_entry(kid: str) -> str:
        """A fresh ``kid:key`` entry for CTX_STATE_KEYS."""
        key = base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode().rstrip("=")
        return f"{kid}:{key}"


def _aad(kid: str, org: str, session_id: str) -> bytes:
    """Length-prefixed, so no two (org, session) pairs share associated data."""
    parts = [PREFIX.encode(), kid.encode(), org.encode(), session_id.encode()]
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def seal_state(wire: WireState, keyring: StateKeyring, *, org: str) -> str:
    """``wire``'s fields (not ``sig``) sealed for ``org`` and its own session id."""
    kid = keyring.current
    body = wire.model_dump(exclude={"sig"})
    nonce = os.urandom(_NONCE_BYTES)
    ct = AESGCM(keyring.keys[kid]).encrypt(
        nonce, _ENCODER.encode(body), _aad(kid, org, wire.session_id)
    )
    return f"{PREFIX}.{kid}.{base64.urlsafe_b64encode(nonce + ct).decode().rstrip('=')}"


def open_state(
    token: str,
    keyring: StateKeyring,
    *,
    org: str,
    session_id: str,
    max_chars: int = MAX_TOKEN_CHARS,
) -> WireState:
    """The state sealed in ``token`` for ``org`` and ``session_id``; :class:`SealedStateError`
    (403) with what is wrong otherwise. The result's ``sig`` is zeros: AES-GCM authenticated
    it."""
    if len(token) > max_chars:
        raise SealedStateError(
            f"state is {len(token)} characters, over the {max_chars} a sealed state may have"
        )
    prefix, _, rest = token.partition(".")
    kid, _, payload = rest.partition(".")
    if prefix != PREFIX or not kid or not payload:
        raise SealedStateError(
            f"state is not a sealed state ('{PREFIX}.<key id>.<data>'): send it exactly as "
            "the service returned it"
        )
    key = keyring.keys.get(kid)
    if key is None:
        raise SealedStateError(
            f"state was sealed with key id {kid[:32]!r}, which this service no longer holds "
            "(retired by a key rotation): start a new session"
        )
    try:
        raw = _b64decode(payload)
    except (binascii.Error, ValueError) as e:
        raise SealedStateError("state data is not base64url: send it as returned") from e
    if len(raw) < _NONCE_BYTES + 16:
        raise SealedStateError("state data is too short to be a sealed state")
    try:
        plain = AESGCM(key).decrypt(
            raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _aad(kid, org, session_id)
        )
    except InvalidTag as e:
        raise SealedStateError(
            "state does not open: it was altered, or sealed for another session or "
            "organisation; send the state this session's last answer returned"
        ) from e
    try:
        body: dict[str, Any] = msgspec.json.decode(plain)
        wire = WireState.model_validate({**body, "sig": _OPENED_SIG})
    except (msgspec.DecodeError, ValidationError) as e:  # only our own key could seal it
        raise SealedStateError(f"sealed state holds no valid L1 state ({e})") from e
    if wire.session_id != session_id:  # bound by the associated data too
        raise SealedStateError(f"state belongs to session {wire.session_id!r}")
    return wire


@dataclass(frozen=True)
class StateCodec:
    """Seals answers; opens sealed states, and signed ones until ``legacy_until``."""

    keyring: StateKeyring
    legacy_key: bytes | None = field(default=None, repr=False)  # signed states' HMAC key
    legacy_until: dt.datetime = LEGACY_UNTIL
    max_chars: int = MAX_TOKEN_CHARS  # a sealed state longer than this is refused undecoded

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        legacy_key: bytes | None = None,
        keyring: StateKeyring | None = None,
    ) -> StateCodec:
        """``keyring``: when given (the service's own when CTX_STATE_KEYS is unset), used
        instead of CTX_STATE_KEYS; ``max_chars`` is CTX_L1_MAX_STATE_BYTES."""
        return cls(
            keyring or StateKeyring.from_settings(settings),
            legacy_key,
            settings.state_legacy_until,
            settings.l1_max_state_bytes,
        )

    def seal(self, wire: WireState, *, org: str) -> str:
        return seal_state(wire, self.keyring, org=org)

    def open(
        self,
        state: str | WireState,
        *,
        org: str,
        session_id: str,
        now: dt.datetime | None = None,
    ) -> WireState:
        if isinstance(state, str):
            return open_state(
                state, self.keyring, org=org, session_id=session_id, max_chars=self.max_chars
            )
        when = now or dt.datetime.now(dt.UTC)
        if when >= self.legacy_until:
            raise SealedStateError(
                "signed (unencrypted) states were accepted until "
                f"{self.legacy_until.isoformat()} (CTX_STATE_LEGACY_UNTIL); send the sealed "
                "state of a newer answer, or start a new session"
            )
        if state.session_id != session_id:
            raise SealedStateError(f"state belongs to session {state.session_id!r}")
        if self.legacy_key is None or not state.verify(self.legacy_key):
            raise SealedStateError(
                "state signature does not match: send the state exactly as the service returned it"
            )
        return state


if __name__ == "__main__":
    print(StateKeyring.new_entry(sys.argv[1] if len(sys.argv) > 1 else "k1"))
