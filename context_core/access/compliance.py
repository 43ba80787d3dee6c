"""Compliance profiles: per organisation and per user, long-term, versioned, audited.

A profile holds five optional fields (``None`` = not set here):

* ``data_retention_policy``: days data may be kept (1-36500);
* ``approved_tools``: the tools a session may call. **Absent (null) = no restriction is
  configured** (every tool allowed); a list restricts to it, so ``[]`` forbids every tool;
* ``blocked_keywords``: words refused in hot answers (and uploads): :func:`find_blocked`;
* ``timezone``: an IANA name (``Europe/Berlin``); ``language``: a BCP 47 tag (``de-DE``).

**Effective profile** of a session = the org's profile merged with its user's overrides
(:func:`merge`); a user can narrow what the org allows but never widen what it forbids:

* ``approved_tools``: the intersection when both set one (the user may only narrow); the one
  set when only one is; absent when neither is;
* ``blocked_keywords``: the union (a user may add blocked words, never remove the org's);
* ``data_retention_policy``: the shorter of the two (a user may ask to keep data less long);
* ``timezone``, ``language``: the user's when set, else the org's (preferences, not limits).

**Writes** (:meth:`ComplianceStore.put`) are optimistic: ``expected_version`` must be the
stored version (0 = none yet), else :class:`~context_core.errors.VersionConflictError`
naming the current one. Every value passes the sanitize gateway before it is stored, and
every write appends an **audit entry**: operator, time, new version, the SHA-256 of the
stored (cleaned) profile and the *names* of the fields that changed, never their values.

**Backends**, one contract: :class:`RedisComplianceStore` (the default, embedded with L2:
``cmp:{org:<org>}:...`` keys, one hash tag per organisation, so a write and its audit entry
are one Lua script in one Redis Cluster slot) and :class:`PostgresComplianceStore` when
``CTX_POSTGRES_URL`` is set: tables with ``org_id`` under row-level security (enabled and
forced, policy ``org_id = current_setting('ctx.org_id', true)``), each transaction setting
``ctx.org_id`` with ``SET LOCAL`` semantics (``set_config(..., true)``). The role of
``CTX_POSTGRES_URL`` must not be a superuser or have BYPASSRLS (both ignore row-level
security): the store refuses to open on such a role. The tables, their policies and the
serving role's grants come from the migrations (:mod:`context_core.postgres`, ``ctx db
upgrade`` run by the owner role); the store runs no DDL and refuses to open on a schema
behind the code's head revision.

**Session snapshot**: ``session_start`` reads the effective profile once and stores it in
L2 (``wm:{<sid>}:compliance:profile``, the session's hash tag, the default L2 TTL);
``tool_call`` checks the snapshot (no profile-store round trip per event). A snapshot gone
(expired after ``CTX_WM_DEFAULT_TTL_S``, deleted by ``session_timeout``) is read again from
the store, so a changed profile reaches a running session within that TTL.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
import unicodedata
import zoneinfo
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from context_core import defaults
from context_core.access.auth import ORG_PATTERN
from context_core.concurrency import blocking
from context_core.errors import (
    BackendUnavailableError,
    BlockedKeywordError,
    ConfigError,
    ContextError,
    ContextMissError,
    ProfileValidationError,
    ToolNotApprovedError,
    VersionConflictError,
)
from context_core.gateway.identity import DEFAULT_ORG
from context_core.gateway.skeleton import (
    skeleton,
    skeleton_char,
    skeleton_with_offsets,
    term_pattern,
)
from context_core.redis.connection import REDIS_ERRORS
from context_core.redis.ops import Op, cmd, execute, ok
from context_core.working_memory.index import API_PUT_LUA
from context_core.working_memory.keys import canonical, user_key_id

if TYPE_CHECKING:
    from context_core.gateway.sanitize import Gateway
    from context_core.redis.connection import RedisClient
    from context_core.working_memory import SessionMemory

__all__ = [
    "ADMIN_PURPOSE",
    "DEFAULT_ORG",
    "FIELDS",
    "ORG_PATTERN",
    "AuditEntry",
    "BlockedKeywordError",
    "ComplianceProfile",
    "ComplianceStore",
    "EffectiveProfile",
    "PostgresComplianceStore",
    "ProfileValidationError",
    "RedisComplianceStore",
    "StoredProfile",
    "ToolNotApprovedError",
    "check_tool",
    "find_blocked",
    "load_snapshot",
    "merge",
    "store_snapshot",
]

#: The purpose (keys file ``purposes``) an agent needs to write profiles and read history.
ADMIN_PURPOSE = "compliance_admin"
_ORG = re.compile(ORG_PATTERN)
FIELDS = ("data_retention_policy", "approved_tools", "blocked_keywords", "timezone", "language")
_LANG = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8}){0,4}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SNAPSHOT_KIND, SNAPSHOT_IDENT = "compliance", "profile"


# --- errors -------------------------------------------------------------------------------------


# --- the profile ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _names(values: Sequence[str], what: str, max_len: int) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for i, v in enumerate(values):
        s = v.strip()
        if not s or len(s) > max_len or _CONTROL.search(s):
            raise ValueError(
                f"item {i} must be 1-{max_len} characters without control characters"
                f" (one {what} per item)"
            )
        folded = s.casefold()
        if folded not in seen:
            seen.add(folded)
            out.append(s)
    return out


class ComplianceProfile(BaseModel):
    """One org's or user's compliance record; every field optional (null = not set here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_retention_policy: int | None = Field(
        default=None, ge=1, le=36_500, description="days data may be kept (1-36500)"
    )
    approved_tools: list[str] | None = Field(
        default=None,
        max_length=500,
        description="tools a session may call; null = no restriction, [] = none allowed",
    )
    blocked_keywords: list[str] | None = Field(
        default=None,
        max_length=1000,
        description="refused in hot answers (case-insensitive, whole words; substrings for CJK)",
    )
    timezone: str | None = Field(
        default=None, description="IANA time zone name, e.g. Europe/Berlin"
    )
    language: str | None = Field(default=None, description="BCP 47 language tag, e.g. en, de-DE")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in data if k not in FIELDS)
            if unknown:
                raise ValueError(
                    f"unknown field(s) {', '.join(unknown)}; allowed fields: {', '.join(FIELDS)}"
                )
        return data

    @field_validator("approved_tools")
    @classmethod
    def _tools(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _names(v, "tool name", 128)

    @field_validator("blocked_keywords")
    @classmethod
    def _keywords(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else _names(v, "keyword", 200)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str | None) -> str | None:
        if v is not None and v not in _zones():
            raise ValueError(
                "unknown time zone; allowed: an IANA name such as 'UTC', 'Europe/Berlin', "
                "'America/New_York', 'Asia/Shanghai'"
            )
        return v

    @field_validator("language")
    @classmethod
    def _language(cls, v: str | None) -> str | None:
        if v is not None and not _LANG.fullmatch(v):
            raise ValueError(
                "not a language tag; allowed: a BCP 47 tag such as 'en', 'de-DE', 'zh-Hans-CN'"
            )
        return v

    @classmethod
    def parse(cls, data: Any) -> ComplianceProfile:
        """Validate ``data`` (a mapping or a profile); :class:`ProfileValidationError`
        naming every bad field and what it allows."""
        if isinstance(data, ComplianceProfile):
            return data
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ProfileValidationError(
                [
                    {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
                    for err in e.errors()
                ]
            ) from None

    def stored(self) -> dict[str, Any]:
        """The fields set here (nulls left out), JSON-ready: what a backend stores."""
        return cast(dict[str, Any], self.model_dump(mode="json", exclude_none=True))


def profile_sha256(profile: ComplianceProfile) -> str:
    """SHA-256 of the profile's canonical JSON (the audit's hash of the data)."""
    return hashlib.sha256(canonical(profile.stored()).encode("utf-8")).hexdigest()


def merge(org: ComplianceProfile, user: ComplianceProfile) -> ComplianceProfile:
    """The effective profile: a user narrows, never widens (see the module doc)."""
    tools: list[str] | None
    if org.approved_tools is None or user.approved_tools is None:
        tools = org.approved_tools if user.approved_tools is None else user.approved_tools
    else:
        mine = {t.casefold() for t in user.approved_tools}
        tools = [t for t in org.approved_tools if t.casefold() in mine]
    if org.blocked_keywords is None and user.blocked_keywords is None:
        blocked = None
    else:
        blocked = _names((*(org.blocked_keywords or ()), *(user.blocked_keywords or ())), "", 200)
    days = [d for d in (org.data_retention_policy, user.data_retention_policy) if d is not None]
    return ComplianceProfile(
        data_retention_policy=min(days) if days else None,
        approved_tools=tools,
        blocked_keywords=blocked,
        timezone=user.timezone or org.timezone,
        language=user.language or org.language,
    )


@dataclass(frozen=True, slots=True)
class StoredProfile:
    """A stored profile: version 0 (and an empty profile) when none was written yet."""

    org_id: str
    user_id: str | None
    version: int
    profile: ComplianceProfile
    sha256: str
    updated_at: float | None = None
    updated_by: str | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One accepted write: who, when, which version, the hash of the stored data and the
    names of the fields that changed (never their values)."""

    org_id: str
    user_id: str | None
    version: int
    operator: str
    at: float
    sha256: str
    changed: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "org_id": self.org_id,
            "user_id": self.user_id,
            "version": self.version,
            "operator": self.operator,
            "at": self.at,
            "sha256": self.sha256,
            "changed": list(self.changed),
        }


@dataclass(frozen=True, slots=True)
class EffectiveProfile:
    """A session's profile: the org's merged with its user's, and the versions behind it."""

    org_id: str
    org_version: int
    user_version: int
    profile: ComplianceProfile

    @property
    def version(self) -> str:
        """``<org version>.<user version>``: changes whenever either record does."""
        return f"{self.org_version}.{self.user_version}"

    @property
    def approved_tools(self) -> tuple[str, ...] | None:
        tools = self.profile.approved_tools
        return None if tools is None else tuple(tools)

    @property
    def blocked_keywords(self) -> tuple[str, ...]:
        return tuple(self.profile.blocked_keywords or ())

    def to_snapshot(self) -> dict[str, Any]:
        return {
            "org_id": self.org_id,
            "org_version": self.org_version,
            "user_version": self.user_version,
            "profile_version": self.version,
            "profile": self.profile.stored(),
        }

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> EffectiveProfile:
        return cls(
            str(data["org_id"]),
            int(data["org_version"]),
            int(data["user_version"]),
            ComplianceProfile.parse(data.get("profile") or {}),
        )


# --- enforcement ----------------------------------------------------------------------------------


def check_tool(effective: EffectiveProfile, tool: str) -> None:
    """Refuse (:class:`ToolNotApprovedError`) a tool outside ``approved_tools``; an absent
    list means no restriction is configured. Names compare case-insensitively."""
    approved = effective.approved_tools
    if approved is None:
        return
    if tool.casefold() not in {t.casefold() for t in approved}:
        raise ToolNotApprovedError(
            tool, approved, org_id=effective.org_id, version=effective.version
        )


# Scripts written without spaces between words: a keyword there is matched as a substring.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"
_CJK_RE = re.compile(f"[{_CJK}\u0e00-\u0e7f]")
# A word boundary: no word character that is not CJK on that side.
_BEFORE, _AFTER = f"(?<![^\\W{_CJK}])", f"(?![^\\W{_CJK}])"


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


class _Keyword(NamedTuple):
    keyword: str  # as configured (stripped)
    plain: re.Pattern[str]  # on the NFKC-case-folded text
    skeleton: re.Pattern[str] | None  # on the confusable skeleton (None: only invisibles)
    ascii: bool  # the folded keyword is plain ASCII


@functools.lru_cache(maxsize=256)
def _keyword_patterns(keywords: tuple[str, ...]) -> tuple[_Keyword, ...]:
    out = []
    for kw in keywords:
        k = kw.strip()
        if not k:
            continue
        body = r"\s+".join(re.escape(part) for part in _fold(k).split())
        pattern = body if _CJK_RE.search(k) else f"{_BEFORE}{body}{_AFTER}"
        out.append(_Keyword(k, re.compile(pattern), term_pattern(k), _fold(k).isascii()))
    return tuple(out)


def _skeleton_hit(kw: _Keyword, text: str, skel: str, offsets: Callable[[], list[int]]) -> bool:
    """A match of ``kw`` in the skeleton that counts (see :func:`find_blocked`)."""
    assert kw.skeleton is not None
    for m in kw.skeleton.finditer(skel):
        if not kw.ascii:
            return True
        covered = offsets()[m.start() : m.end()]
        lo, hi = min(covered), max(covered) + 1
        # with the invisible characters next to it: they too may be what hid the keyword
        while lo > 0 and not skeleton_char(text[lo - 1]):
            lo -= 1
        while hi < len(text) and not skeleton_char(text[hi]):
            hi += 1
        if not text[lo:hi].isascii():
            return True
    return False


def find_blocked(text: str, keywords: Sequence[str]) -> tuple[str, ...]:
    """The keywords of ``keywords`` that occur in ``text``, in keyword order (empty: none).

    Case-insensitive whole words (``secret`` matches "Secret!" but not "secretary"; a keyword
    of several words matches across any white space); a keyword holding CJK, kana, Hangul or
    Thai characters (scripts written without spaces) matches as a substring. The one matcher
    for profiles, hot answers and uploads.

    **Look-alikes cannot hide a keyword**: a keyword matches when it occurs in the
    NFKC-case-folded text (``ｃｏｄｅ`` is ``code``), *or* when its confusable skeleton
    (:mod:`context_core.gateway.skeleton`: invisible characters and accents removed, letters of
    other
    scripts mapped to the Latin, Greek... letter they imitate per Unicode UTS #39) occurs in
    the text's skeleton, so ``se\u200bcret``, ``ѕесrеt`` (Cyrillic) and ``𝐬𝐞𝐜𝐫𝐞𝐭`` match
    ``secret``. Keywords are skeletonised the same way, so a keyword typed with a look-alike
    still matches the plain word. The skeleton also folds ASCII into ASCII (``rn`` and ``m``,
    ``0`` and ``o``, ``1`` and ``l``), so a skeleton match of an ASCII keyword counts only
    when the text it covers, with the invisible characters around it, holds some non-ASCII
    character: plain-ASCII text is matched exactly as before (the keyword ``burn`` does not
    refuse "bum", nor ``lol`` "101")."""
    if not text or not keywords:
        return ()
    folded = _fold(text)
    text_ascii = text.isascii()
    skel: str | None = None
    cache: list[list[int]] = []

    def offsets() -> list[int]:
        if not cache:
            cache.append(skeleton_with_offsets(text)[1])
        return cache[0]

    found: list[str] = []
    for kw in _keyword_patterns(tuple(keywords)):
        if kw.plain.search(folded):
            found.append(kw.keyword)
        elif kw.skeleton is not None and not (kw.ascii and text_ascii):
            if skel is None:
                skel = skeleton(text)
            if _skeleton_hit(kw, text, skel, offsets):
                found.append(kw.keyword)
    return tuple(found)


def check_text(effective: EffectiveProfile, text: str, loc: Sequence[str | int]) -> None:
    """Refuse (:class:`BlockedKeywordError`) ``text`` holding a blocked keyword."""
    found = find_blocked(text, effective.blocked_keywords)
    if found:
        raise BlockedKeywordError(found[0], loc, org_id=effective.org_id)


def store_snapshot(sm: SessionMemory, effective: EffectiveProfile) -> str:
    """Write ``effective`` as the session's snapshot (``wm:{<sid>}:compliance:profile``,
    listed in the session's key index, the default L2 TTL); returns its key."""
    wm = sm.wm
    key = sm.key(SNAPSHOT_KIND, SNAPSHOT_IDENT)
    data = wm._gateway.clean(effective.to_snapshot(), where="L2.compliance")
    body = canonical({"stored_at": wm.now(), "data": data})
    wm._write_later(
        f"SET {key}",
        wm.script(API_PUT_LUA),
        keys=[key, sm.index_key],
        args=[body, wm.default_ttl_s],
    )
    return key


def load_snapshot(sm: SessionMemory) -> EffectiveProfile | None:
    """The session's snapshot, or None when there is none (never stored, expired, timed out)."""
    return sm.wm.run(snapshot_op(sm), f"GET {sm.key(SNAPSHOT_KIND, SNAPSHOT_IDENT)}")


def snapshot_op(sm: SessionMemory) -> Op[EffectiveProfile | None]:
    """Operation (:mod:`context_core.redis.ops`): :func:`load_snapshot` (GET + PTTL), for a
    caller that reads it with its own round trip."""
    try:  # the value is always a string
        loaded = yield from sm.string_op(sm.key(SNAPSHOT_KIND, SNAPSHOT_IDENT))
    except ContextMissError:
        return None
    return EffectiveProfile.from_snapshot(loaded.value)


# --- stores -----------------------------------------------------------------------------------


def check_org(org_id: object) -> str:
    if not isinstance(org_id, str) or not _ORG.match(org_id):
        raise ContextError(
            f"invalid org id {org_id!r}: use 1-64 characters from A-Z a-z 0-9 . _ - "
            "(starting with a letter or digit)"
        )
    return org_id


class ComplianceStore(Protocol):
    """What every backend answers (see the module doc for the semantics)."""

    backend: str

    def get(self, org_id: str, user_id: str | None = None) -> StoredProfile: ...

    def put(
        self,
        org_id: str,
        profile: ComplianceProfile | Mapping[str, Any],
        *,
        expected_version: int,
        operator: str,
        user_id: str | None = None,
    ) -> StoredProfile: ...

    def history(self, org_id: str, user_id: str | None = None) -> list[AuditEntry]: ...

    def effective(self, org_id: str, user_id: str) -> EffectiveProfile: ...

    def user_key_ids(self, org_id: str) -> set[str]:
        """The key ids (:func:`~context_core.working_memory.keys.user_key_id`) of every user
        of ``org_id`` with a profile or audit entries (erasure and its replay find by them)."""
        ...

    def history_length(self, org_id: str, key_id: str | None) -> int:
        """How many audit entries the org's record (``key_id`` None) or a user's holds."""
        ...

    def trim_history(self, org_id: str, key_id: str | None, keep: int) -> list[AuditEntry]:
        """Drop all but the newest ``keep`` audit entries of the org's record (``key_id``
        None) or a user's (by key id); returns the dropped ones, oldest first, for the caller
        to archive in digest form. Atomic against concurrent writes."""
        ...

    def erase_user_key(self, org_id: str, key_id: str) -> int:
        """Delete the profile and the audit entries stored under ``key_id`` (an erasure
        request); returns how many records went. The fact of the erasure is kept by the
        caller, in the audit log, under a keyed hash."""
        ...

    def close(self) -> None: ...


_EMPTY = ComplianceProfile()


def _empty(org_id: str, user_id: str | None) -> StoredProfile:
    return StoredProfile(org_id, user_id, 0, _EMPTY, profile_sha256(_EMPTY))


class _StoreBase:
    """What both backends share: validation, cleaning, hashing, the audit entry."""

    backend: str = ""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def _prepare(
        self, org_id: str, profile: ComplianceProfile | Mapping[str, Any], operator: str
    ) -> tuple[ComplianceProfile, str, str]:
        check_org(org_id)
        parsed = ComplianceProfile.parse(profile)
        cleaned = ComplianceProfile.parse(
            self.gateway.clean(parsed.stored(), where=f"compliance {org_id}")
        )
        op = self.gateway.clean_text(str(operator), where="compliance operator")
        if not op.strip():
            raise ContextError("compliance profile write: operator must be a non-empty id")
        return cleaned, profile_sha256(cleaned), op

    @staticmethod
    def _check_version(expected: int, current: int, org_id: str, user_id: str | None) -> None:
        if expected < 0:
            raise ProfileValidationError(
                [{"loc": ["expected_version"], "msg": "must be >= 0", "type": "greater_than_equal"}]
            )
        if expected != current:
            who = f"org {org_id!r}" + (f" user {user_id!r}" if user_id else "")
            raise VersionConflictError(
                f"compliance profile of {who} is at version {current}, not {expected}: "
                "re-read it, redo the change and retry with expected_version="
                f"{current}",
                current_version=current,
                expected_version=expected,
            )

    @staticmethod
    def _changed(old: ComplianceProfile, new: ComplianceProfile) -> tuple[str, ...]:
        a, b = old.stored(), new.stored()
        return tuple(f for f in FIELDS if a.get(f) != b.get(f))

    @staticmethod
    def _user(user_id: str | None) -> str | None:
        return None if user_id is None else user_key_id(user_id)


# KEYS: 1 profile hash, 2 audit list. ARGV: 1 expected version, 2 data, 3 sha256,
# 4 updated_at, 5 updated_by, 6 audit entry (JSON, written for version expected + 1).
# Returns {1, new version} or {0, current version} (nothing written).
_PUT_LUA = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if cur ~= tonumber(ARGV[1]) then return {0, cur} end
redis.call('HSET', KEYS[1], 'version', cur + 1, 'data', ARGV[2], 'sha256', ARGV[3],
           'updated_at', ARGV[4], 'updated_by', ARGV[5])
redis.call('RPUSH', KEYS[2], ARGV[6])
return {1, cur + 1}
"""


class RedisComplianceStore(_StoreBase):
    """Profiles in Redis: ``cmp:{org:<org>}:profile`` (the org's) and
    ``cmp:{org:<org>}:user:<uid>`` (hashes: version, data, sha256, updated_at, updated_by),
    audit lists ``cmp:{org:<org>}:audit`` and ``cmp:{org:<org>}:audit:user:<uid>``; one hash
    tag per organisation, no TTL (long-term records). ``<uid>`` is the user id, or its hash
    outside the key alphabet (:func:`~context_core.working_memory.keys.user_key_id`)."""

    backend = "redis"

    def __init__(self, client: RedisClient, gateway: Gateway) -> None:
        super().__init__(gateway)
        self._r: Any = client
        self._put_script = client.register_script(_PUT_LUA)

    @staticmethod
    def keys(org_id: str, user_id: str | None = None) -> tuple[str, str]:
        """(profile key, audit key) of the org's or a user's record."""
        if user_id is None:
            base = f"cmp:{{org:{check_org(org_id)}}}"
            return f"{base}:profile", f"{base}:audit"
        return RedisComplianceStore.user_keys(org_id, user_key_id(user_id))

    @staticmethod
    def user_keys(org_id: str, key_id: str) -> tuple[str, str]:
        """(profile key, audit key) of a user record stored under ``key_id`` as it is (the
        canonical key id, or a legacy one that ``ctx migrate-user-keys`` moves)."""
        base = f"cmp:{{org:{check_org(org_id)}}}"
        return f"{base}:user:{key_id}", f"{base}:audit:user:{key_id}"

    @contextmanager
    def _guard(self, op: str) -> Iterator[None]:
        try:
            yield
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(
                f"Redis failed during {op} (compliance profiles): {e}; check CTX_REDIS_URL"
            ) from e

    @staticmethod
    def _record(org_id: str, user_id: str | None, h: Mapping[str, str]) -> StoredProfile:
        if not h:
            return _empty(org_id, user_id)
        return StoredProfile(
            org_id,
            user_id,
            int(h["version"]),
            ComplianceProfile.parse(json.loads(h["data"])),
            h["sha256"],
            float(h["updated_at"]),
            h.get("updated_by"),
        )

    def get(self, org_id: str, user_id: str | None = None) -> StoredProfile:
        key, _ = self.keys(org_id, user_id)
        with self._guard(f"HGETALL {key}"):
            h = self._r.hgetall(key)
        return self._record(org_id, user_id, h)

    def put(
        self,
        org_id: str,
        profile: ComplianceProfile | Mapping[str, Any],
        *,
        expected_version: int,
        operator: str,
        user_id: str | None = None,
    ) -> StoredProfile:
        cleaned, sha, op = self._prepare(org_id, profile, operator)
        current = self.get(org_id, user_id)
        self._check_version(expected_version, current.version, org_id, user_id)
        key, audit = self.keys(org_id, user_id)
        now = time.time()
        entry = AuditEntry(
            org_id,
            self._user(user_id),
            expected_version + 1,
            op,
            now,
            sha,
            self._changed(current.profile, cleaned),
        )
        data = canonical(cleaned.stored())
        args: list[str | int] = [
            expected_version,
            data,
            sha,
            repr(now),
            op,
            canonical(entry.to_dict()),
        ]
        with self._guard(f"compliance write {key}"):
            ok, version = self._put_script(keys=[key, audit], args=args)
        if not int(ok):
            self._check_version(expected_version, int(version), org_id, user_id)
        return StoredProfile(org_id, user_id, int(version), cleaned, sha, now, op)

    def history(self, org_id: str, user_id: str | None = None) -> list[AuditEntry]:
        _, audit = self.keys(org_id, user_id)
        with self._guard(f"LRANGE {audit}"):
            rows = self._r.lrange(audit, 0, -1)
        return [_entry(json.loads(raw)) for raw in rows]

    def effective(self, org_id: str, user_id: str) -> EffectiveProfile:
        """Both records in one round trip (same slot)."""
        org_key, _ = self.keys(org_id)
        user_key, _ = self.keys(org_id, user_id)
        with self._guard(f"HGETALL {org_key}"):
            org_h, user_h = ok(
                execute(self._r, [cmd("HGETALL", org_key), cmd("HGETALL", user_key)])
            )
        org = self._record(org_id, None, org_h)
        user = self._record(org_id, user_id, user_h)
        return EffectiveProfile(org_id, org.version, user.version, merge(org.profile, user.profile))

    def user_key_ids(self, org_id: str) -> set[str]:
        base = f"cmp:{{org:{check_org(org_id)}}}:"
        out: set[str] = set()
        with self._guard(f"SCAN {base}*"):
            for pattern in (base + "user:*", base + "audit:user:*"):
                for k in self._r.scan_iter(match=pattern, count=1000):
                    out.add(str(k).rsplit(":", 1)[1])
        return out

    def history_length(self, org_id: str, key_id: str | None) -> int:
        audit = self.keys(org_id)[1] if key_id is None else self.user_keys(org_id, key_id)[1]
        with self._guard(f"LLEN {audit}"):
            return int(self._r.llen(audit))

    def trim_history(self, org_id: str, key_id: str | None, keep: int) -> list[AuditEntry]:
        audit = self.keys(org_id)[1] if key_id is None else self.user_keys(org_id, key_id)[1]
        with self._guard(f"trim {audit}"):
            rows = self._r.register_script(_TRIM_LUA)(keys=[audit], args=[max(int(keep), 0)])
        return [_entry(json.loads(raw)) for raw in rows]

    def erase_user_key(self, org_id: str, key_id: str) -> int:
        key, audit = self.user_keys(org_id, key_id)
        with self._guard(f"erase {key}"):
            found = ok(execute(self._r, [cmd("EXISTS", key), cmd("LLEN", audit)]))
            self._r.delete(key, audit)  # same hash tag: one slot
        return int(found[0]) + int(found[1])

    def close(self) -> None:
        """The Redis client belongs to the platform."""


# KEYS: 1 audit list.  ARGV: 1 entries to keep.  Returns the dropped (oldest) entries.
_TRIM_LUA = """
local n = redis.call('LLEN', KEYS[1])
local keep = tonumber(ARGV[1])
if n <= keep then return {} end
local old = redis.call('LRANGE', KEYS[1], 0, n - keep - 1)
if keep == 0 then redis.call('DEL', KEYS[1]) else redis.call('LTRIM', KEYS[1], n - keep, -1) end
return old
"""


def _entry(d: Mapping[str, Any]) -> AuditEntry:
    return AuditEntry(
        d["org_id"],
        d["user_id"],
        int(d["version"]),
        d["operator"],
        float(d["at"]),
        d["sha256"],
        tuple(d["changed"]),
    )


_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresComplianceStore(_StoreBase):
    """Profiles in PostgreSQL under row-level security per organisation (see the module doc).

    ``dsn`` is ``CTX_POSTGRES_URL`` (the serving role); ``schema`` (``CTX_POSTGRES_SCHEMA``)
    holds the two tables, created by the migrations (:mod:`context_core.postgres`, ``ctx db
    upgrade`` as the owner role): the store runs no DDL and refuses to open
    (:class:`~context_core.errors.SchemaBehindError`, naming the command) on a schema that is
    not at the code's head revision. Every transaction first sets ``ctx.org_id`` for itself
    only."""

    backend = "postgres"

    def __init__(
        self,
        dsn: str,
        gateway: Gateway,
        *,
        schema: str = defaults.POSTGRES_SCHEMA,
        max_connections: int = 8,
        connect_timeout_s: int = 5,
    ) -> None:
        super().__init__(gateway)
        import psycopg2
        import psycopg2.pool

        if not _SCHEMA.fullmatch(schema):
            raise ConfigError(
                f"CTX_POSTGRES_SCHEMA={schema!r}: use 1-63 characters a-z 0-9 _ "
                "(starting with a letter or _)"
            )
        self.schema = schema
        self._pg: Any = psycopg2
        self._lock = threading.Lock()
        # callers beyond the pool's size wait for a connection instead of failing
        self._slots = threading.BoundedSemaphore(max_connections)
        self._wait_s = float(connect_timeout_s)
        try:
            self._pool: Any = psycopg2.pool.ThreadedConnectionPool(
                1, max_connections, dsn, connect_timeout=connect_timeout_s
            )
        except psycopg2.Error as e:
            raise BackendUnavailableError(
                f"PostgreSQL (CTX_POSTGRES_URL) did not accept a connection: "
                f"{type(e).__name__}; check the server, the role and CTX_POSTGRES_URL"
            ) from e
        try:
            self._check_role()
            self._check_schema()
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        pg = self._pg
        if not self._slots.acquire(timeout=self._wait_s):
            raise BackendUnavailableError(
                f"no PostgreSQL connection free within {self._wait_s:.0f} s (compliance store); "
                "retry"
            )
        try:
            try:
                conn = self._pool.getconn()
            except pg.Error as e:
                raise BackendUnavailableError(
                    f"PostgreSQL (CTX_POSTGRES_URL) is unreachable: {type(e).__name__}"
                ) from e
            broken = False
            try:
                with conn:  # one transaction: committed on success, rolled back on error
                    yield conn
            except (pg.OperationalError, pg.InterfaceError) as e:
                broken = True
                raise BackendUnavailableError(
                    f"PostgreSQL (CTX_POSTGRES_URL) failed mid-transaction: {type(e).__name__}; "
                    "retry"
                ) from e
            finally:
                self._pool.putconn(conn, close=broken or bool(conn.closed))
        finally:
            self._slots.release()

    @contextmanager
    def _tx(self, org_id: str) -> Iterator[Any]:
        """A transaction (cursor) in which row-level security shows ``org_id`` only."""
        with self._conn() as conn, conn.cursor() as cur:
            cur.execute("SELECT set_config('ctx.org_id', %s, true)", (check_org(org_id),))
            yield cur

    def _check_role(self) -> None:
        with self._conn() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles "
                "WHERE rolname = current_user"
            )
            role, superuser, bypass = cur.fetchone()
        if superuser or bypass:
            raise ConfigError(
                f"CTX_POSTGRES_URL connects as {role!r}, a "
                f"{'superuser' if superuser else 'BYPASSRLS role'}: row-level security would "
                "not isolate organisations. Connect as a dedicated role without SUPERUSER and "
                "BYPASSRLS (e.g. CREATE ROLE ctx_app LOGIN), and migrate the schema as its owner "
                "with `ctx db upgrade`"
            )

    def _check_schema(self) -> None:
        from context_core.postgres import check_revision

        with self._conn() as conn, conn.cursor() as cur:
            check_revision(cur, self.schema)

    def _select(self, cur: Any, org_id: str, user_id: str | None, lock: bool) -> StoredProfile:
        cur.execute(
            f"SELECT version, profile, sha256, extract(epoch FROM updated_at)::float8, "
            f"updated_by FROM {self.schema}.compliance_profiles "
            f"WHERE org_id = %s AND user_id = %s{' FOR UPDATE' if lock else ''}",
            (org_id, self._user(user_id) or ""),
        )
        row = cur.fetchone()
        if row is None:
            return _empty(org_id, user_id)
        version, data, sha, at, by = row
        return StoredProfile(
            org_id, user_id, int(version), ComplianceProfile.parse(data), str(sha), at, by
        )

    def get(self, org_id: str, user_id: str | None = None) -> StoredProfile:
        with self._tx(org_id) as cur:
            return self._select(cur, org_id, user_id, lock=False)

    def put(
        self,
        org_id: str,
        profile: ComplianceProfile | Mapping[str, Any],
        *,
        expected_version: int,
        operator: str,
        user_id: str | None = None,
    ) -> StoredProfile:
        cleaned, sha, op = self._prepare(org_id, profile, operator)
        uid = self._user(user_id) or ""
        t = self.schema
        now = time.time()
        data = canonical(cleaned.stored())
        with self._tx(org_id) as cur:
            current = self._select(cur, org_id, user_id, lock=True)
            self._check_version(expected_version, current.version, org_id, user_id)
            version = expected_version + 1
            if expected_version == 0:
                cur.execute(
                    f"INSERT INTO {t}.compliance_profiles (org_id, user_id, version, profile, "
                    "sha256, updated_at, updated_by) VALUES (%s, %s, 1, %s, %s, "
                    "to_timestamp(%s), %s) ON CONFLICT DO NOTHING",
                    (org_id, uid, data, sha, now, op),
                )
            else:
                cur.execute(
                    f"UPDATE {t}.compliance_profiles SET version = %s, profile = %s, "
                    "sha256 = %s, updated_at = to_timestamp(%s), updated_by = %s "
                    "WHERE org_id = %s AND user_id = %s AND version = %s",
                    (version, data, sha, now, op, org_id, uid, expected_version),
                )
            if cur.rowcount != 1:  # a concurrent first write won the race
                self._check_version(expected_version, expected_version + 1, org_id, user_id)
            cur.execute(
                f"INSERT INTO {t}.compliance_audit (org_id, user_id, version, operator, at, "
                "sha256, changed) VALUES (%s, %s, %s, %s, to_timestamp(%s), %s, %s)",
                (org_id, uid, version, op, now, sha, list(self._changed(current.profile, cleaned))),
            )
        return StoredProfile(org_id, user_id, version, cleaned, sha, now, op)

    def history(self, org_id: str, user_id: str | None = None) -> list[AuditEntry]:
        with self._tx(org_id) as cur:
            cur.execute(
                f"SELECT org_id, user_id, version, operator, extract(epoch FROM at)::float8, "
                f"sha256, changed FROM {self.schema}.compliance_audit "
                "WHERE org_id = %s AND user_id = %s ORDER BY version",
                (org_id, self._user(user_id) or ""),
            )
            rows = cur.fetchall()
        return [
            AuditEntry(o, u or None, int(v), op, float(at), sha, tuple(ch))
            for o, u, v, op, at, sha, ch in rows
        ]

    def effective(self, org_id: str, user_id: str) -> EffectiveProfile:
        """Both records in one transaction (on a worker thread when called on the service's
        event loop: the driver blocks, :func:`context_core.concurrency.blocking`)."""
        return blocking(self._effective, org_id, user_id)

    def _effective(self, org_id: str, user_id: str) -> EffectiveProfile:
        with self._tx(org_id) as cur:
            org = self._select(cur, org_id, None, lock=False)
            user = self._select(cur, org_id, user_id, lock=False)
        return EffectiveProfile(org_id, org.version, user.version, merge(org.profile, user.profile))

    def user_key_ids(self, org_id: str) -> set[str]:
        with self._tx(org_id) as cur:
            cur.execute(
                f"SELECT user_id FROM {self.schema}.compliance_profiles WHERE org_id = %s "
                f"UNION SELECT user_id FROM {self.schema}.compliance_audit WHERE org_id = %s",
                (org_id, org_id),
            )
            return {str(u) for (u,) in cur.fetchall() if u}

    def history_length(self, org_id: str, key_id: str | None) -> int:
        with self._tx(org_id) as cur:
            cur.execute(
                f"SELECT count(*) FROM {self.schema}.compliance_audit "
                "WHERE org_id = %s AND user_id = %s",
                (org_id, key_id or ""),
            )
            return int(cur.fetchone()[0])

    def trim_history(self, org_id: str, key_id: str | None, keep: int) -> list[AuditEntry]:
        uid = key_id or ""
        t = self.schema
        with self._tx(org_id) as cur:
            cur.execute(
                f"DELETE FROM {t}.compliance_audit WHERE org_id = %s AND user_id = %s AND "
                f"version <= (SELECT max(version) FROM {t}.compliance_audit WHERE org_id = %s "
                "AND user_id = %s) - %s RETURNING org_id, user_id, version, operator, "
                "extract(epoch FROM at)::float8, sha256, changed",
                (org_id, uid, org_id, uid, max(int(keep), 0)),
            )
            rows = cur.fetchall()
        return sorted(
            (
                AuditEntry(o, u or None, int(v), op, float(at), sha, tuple(ch))
                for o, u, v, op, at, sha, ch in rows
            ),
            key=lambda e: e.version,
        )

    def erase_user_key(self, org_id: str, key_id: str) -> int:
        uid = key_id
        with self._tx(org_id) as cur:
            n = 0
            for table in ("compliance_profiles", "compliance_audit"):
                cur.execute(
                    f"DELETE FROM {self.schema}.{table} WHERE org_id = %s AND user_id = %s",
                    (org_id, uid),
                )
                n += max(cur.rowcount, 0)
        return n

    def close(self) -> None:
        with self._lock:
            pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.closeall()
