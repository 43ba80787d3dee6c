"""Key building and id validation for L2: the one place that decides what a key may contain.

Session keys are ``wm:{<sid>}:<kind>:<ident>`` and preference keys
``pref:{<org>:<uid>}:<type>``: a user id means something only inside its organisation
(:mod:`context_core.gateway.identity`), so a user's keys carry the organisation too.
The braces are a Redis Cluster hash tag, so all of one session's keys share a slot. Ids are
checked against strict patterns because a brace, colon or glob character in an id would let
one session's key address another's. Session keys are never found by pattern: each session
lists its own in a key index (:mod:`.index`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from context_core import defaults
from context_core.errors import ContextError, PayloadTooLargeError
from context_core.gateway.identity import canonical_user_id

__all__ = [
    "ACTIVITY_KEY",
    "DEFAULT_MAX_STEP_BYTES",
    "LEGACY_PREF_INDEX_SCAN",
    "LEGACY_PREF_KEY",
    "LEGACY_PREF_SCAN",
    "RESERVED_PREFIX",
    "bundle_log_key",
    "canonical",
    "check_ident",
    "check_kind",
    "check_org",
    "check_sid",
    "check_size",
    "expired_key",
    "index_key",
    "legacy_pref_index_key",
    "pref_index_key",
    "pref_prefix",
    "session_prefix",
    "ttl_from_pttl",
    "user_key_id",
]

_SID = re.compile(r"^[A-Za-z0-9._\-]{1,128}$")
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_IDENT = re.compile(r"^[^\s{}:*?\[\]\\]{1,256}$")
_ORG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: Global Sorted Set of sessions by last activity (member = session id, score = epoch s);
#: outside every session's slot (:mod:`.lifetime`).
ACTIVITY_KEY = "ctx:activity"

#: Hash fields starting with this are the store's own bookkeeping (``_stored_at``, ...).
RESERVED_PREFIX = "_"

#: Default cap of one step result's cleaned field values (``CTX_MAX_STEP_RESULT_BYTES``).
DEFAULT_MAX_STEP_BYTES = defaults.MAX_STEP_RESULT_BYTES


def check_size(what: str, size: int, cap: int, setting: str) -> None:
    """Refuse a write of ``size`` bytes over ``cap``, naming the ``CTX_MAX_<setting>_BYTES``
    setting behind it (:class:`PayloadTooLargeError`, a 413 in the service)."""
    if size > cap:
        raise PayloadTooLargeError(
            f"{what} is {size} bytes after cleaning, over the {cap}-byte limit "
            f"(CTX_MAX_{setting}_BYTES); store a summary, or a pointer to where the data is",
            limit_bytes=cap,
        )


#: Ids each pattern already passed (exact ``str`` only), so the ids a request builds its keys
#: from again and again are matched once; bounded, emptied when full.
_PASSED: dict[re.Pattern[str], set[str]] = {}
_PASSED_MAX = 4096


def _check(what: str, value: object, pattern: re.Pattern[str], allowed: str) -> str:
    passed = _PASSED.get(pattern)
    if passed is not None and type(value) is str and value in passed:
        return value
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ContextError(
            f"invalid {what} {value!r}: {allowed}. Braces, colons and whitespace are refused "
            "because they would let one id address another session's keys"
        )
    if type(value) is str:
        if passed is None:
            passed = _PASSED.setdefault(pattern, set())
        if len(passed) >= _PASSED_MAX:
            passed.clear()
        passed.add(value)
    return value


def check_sid(value: object, what: str = "session id") -> str:
    return _check(what, value, _SID, "use 1-128 characters from A-Z a-z 0-9 . _ -")


def check_kind(value: object, what: str = "kind") -> str:
    return _check(what, value, _KIND, "use a lower-case word such as 'step' or 'api'")


def check_ident(value: object, what: str = "ident") -> str:
    return _check(
        what, value, _IDENT, "use 1-256 characters without whitespace, braces, colons, * ? [ ] \\"
    )


def session_prefix(session_id: str) -> str:
    """``wm:{<sid>}:`` for an already validated session id."""
    return f"wm:{{{session_id}}}:"


def index_key(prefix: str) -> str:
    """``wm:{<sid>}:index`` from the session prefix ``wm:{<sid>}:`` (:mod:`.index`)."""
    return prefix + "index"


def expired_key(prefix: str) -> str:
    """``wm:{<sid>}:expired``: the keys a sweep found gone (see :mod:`.index`)."""
    return prefix + "expired"


def bundle_log_key(session_id: str) -> str:
    """``wm:{<sid>}:bundles:recent``: the session's bundle log, a Hash
    (:mod:`context_core.routing.delta`)."""
    return session_prefix(check_sid(session_id)) + "bundles:recent"


def pref_prefix(org_id: str, user_key: str) -> str:
    """``pref:{<org>:<uid>}:`` for a checked org id and a user's key id (:func:`user_key_id`).
    Neither may hold a colon, so the pair is unambiguous."""
    return f"pref:{{{check_org(org_id)}:{user_key}}}:"


def pref_index_key(org_id: str, user_key: str) -> str:
    """``pref:{<org>:<uid>}:_index``: the Set of a user's preference types (same slot as
    them). The leading ``_`` is refused by :func:`check_kind`, so it is never a type."""
    return f"{pref_prefix(org_id, user_key)}_index"


#: Preference keys as written before they were scoped by organisation,
#: ``pref:{<uid>}:<type>`` (groups: the user key id, the type); read only by
#: ``ctx migrate-user-keys`` (:mod:`context_core.access.user_keys_migration`).
LEGACY_PREF_KEY = re.compile(r"pref:\{([^{}:]+)\}:([a-z][a-z0-9_]{0,31})")
#: SCAN patterns that find the legacy keys (and, with them, the scoped ones to filter out).
LEGACY_PREF_SCAN, LEGACY_PREF_INDEX_SCAN = "pref:{*}:*", "pref:{*}:_index"


def legacy_pref_index_key(user_key: str) -> str:
    """``pref:{<uid>}:_index``: a legacy (unscoped) user's index of preference types."""
    return f"pref:{{{user_key}}}:_index"


def check_org(value: object) -> str:
    """An organisation id as API keys carry it (1-64 of A-Z a-z 0-9 . _ -)."""
    return _check(
        "organisation id",
        value,
        _ORG,
        "use 1-64 characters from A-Z a-z 0-9 . _ - starting with a letter or digit",
    )


def user_key_id(user_id: object) -> str:
    """The id a user's keys are built from: the canonical user id
    (:func:`context_core.gateway.identity.canonical_user_id`) when it is a valid key id
    (:func:`check_sid`), else ``h~`` + 40 hex digits of its sha256.

    User ids come from clients (an e-mail address, a display name); hashing the ones outside
    the key alphabet gives every user a stable slot without letting a brace or a colon in the
    id address another user's keys. ``~`` is outside the alphabet, so a hashed id never
    equals a plain one. ``U-1``, ``u-1 `` and ``ｕ-1`` are one user (``u-1``).
    """
    uid = canonical_user_id(user_id)
    if _SID.fullmatch(uid):
        return uid
    return "h~" + hashlib.sha256(uid.encode()).hexdigest()[:40]


def canonical(value: Any) -> str:
    """Stable JSON (sorted keys, no spaces): equal values give equal bytes and hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def ttl_from_pttl(pttl: int) -> float | None:
    """PTTL reply -> seconds; ``None`` for a key without expiry (-1)."""
    return None if pttl == -1 else pttl / 1000.0
