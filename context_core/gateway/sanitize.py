"""The sanitize gateway: the one door every write into memory, and every log line, passes.

Why one door: an agent that stores a tool response verbatim will sooner or later store a
bearer token, a customer's mobile number or a 5 MB blob. The gateway makes the clean copy
the *only* copy the layers see, and leaves an audit trail that says *where* something was
removed and a hash of *what* was removed, never the value itself.

Three kinds of cleaning, applied at any depth of dicts/lists/tuples/sets:

* **key-based**: values under secret-like keys (``api_key``, ``dbPassword``,
  ``AWS_SECRET_ACCESS_KEY``, ``Set-Cookie`` ...) become :data:`REDACTED`, see
  :func:`is_secret_key` for the exact rule and what is deliberately *not* a secret key;
* **value patterns** in every string: provider keys (``sk_live_``, ``sk-proj-``, ``AKIA``,
  ``ghp_``, ``glpat-``, ``hf_``, ``AIza``, ``xoxb-``, ``ctxk_``, ``npm_``, ``SG.``, ``pypi-``,
  ``sq0csp-``, OpenAI, Discord, Telegram, Mailchimp, Twilio, Artifactory, PuTTY keys), high-entropy
  tokens after cue words ("the secret key is ..."), JWTs, ``Bearer``/``Basic``
  credentials, PEM and PGP private keys, ``user:pw@`` in URLs, Slack webhooks,
  ``password=...``-style assignments and ``("password", "v")`` pairs in free text, base64
  tokens that decode to any of these;
* **PII masking**: PRC resident ID numbers (checksum-validated), mainland mobile numbers,
  e-mail addresses, bank-card numbers (Luhn-validated), full-width forms included.

The rules (which keys, which patterns, how each PII kind is masked, and why) live in
:mod:`context_core.gateway.redaction`. Choices made here:

* Integers with 11+ digits are scanned for PII too (a phone number stored as an int), and come
  back as the masked *string* when something matched.
* Audit hashes are SHA-256 (first 16 hex chars) of the original value. Low-entropy values
  (a phone number) can be brute-forced from a bare hash, so pass ``audit_key`` (or set
  ``CTX_AUDIT_HMAC_KEY``) to get HMAC-SHA256 instead.
* A mapping *key* that itself holds a secret or PII (``{"sk_live_...": 1}``) is never written
  anywhere as is: audit paths name it ``<key:hash12>``; in the cleaned mapping it becomes that
  label too, or its masked form for PII-only keys (``138****1234``) when that is unambiguous.
* A string under a key that only loosely names a secret (``cloudant_key``, ``AWS_KEY``: a cue
  word, see :func:`context_core.gateway.redaction.is_cue_key`) is redacted when it is a high-entropy
  token (:func:`context_core.gateway.patterns.high_entropy`).
* A list or tuple of two items whose first is a secret-like key name (``["password", "v"]``,
  header pairs) has its second item redacted.
* Nesting deeper than 200 levels (structures, or JSON text inside strings) raises
  :class:`~context_core.errors.InputTooDeepError` before anything is returned or audited:
  the walk recurses per level and hostile depth must not become a RecursionError. Lone
  surrogates become U+FFFD, so the cleaned value always encodes as UTF-8 (JSON, Redis).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from context_core import defaults
from context_core.errors import InputTooDeepError
from context_core.fsutil import append_line
from context_core.gateway.redaction import (
    KNOWN_CLEAN,
    KNOWN_CLEAN_TEXT_MAX_LEN,
    REDACTED,
    cue_value_secret,
    fix_surrogates,
    is_cue_key,
    is_secret_key,
    json_too_deep,
    mask_mobile,
    redact_text,
    remember_clean,
)

if TYPE_CHECKING:
    from context_core.config import Settings

__all__ = [
    "REDACTED",
    "AuditRecord",
    "Finding",
    "Gateway",
    "install_log_redaction",
    "is_secret_key",
    "mask_mobile",
]


T = TypeVar("T")
log = logging.getLogger(__name__)

_MAX_DEPTH = 200


@dataclass(frozen=True, slots=True)
class Finding:
    """One removal: where (JSONPath-like), what kind, and a hash of the original value."""

    path: str
    kind: str  # secret_key, secret_value, pii_id, pii_phone, pii_email, pii_card, oversize
    value_sha256: str


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """All findings of one gateway call. Holds names and hashes only, never values."""

    ts: float
    where: str
    findings: tuple[Finding, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "ts": self.ts,
                "where": self.where,
                "findings": [
                    {"path": f.path, "kind": f.kind, "value_sha256": f.value_sha256}
                    for f in self.findings
                ],
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------

# A path is built as a chain of (parent, segment) tuples and rendered to text only when
# something is found: most values are clean, so most paths are never formatted.
# Segments: str = mapping key, int = sequence index, None = set member.
_Path = tuple[Any, str | int | None] | str
_ROOT: _Path = "$"
_PLAIN_KEY_RX = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*\Z")


class _KeyLabel(str):
    """Path segment for a key that held a secret or PII: ``<key:hash12>``, rendered unquoted
    (``$[<key:1f2e3d4c5b6a>].x``) so it cannot be mistaken for a literal key of that text."""

    __slots__ = ()


@functools.lru_cache(maxsize=4096)
def _key_segment(key: str) -> str:
    if _PLAIN_KEY_RX.match(key):
        return f".{key}"
    return f"[{json.dumps(key, ensure_ascii=False)}]"


def _render(path: _Path) -> str:
    segments: list[str | int | None] = []
    while isinstance(path, tuple):
        path, seg = path
        segments.append(seg)
    parts = [path]
    for seg in reversed(segments):
        if isinstance(seg, _KeyLabel):
            parts.append(f"[{seg}]")
        elif isinstance(seg, str):
            parts.append(_key_segment(seg))
        elif seg is None:
            parts.append("[*]")
        else:
            parts.append(f"[{seg}]")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Gateway
# --------------------------------------------------------------------------------------------


class Gateway:
    """Cleans values before they reach memory or logs; thread-safe, stateless apart from audit.

    ``on_alert(where, details)`` is called when a response is over the size cap; an exception
    from it is logged and swallowed (an alerting hiccup must not lose the cleaning).
    """

    def __init__(
        self,
        *,
        max_response_bytes: int = defaults.MAX_RESPONSE_BYTES,
        audit_path: Path | None = None,
        on_alert: Callable[[str, dict[str, Any]], None] | None = None,
        audit_tail: int = 1000,
        audit_key: bytes | None = None,
    ) -> None:
        if max_response_bytes <= 0:
            raise ValueError("max_response_bytes must be > 0 (CTX_MAX_RESPONSE_BYTES)")
        self.max_response_bytes = max_response_bytes
        self.audit_path = Path(audit_path) if audit_path is not None else None
        self.on_alert = on_alert
        self._audit_key = audit_key
        self._tail: deque[AuditRecord] = deque(maxlen=audit_tail)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Gateway:
        key = settings.audit_hmac_key
        return cls(
            max_response_bytes=settings.max_response_bytes,
            audit_path=settings.data_dir / "audit" / "audit.jsonl",
            audit_key=key.get_secret_value().encode() if key is not None else None,
        )

    # -- public API ---------------------------------------------------------------------------

    def clean(self, value: T, *, where: str) -> T:
        """Return a cleaned deep copy of ``value``; the input is never mutated.

        Raises :class:`InputTooDeepError` for nesting over the limit (nothing is audited).
        """
        findings: list[Finding] = []
        out = self._guarded(self._walk, value, findings)
        if findings:
            self._audit(where, findings)
        return out

    def clean_text(self, text: str, *, where: str) -> str:
        """Clean one free-text string (a log line, a user query, a trace payload).

        Text up to ``KNOWN_CLEAN_TEXT_MAX_LEN`` characters that had no finding is remembered
        (bounded), so the L1 state a session sends with every request is not scanned again
        and again; text with a finding is never remembered and is always scanned and audited.
        """
        if type(text) is str and text in KNOWN_CLEAN:
            return text
        findings: list[Finding] = []
        out = self._guarded(self._clean_str, text, findings)
        if findings:
            self._audit(where, findings)
        elif out == text and type(text) is str and len(text) <= KNOWN_CLEAN_TEXT_MAX_LEN:
            remember_clean(text)
        return out

    def clean_text_with_findings(self, text: str, *, where: str) -> tuple[str, tuple[Finding, ...]]:
        """:meth:`clean_text` that also says what it found (kinds and keyed hashes, never
        values), for a caller that reports the removals (the output sanitizer)."""
        if type(text) is str and text in KNOWN_CLEAN:
            return text, ()
        findings: list[Finding] = []
        out = self._guarded(self._clean_str, text, findings)
        if findings:
            self._audit(where, findings)
        return out, tuple(findings)

    def audit(self, where: str, findings: Sequence[Finding]) -> None:
        """Append a record of another part's removals (built with :meth:`hash_value`) to this
        gateway's audit trail: the same file, lock and tail as its own records."""
        if findings:
            self._audit(where, list(findings))

    def hash_value(self, raw: str | bytes) -> str:
        """The audit hash of a removed value: HMAC-SHA-256 with ``CTX_AUDIT_HMAC_KEY`` when
        set, else SHA-256; 16 hex characters."""
        return self._hash(raw)

    def clean_response(self, payload: Any, *, where: str) -> Any:
        """Clean, then cap: a JSON encoding over ``max_response_bytes`` UTF-8 bytes is replaced.

        The size is that of the *cleaned* payload (what would be stored), compact separators.
        """
        findings: list[Finding] = []
        out = self._guarded(self._walk, payload, findings)
        encoded = json.dumps(out, ensure_ascii=False, separators=(",", ":"), default=str).encode(
            "utf-8"
        )
        n = len(encoded)
        if n > self.max_response_bytes:
            findings.append(Finding("$", "oversize", self._hash(encoded)))
            self._audit(where, findings)
            self._alert(where, {"bytes": n, "limit": self.max_response_bytes})
            return {"error": "response too large"}
        if findings:
            self._audit(where, findings)
        return out

    @property
    def recent_audit(self) -> tuple[AuditRecord, ...]:
        with self._lock:
            return tuple(self._tail)

    # -- walking ------------------------------------------------------------------------------

    @staticmethod
    def _guarded(
        walk: Callable[[T, _Path, list[Finding], int], T], value: T, findings: list[Finding]
    ) -> T:
        """Run a walk from the root; a RecursionError (the caller's stack was already deep when
        the depth limit was still far) is reported as the input error it is, not as a crash."""
        try:
            return walk(value, _ROOT, findings, 0)
        except RecursionError:
            raise _too_deep(_ROOT) from None

    def _walk(self, value: Any, path: _Path, findings: list[Finding], depth: int) -> Any:
        t = type(value)  # exact-type dispatch first: this runs once per value of every write
        if t is str:
            return self._clean_str(value, path, findings, depth)
        if t is float or t is bool or value is None:
            return value
        if t is int:
            return self._scan_int(value, path, findings)
        if t is dict:
            return self._walk_mapping(value, path, findings, depth)
        if t is list and depth <= _MAX_DEPTH:
            if len(value) == 2 and _secret_pair(value):
                return self._walk_pair(value, path, findings, depth)
            return [self._walk(v, (path, i), findings, depth + 1) for i, v in enumerate(value)]
        return self._walk_other(value, path, findings, depth)

    def _walk_pair(self, value: Any, path: _Path, findings: list[Finding], depth: int) -> list[Any]:
        """``["password", "v"]``: the name is kept (cleaned), the value goes."""
        return [
            self._walk(value[0], (path, 0), findings, depth + 1),
            self._redact_tree(value[1], (path, 1), findings, depth + 1),
        ]

    def _walk_mapping(
        self, value: Mapping[Any, Any], path: _Path, findings: list[Finding], depth: int
    ) -> Any:
        if depth > _MAX_DEPTH:
            raise _too_deep(path)
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if type(k) is str and (k in KNOWN_CLEAN or (len(k) < 6 and k.isascii())):
                ck = seg = k  # the common case, inline: too short or seen clean before
            else:
                ck, seg = self._clean_key(k, path, findings, value, out)
            cpath: _Path = (path, seg)
            if isinstance(k, str) and is_secret_key(k):
                out[ck] = self._redact_tree(v, cpath, findings, depth + 1)
            elif type(v) is str and type(k) is str and is_cue_key(k) and cue_value_secret(v):
                # {"cloudant_key": "<random>"}: a loose key name and a value that looks random
                findings.append(Finding(_render(cpath), "secret_value", self._hash(v)))
                out[ck] = REDACTED
            else:
                out[ck] = self._walk(v, cpath, findings, depth + 1)
        return out if type(value) is dict else _rebuild_mapping(value, out)

    def _clean_key(
        self,
        k: Any,
        path: _Path,
        findings: list[Finding],
        original: Mapping[Any, Any],
        out: Mapping[Any, Any],
    ) -> tuple[Any, str]:
        """(key for the output, path segment). A key with a finding is audited under a
        ``<key:hash12>`` label, never its text; it is renamed to that label, or, for PII only,
        to its masked form unless another key of the mapping already has that name."""
        if type(k) is str and k in KNOWN_CLEAN:
            return k, k
        if isinstance(k, str):
            text = fix_surrogates(k)
        elif isinstance(k, int) and not isinstance(k, bool) and not -(10**10) < k < 10**10:
            text = str(k)
        else:  # tuple/float/... keys: cannot be renamed, but the audit path never shows them
            seg = str(k)
            if redact_text(seg)[1]:
                return k, _KeyLabel(f"<key:{self._hash(seg)[:12]}>")
            return k, seg
        cleaned, hits = redact_text(text)
        if not hits:
            return (text if isinstance(k, str) else k), text
        label = _KeyLabel(f"<key:{self._hash(text)[:12]}>")
        where = _render((path, label))
        findings.extend(Finding(where, kind, self._hash(raw)) for kind, raw in hits)
        pii_only = all(kind.startswith("pii_") for kind, _raw in hits)
        if pii_only and cleaned not in original and cleaned not in out:
            return cleaned, label
        return str(label), label

    def _walk_other(self, value: Any, path: _Path, findings: list[Finding], depth: int) -> Any:
        """Subclasses and the rarer containers (tuple, set, bytes, Mapping types)."""
        if isinstance(value, str):
            return self._clean_str(value, path, findings, depth)
        if isinstance(value, bool | float):
            return value
        if isinstance(value, int):
            return self._scan_int(value, path, findings)
        if depth > _MAX_DEPTH:
            raise _too_deep(path)
        if isinstance(value, Mapping):
            return self._walk_mapping(value, path, findings, depth)
        if isinstance(value, list | tuple):
            if len(value) == 2 and _secret_pair(value):
                items = self._walk_pair(value, path, findings, depth)
            else:
                items = [self._walk(v, (path, i), findings, depth + 1) for i, v in enumerate(value)]
            if isinstance(value, list):
                return items
            if hasattr(value, "_fields"):  # namedtuple
                return type(value)(*items)
            return tuple(items)
        if isinstance(value, set | frozenset):
            cleaned = {self._walk(v, (path, None), findings, depth + 1) for v in value}
            return type(value)(cleaned)
        if isinstance(value, bytes | bytearray):
            try:
                text = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return value
            cleaned_text = self._scan(text, path, findings)
            return value if cleaned_text == text else type(value)(cleaned_text.encode("utf-8"))
        return value

    def _redact_tree(self, value: Any, path: _Path, findings: list[Finding], depth: int) -> Any:
        """Everything under a secret key goes; structure (keys, list lengths) is kept."""
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str | bytes) and not value:
            return value
        if depth > _MAX_DEPTH:
            raise _too_deep(path)
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for k, v in value.items():
                ck, seg = self._clean_key(k, path, findings, value, out)
                out[ck] = self._redact_tree(v, (path, seg), findings, depth + 1)
            return _rebuild_mapping(value, out)
        if isinstance(value, list | tuple | set | frozenset):
            items = [
                self._redact_tree(v, (path, i), findings, depth + 1) for i, v in enumerate(value)
            ]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, str) and value == REDACTED:
            return value
        raw = value if isinstance(value, str) else repr(value)
        findings.append(Finding(_render(path), "secret_key", self._hash(raw)))
        return REDACTED

    def _scan_int(self, value: int, path: _Path, findings: list[Finding]) -> Any:
        if -(10**10) < value < 10**10:
            return value
        text = str(value)
        cleaned = self._scan(text, path, findings)
        return value if cleaned == text else cleaned

    # -- text scanning ------------------------------------------------------------------------

    def _clean_str(self, text: str, path: _Path, findings: list[Finding], depth: int) -> str:
        """A string holding a JSON object/array is cleaned structurally (so secret keys with
        nested values are caught), and re-encoded only when something was removed. JSON text
        nested deeper than the limit is refused (by the walk, or when the decoder gives up)."""
        if not text.isascii():
            text = fix_surrogates(text)
        if len(text) < 2 or not (text[0] in '{["' or text[0].isspace()):
            return self._scan(text, path, findings)
        stripped = text.strip()
        if len(stripped) >= 2 and stripped[0] in '{["' and stripped[-1] in '}]"':
            try:
                parsed = json.loads(stripped)
            except ValueError:
                parsed = None
            except RecursionError:
                # The decoder recurses per level and gave up (cleanly, at the interpreter's
                # limit): refuse it as too deep, unless its brackets do not even balance,
                # which makes it text, not JSON.
                if json_too_deep(stripped, _MAX_DEPTH) is not None:
                    raise _too_deep(path) from None
                parsed = None
            # "\ud800" escapes decode to lone surrogates: re-encode if cleaning replaced one
            escaped = "\\ud" in stripped or "\\uD" in stripped
            if isinstance(parsed, str):  # a JSON-encoded string: clean what it decodes to
                if depth >= _MAX_DEPTH:  # each level of encoding is one more level of walk
                    raise _too_deep(path)
                sub_text: list[Finding] = []
                cleaned_text = self._clean_str(parsed, path, sub_text, depth + 1)
                if not sub_text and not (escaped and cleaned_text != parsed):
                    return text
                findings.extend(sub_text)
                return json.dumps(cleaned_text, ensure_ascii=False)
            if isinstance(parsed, dict | list):
                sub: list[Finding] = []
                cleaned = self._walk(parsed, path, sub, depth + 1)
                if not sub and not (escaped and cleaned != parsed):
                    return text
                findings.extend(sub)
                compact = '": ' not in stripped and ", " not in stripped
                seps = (",", ":") if compact else (", ", ": ")
                return json.dumps(cleaned, ensure_ascii=False, separators=seps)
        return self._scan(text, path, findings)

    def _scan(self, text: str, path: _Path, findings: list[Finding]) -> str:
        if len(text) < 6 or text in KNOWN_CLEAN:
            return text  # callers hand over surrogate-free text (_clean_str fixed it)
        cleaned, hits = redact_text(text)
        if hits:
            where = _render(path)
            findings.extend(Finding(where, kind, self._hash(raw)) for kind, raw in hits)
        return cleaned

    # -- audit --------------------------------------------------------------------------------

    def _hash(self, raw: str | bytes) -> str:
        data = raw.encode("utf-8") if isinstance(raw, str) else raw
        if self._audit_key is not None:
            return hmac.new(self._audit_key, data, hashlib.sha256).hexdigest()[:16]
        return hashlib.sha256(data).hexdigest()[:16]

    def _audit(self, where: str, findings: list[Finding]) -> None:
        # "where" is a caller's label, but it may embed ids from data: clean it too, unaudited.
        record = AuditRecord(ts=time.time(), where=redact_text(where)[0], findings=tuple(findings))
        line = record.to_json() + "\n"
        with self._lock:
            self._tail.append(record)
            if self.audit_path is None:
                return
            try:
                append_line(self.audit_path, line)
            except OSError as e:
                # Never lose the cleaning because the audit disk is full; say where it failed.
                log.error("gateway audit write to %s failed: %s", self.audit_path, e)

    def _alert(self, where: str, details: dict[str, Any]) -> None:
        if self.on_alert is None:
            log.warning("gateway: response at %s too large: %s", where, details)
            return
        try:
            self.on_alert(where, details)
        except Exception:
            log.exception("gateway: on_alert callback failed for %s", where)


def _too_deep(path: _Path) -> InputTooDeepError:
    """The refusal for nesting over the limit; the path names where (keys already cleaned)."""
    return InputTooDeepError(
        f"gateway: {_render(path)} is nested deeper than {_MAX_DEPTH} levels (the nesting "
        "limit); flatten the value or store it as text"
    )


def _secret_pair(value: Any) -> bool:
    """A two-item list/tuple whose first item names a secret: ``("password", "v")``, header
    pairs. Names longer than 64 characters are text, not key names (and stay out of the key
    cache)."""
    first = value[0]
    return isinstance(first, str) and len(first) <= 64 and is_secret_key(first)


def _rebuild_mapping(original: Mapping[Any, Any], out: dict[Any, Any]) -> Any:
    """Keep dict subclasses (OrderedDict, defaultdict...) where that is cheap, else plain dict."""
    if type(original) is dict:
        return out
    try:
        if hasattr(original, "default_factory"):
            return type(original)(original.default_factory, out)  # type: ignore[call-arg]
        return type(original)(out)  # type: ignore[call-arg]
    except TypeError:
        return out


# --------------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------------


_filter_state = threading.local()


class _RedactionFilter(logging.Filter):
    """Replaces a record's message by the cleaned, fully formatted message (args cleared)."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__("context_core.gateway.sanitize")
        self.gateway = gateway

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_ctx_redacted", False):
            return True
        if getattr(_filter_state, "active", False):
            # A line logged while cleaning another (the gateway's own audit-failure error):
            # clean it without auditing, so a failing audit file cannot recurse.
            try:
                msg = record.getMessage()
            except Exception:
                msg = f"{record.msg!s} {record.args!r}"
            record.msg = redact_text(msg)[0]
            record.args = None
            record._ctx_redacted = True
            return True
        _filter_state.active = True
        try:
            self._clean_record(record)
        except InputTooDeepError as e:
            # A log call with a hostile structure must neither crash the caller nor leak it.
            record.msg = f"[log message dropped: {e}]"
            record.args = None
            record.exc_info = record.exc_text = record.stack_info = None
        finally:
            _filter_state.active = False
        record._ctx_redacted = True
        return True

    def _clean_record(self, record: logging.LogRecord) -> None:
        where = f"log:{record.name}"
        # Structured args (dicts, lists) are cleaned as structures first: their repr() is not
        # JSON, so a nested value under a secret key would be hard to find in the text.
        if record.args:
            record.args = self.gateway.clean(record.args, where=where)
        if not isinstance(record.msg, str):
            record.msg = self.gateway.clean(record.msg, where=where)
        try:
            msg = record.getMessage()
        except Exception:  # bad %-args: still log something, cleaned
            msg = f"{record.msg!s} {record.args!r}"
        record.msg = self.gateway.clean_text(msg, where=where)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.gateway.clean_text(record.exc_text, where=where)
        if record.stack_info:
            record.stack_info = self.gateway.clean_text(record.stack_info, where=where)


def install_log_redaction(gateway: Gateway, logger: logging.Logger | None = None) -> None:
    """Clean every line logged through ``logger`` (default: root) and its current handlers.

    The filter goes on the logger (records logged on it directly) and on each of its handlers
    (records propagated from child loggers). Installing again replaces the gateway instead of
    stacking filters. Handlers added later are not covered: install after configuring logging.
    """
    target = logger if logger is not None else logging.getLogger()
    for holder in [target, *target.handlers]:
        existing = [f for f in holder.filters if isinstance(f, _RedactionFilter)]
        if existing:
            for f in existing:
                f.gateway = gateway
        else:
            holder.addFilter(_RedactionFilter(gateway))
