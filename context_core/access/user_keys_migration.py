"""Move user records written before user ids were scoped and canonical to their new keys.

Before the identity model (:mod:`context_core.gateway.identity`), preferences lived at
``pref:{<uid>}:<type>`` with the user id as the agent sent it, so an agent of any organisation
reached them; compliance user profiles lived at ``cmp:{org:<org>}:user:<uid>`` with the id
as the administrator typed it (``U-Narrow`` and ``u-narrow`` were two users). Nothing reads
those keys any more: they are unreachable, not shared. This module is what
``ctx migrate-user-keys`` runs to carry them over, or to drop them:

* legacy preferences cannot say which organisation they belonged to, so the operator names
  it (``--org``); each ``pref:{<uid>}:<type>`` moves to ``pref:{<org>:<canonical uid>}:<type>``
  and into that user's index. Where two legacy ids fold to one canonical id (``Alice`` and
  ``alice``), the most recently updated value of each type wins;
* compliance user profiles of ``--org`` whose stored id is not canonical move to the
  canonical id's key, unless a profile is already stored there (reported, left as it is:
  two different restrictions cannot be merged by a machine);
* ids the canonical rule refuses, and hashed ids (``h~...``, from ids outside the key
  alphabet: the original id cannot be recovered), are reported and left alone; ``drop=True``
  deletes every legacy preference key instead of moving it.

It is idempotent (a second run finds nothing to move) and crash-safe: a user's values are
written at their new key before the old key is deleted, so a run stopped half way loses
nothing and the next run completes it. Keys are found with SCAN (on a cluster, on every
primary), in batches, so a large keyspace is walked without blocking the server.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from context_core.access.compliance import RedisComplianceStore
from context_core.errors import ContextError
from context_core.working_memory.keys import (
    LEGACY_PREF_INDEX_SCAN,
    LEGACY_PREF_KEY,
    LEGACY_PREF_SCAN,
    check_org,
    legacy_pref_index_key,
    pref_index_key,
    pref_prefix,
    user_key_id,
)

__all__ = ["UserKeysMigration", "migrate_user_keys"]

_SCAN_COUNT = 500


@dataclass
class UserKeysMigration:
    """What a run did (or, with ``dry_run``, would do); counts and ids, never values."""

    org: str
    dry_run: bool
    preferences_moved: int = 0
    preferences_dropped: int = 0
    users_moved: list[str] = field(default_factory=list)
    profiles_moved: list[str] = field(default_factory=list)
    left_alone: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "org": self.org,
            "dry_run": self.dry_run,
            "preferences_moved": self.preferences_moved,
            "preferences_dropped": self.preferences_dropped,
            "users_moved": sorted(self.users_moved),
            "profiles_moved": sorted(self.profiles_moved),
            "left_alone": dict(sorted(self.left_alone.items())),
        }


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _scan(client: Any, pattern: str) -> list[str]:
    return sorted({_text(k) for k in client.scan_iter(match=pattern, count=_SCAN_COUNT)})


def migrate_user_keys(
    client: Any, org: str, *, dry_run: bool = False, drop: bool = False
) -> UserKeysMigration:
    """Carry legacy user keys over to ``org`` (see the module doc); returns what was done."""
    check_org(org)
    out = UserKeysMigration(org, dry_run)
    _migrate_preferences(client, org, out, drop=drop)
    if not drop:
        _migrate_profiles(client, org, out)
    return out


def _migrate_preferences(client: Any, org: str, out: UserKeysMigration, *, drop: bool) -> None:
    by_user: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in _scan(client, LEGACY_PREF_SCAN):
        m = LEGACY_PREF_KEY.fullmatch(key)
        if m:  # ``_index`` sets and anything else that is not a legacy preference hash: below
            by_user[m.group(1)].append((key, m.group(2)))
    legacy_indexes = [
        k
        for k in _scan(client, LEGACY_PREF_INDEX_SCAN)
        if ":" not in k[len("pref:{") : -len("}:_index")]
    ]
    if drop:
        doomed = [k for pairs in by_user.values() for k, _ in pairs]
        out.preferences_dropped = len(doomed)
        if not out.dry_run:
            for k in doomed + legacy_indexes:  # one key per DEL: legal across cluster slots
                client.delete(k)
        return
    for uid, pairs in sorted(by_user.items()):
        if uid.startswith("h~"):
            out.left_alone[uid] = "hashed id: the original cannot be recovered (use --drop)"
            continue
        try:
            target = user_key_id(uid)
        except ContextError as e:
            out.left_alone[uid] = f"refused by the canonical rule: {e}"[:200]
            continue
        prefix = pref_prefix(org, target)
        for key, ptype in pairs:
            h = {_text(k): _text(v) for k, v in client.hgetall(key).items()}
            if not h:
                continue
            out.preferences_moved += 1
            if out.dry_run:
                continue
            new_key = prefix + ptype
            existing = {_text(k): _text(v) for k, v in client.hgetall(new_key).items()}
            if not existing or float(existing.get("last_updated", 0)) < float(
                h.get("last_updated", 0)
            ):
                client.hset(new_key, mapping=h)
            client.sadd(pref_index_key(org, target), ptype)
            client.delete(key)
        out.users_moved.append(uid)
        if not out.dry_run:
            client.delete(legacy_pref_index_key(uid))


def _migrate_profiles(client: Any, org: str, out: UserKeysMigration) -> None:
    prefix = RedisComplianceStore.user_keys(org, "")[0]  # cmp:{org:<org>}:user:
    for key in _scan(client, f"{prefix}*"):
        uid = key[len(prefix) :]
        if uid.startswith("h~") or not uid:
            continue
        try:
            target = user_key_id(uid)
        except ContextError as e:
            out.left_alone[f"profile {uid}"] = f"refused by the canonical rule: {e}"[:200]
            continue
        if target == uid:
            continue
        new_key, new_audit = RedisComplianceStore.user_keys(org, target)
        if client.exists(new_key):
            out.left_alone[f"profile {uid}"] = f"a profile for {target!r} exists already"
            continue
        out.profiles_moved.append(uid)
        if out.dry_run:
            continue
        client.rename(key, new_key)  # same hash tag: one slot, legal on a cluster
        old_audit = RedisComplianceStore.user_keys(org, uid)[1]
        if client.exists(old_audit):
            client.rename(old_audit, new_audit)
