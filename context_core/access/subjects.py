"""The keyed hash that names a data subject (an organisation's user) without naming them.

Stores that must not hold user ids (L3 payloads, the erasure ledger, audit lines) still need to
say *whose* a record is, so an erasure can find it later: they hold :func:`subject_id`, an
HMAC-SHA-256 of ``<org>\\x00<the user's key id>`` under :func:`subject_key`. Without the key
the digest cannot be reversed by enumerating likely ids; with it, the platform can recompute
the digest of the user named in an erasure request and find their records.

The key is ``CTX_AUDIT_HMAC_KEY`` when set (the deployment's audit key), else a random key the
platform creates once at ``<CTX_DATA_DIR>/keys/subject.key`` (mode 0600). Keep it with the
backups: a restored store is matched against the erasure ledger with the same key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from context_core.errors import ConfigError
from context_core.working_memory.keys import check_org, user_key_id

if TYPE_CHECKING:
    from context_core.config import Settings

__all__ = ["SUBJECT_FIELD", "subject_id", "subject_key", "subject_key_file", "subject_of_key_id"]

#: The L3 payload field holding the subject digest of the user whose session confirmed an
#: answer (absent: no user, e.g. an upload or a system write).
SUBJECT_FIELD = "subject"
_PREFIX = "s~"


def subject_key_file(settings: Settings) -> Path:
    return settings.data_dir / "keys" / "subject.key"


def subject_key(settings: Settings) -> bytes:
    """``CTX_AUDIT_HMAC_KEY``, else the data dir's generated key (created on first use)."""
    if settings.audit_hmac_key is not None:
        return settings.audit_hmac_key.get_secret_value().encode("utf-8")
    path = subject_key_file(settings)
    try:
        return bytes.fromhex(path.read_text(encoding="ascii").strip())
    except FileNotFoundError:
        pass
    except ValueError as e:
        raise ConfigError(
            f"{path} is not a hex key; restore it from the backup or set CTX_AUDIT_HMAC_KEY"
        ) from e
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first: use theirs
        return bytes.fromhex(path.read_text(encoding="ascii").strip())
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(raw + "\n")
    return bytes.fromhex(raw)


def subject_id(key: bytes, org_id: str, user_id: str) -> str:
    """The subject digest of a user id as a client sends it (canonicalised first)."""
    return subject_of_key_id(key, org_id, user_key_id(user_id))


def subject_of_key_id(key: bytes, org_id: str, key_id: str) -> str:
    """``s~`` + 32 hex digits of HMAC-SHA-256(key, org NUL the user's key id): the key id
    (:func:`context_core.working_memory.keys.user_key_id`) is what L2 keys and compliance rows
    hold, so a digest can be recomputed from a stored key without knowing the user id."""
    msg = f"{check_org(org_id)}\x00{key_id}".encode()
    return _PREFIX + hmac.new(key, msg, hashlib.sha256).hexdigest()[:32]
