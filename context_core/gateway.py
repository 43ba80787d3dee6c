"""The sanitize gateway: the one door every write into memory, and every log line, passes.

Why one door: an agent that stores a tool response verbatim will sooner or later store a
bearer token, a customer's mobile number or a 5 MB blob. The gateway makes the clean copy
the *only* copy the layers see, and leaves an audit trail that says *where* something was
removed and a hash of *what* was removed, never the value itself.

Three kinds of cleaning, applied at any depth of dicts/lists/tuples/sets:

* **key-based**: values under secret-like keys (``api_key``, ``dbPassword``,
  ``AWS_SECRET_ACCESS_KEY``, ``Set-Cookie`` ...) become :data:`REDACTED`, see
  :func:`is_secret_key` for the exact rule and what is deliberately *not* a secret key;
* **value patterns** in every string: provider keys (``sk_live_``, ``AKIA``, ``ghp_``,
  ``xoxb-``), JWTs, ``Bearer``/``Basic`` credentials, PEM private keys, ``user:pw@`` in URLs,
  ``password=...``-style assignments in free text;
* **PII masking**: PRC resident ID numbers (checksum-validated), mainland mobile numbers,
  e-mail addresses, bank-card numbers (Luhn-validated).

Choices (documented because they trade false positives against false negatives; a leaked
secret costs more than an over-redacted field):

* ID numbers are masked only when the ISO 7064 MOD 11-2 check digit is right, so random
  18-digit numbers (order ids, hashes) survive; the mask keeps the 6-digit region code and the
  last 4 characters: ``110101********123X``.
* Card numbers must pass Luhn and start with 2-6 or 9 (the issuer ranges of Visa, Mastercard,
  Amex, JCB, Discover and UnionPay), so 13-digit epoch-millisecond timestamps are left alone.
  Every digit but the last 4 becomes ``*``; separators are kept.
* Integers with 11+ digits are scanned for PII too (a phone number stored as an int), and come
  back as the masked *string* when something matched.
* Audit hashes are SHA-256 (first 16 hex chars) of the original value. Low-entropy values
  (a phone number) can be brute-forced from a bare hash, so pass ``audit_key`` (or set
  ``CTX_AUDIT_HMAC_KEY``) to get HMAC-SHA256 instead.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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

REDACTED = "[REDACTED]"

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
# Secret keys
# --------------------------------------------------------------------------------------------

# A key is split into words (separators - _ . space, camelCase, digits); the words are also
# joined into one lower-case "compact" string.
_WORD_RX = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+|[^\W\d_A-Za-z]+")

# Substrings of the compact key that always mean "secret" (dbPassword, AWS_SECRET_ACCESS_KEY,
# x-api-key, Proxy-Authorization, Set-Cookie, client_secret, privateKey ...).
_STRONG = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "apikey",
    "privatekey",
    "credential",
    "authorization",
    "cookie",
    "accesskey",
    "signingkey",
    "encryptionkey",
    "masterkey",
    "sshkey",
    "licensekey",
    "密码",
    "口令",
    "密钥",
    "令牌",
    "凭证",
)
# Whole words that mean "secret": pwd, pass, jwt ... and any word ending in "token"
# (token, access_token, csrftoken, ACCESSTOKEN). "tokens" (plural) is NOT a secret word:
# tokens_used / max_tokens / prompt_tokens are counts in every LLM API response.
_WEAK_WORDS = frozenset({"pwd", "pass", "jwt", "otp", "bearer"})
# A key whose LAST word is one of these describes a secret rather than holding it:
# token_count, token_type, password_length, secret_name, token_expires_at.
_HARMLESS_LAST = frozenset(
    {
        "count",
        "counts",
        "type",
        "types",
        "usage",
        "used",
        "limit",
        "limits",
        "len",
        "length",
        "size",
        "num",
        "number",
        "total",
        "max",
        "min",
        "ttl",
        "expiry",
        "expires",
        "expired",
        "exp",
        "at",
        "in",
        "name",
        "kind",
        "index",
        "idx",
        "budget",
        "policy",
        "url",
        "uri",
        "endpoint",
        "present",
        "set",
        "required",
        "enabled",
    }
)


@functools.lru_cache(maxsize=8192)
def is_secret_key(key: str) -> bool:
    """True if a mapping key names a secret; its value is then redacted whatever it looks like.

    Rule: the lower-cased key with separators removed contains a strong word (password, secret,
    apikey, privatekey, credential, authorization, cookie, accesskey, ...), or one of its words
    ends in ``token`` or is pwd/pass/jwt/otp/bearer, or its last word is ``auth``. Exception:
    a key whose last word is a metadata word (count, type, length, expires_at, name, ...)
    describes a secret and is kept, so ``tokens_used``, ``token_count`` and ``token_type``
    survive while ``session_token`` and ``AWS_SECRET_ACCESS_KEY`` do not.
    """
    words = [w.lower() for w in _WORD_RX.findall(key)]
    if not words:
        return False
    if len(words) > 1 and words[-1] in _HARMLESS_LAST:
        return False
    compact = "".join(words)
    if any(s in compact for s in _STRONG):
        return True
    if words[-1] == "auth":
        return True
    return any(w.endswith("token") or w in _WEAK_WORDS for w in words)


# --------------------------------------------------------------------------------------------
# Value patterns
# --------------------------------------------------------------------------------------------

_PEM_RX = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL
)
_URL_CRED_RX = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^\s:/@?#]*):([^\s/@?#]+)@")
_BEARER_RX = re.compile(r"(?i)\b(bearer)(\s+)([A-Za-z0-9\-._~+/]+=*)")
_BASIC_RX = re.compile(r"\b(Basic)(\s+)([A-Za-z0-9+/]{4,}={0,2})")
_JWT_RX = re.compile(r"eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*")
_PROVIDER_RX = re.compile(
    r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}"  # Stripe-style secret / restricted keys
    r"|(?:AKIA|ASIA)[0-9A-Z]{16,}"  # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"  # Slack
)
# key=value / key: value / "key": "value" in free text (and in JSON carried as a string).
# The key must *start* at a non-key char (lookbehind), which keeps matching linear.
_ASSIGN_RX = re.compile(
    r"""(?<![\w.\-])(?P<k>[\w.\-]*?(?:pass|pwd|secret|token|api[\-_.]?key|private[\-_.]?key|access[\-_.]?key|auth|credential|cookie|jwt|otp|密码|口令|密钥|令牌|凭证)[\w.\-]*)"""
    r"""(?P<kq>\\?["']?)(?P<sep>\s*[:=：]\s*)"""
    r"""(?P<v>\\"(?:[^"\\]|\\(?!"))*\\"|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"""
    r"""|(?:(?:bearer|basic|token|digest)\s+)?[^\s"',;&<>(){}\[\]]+)""",
    re.IGNORECASE,
)

_ID_RX = re.compile(r"(?<![0-9A-Za-z])([1-9][0-9]{5})([0-9]{8})([0-9]{3}[0-9Xx])(?![0-9A-Za-z])")
_CARD_RX = re.compile(r"(?<![0-9])[2-69][0-9](?:[ \-]?[0-9]){11,17}(?![0-9])")
_PHONE_RX = re.compile(
    r"(?<![0-9])(?P<cc>(?:\+|00)?86[ \-]?)?(?P<a>1[3-9][0-9])[ \-]?(?P<b>[0-9]{4})[ \-]?"
    r"(?P<c>[0-9]{4})(?![0-9])"
)
_EMAIL_RX = re.compile(
    r"(?<![A-Za-z0-9._%+\-])([A-Za-z0-9])[A-Za-z0-9._%+\-]*@([A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+)"
)
_DIGIT_RX = re.compile(r"[0-9]")
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
# Cheap substring gates: a rule's regex only runs when its marker is present.
_ASSIGN_MARKERS = ("=", ":", "：")
_ASSIGN_WORDS = (
    "pass",
    "pwd",
    "secret",
    "token",
    "key",
    "auth",
    "credential",
    "cookie",
    "jwt",
    "otp",
    "密码",
    "口令",
    "密钥",
    "令牌",
    "凭证",
)


def _id_checksum_ok(id17: str, check: str) -> bool:
    total = sum(int(c) * w for c, w in zip(id17, _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == check.upper()


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _looks_random(tok: str) -> bool:
    """A credential rather than an English word: long enough and not plain lowercase prose."""
    if len(tok) < 8:
        return False
    has_digit = any(c.isdigit() for c in tok)
    return has_digit or (any(c.isupper() for c in tok) and any(c.islower() for c in tok))


def _basic_ok(tok: str) -> bool:
    """HTTP Basic credentials are base64 of ``user:password``; anything else is prose."""
    if len(tok) % 4:
        return False
    try:
        raw = base64.b64decode(tok, validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in raw


def _mask_phone_match(m: re.Match[str]) -> str:
    return f"{m.group('cc') or ''}{m.group('a')}****{m.group('c')}"


def mask_mobile(text: str) -> str:
    """Mask mainland mobile numbers only: ``13812341234`` -> ``138****1234`` (no audit)."""
    if not _DIGIT_RX.search(text):
        return text
    return _PHONE_RX.sub(_mask_phone_match, text)


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------

_PLAIN_KEY_RX = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*\Z")


def _child_path(path: str, key: object) -> str:
    if isinstance(key, str) and _PLAIN_KEY_RX.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(str(key), ensure_ascii=False)}]"


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
        max_response_bytes: int = 10240,
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
        self._dir_ready = False

    @classmethod
    def from_settings(cls, settings: Settings) -> Gateway:
        key = getattr(settings, "audit_hmac_key", None)
        return cls(
            max_response_bytes=settings.max_response_bytes,
            audit_path=settings.data_dir / "audit" / "audit.jsonl",
            audit_key=key.get_secret_value().encode() if key is not None else None,
        )

    # -- public API ---------------------------------------------------------------------------

    def clean(self, value: T, *, where: str) -> T:
        """Return a cleaned deep copy of ``value``; the input is never mutated."""
        findings: list[Finding] = []
        out = self._walk(value, "$", findings, 0)
        if findings:
            self._audit(where, findings)
        return out

    def clean_text(self, text: str, *, where: str) -> str:
        findings: list[Finding] = []
        out = self._scan(text, "$", findings)
        if findings:
            self._audit(where, findings)
        return out

    def clean_response(self, payload: Any, *, where: str) -> Any:
        """Clean, then cap: a JSON encoding over ``max_response_bytes`` UTF-8 bytes is replaced.

        The size is that of the *cleaned* payload (what would be stored), compact separators.
        """
        findings: list[Finding] = []
        out = self._walk(payload, "$", findings, 0)
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

    def _walk(self, value: Any, path: str, findings: list[Finding], depth: int) -> Any:
        if isinstance(value, str):
            return self._scan(value, path, findings)
        if value is None or isinstance(value, bool | float):
            return value
        if isinstance(value, int):
            return self._scan_int(value, path, findings)
        if depth > _MAX_DEPTH:
            raise ValueError(f"gateway: {path} is nested deeper than {_MAX_DEPTH} levels")
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for k, v in value.items():
                ck = self._scan(k, _child_path(path, k), findings) if isinstance(k, str) else k
                cpath = _child_path(path, ck)
                if isinstance(k, str) and is_secret_key(k):
                    out[ck] = self._redact_tree(v, cpath, findings, depth + 1)
                else:
                    out[ck] = self._walk(v, cpath, findings, depth + 1)
            return _rebuild_mapping(value, out)
        if isinstance(value, list | tuple):
            items = [
                self._walk(v, f"{path}[{i}]", findings, depth + 1) for i, v in enumerate(value)
            ]
            if isinstance(value, list):
                return items
            if hasattr(value, "_fields"):  # namedtuple
                return type(value)(*items)
            return tuple(items)
        if isinstance(value, set | frozenset):
            cleaned = {self._walk(v, f"{path}[*]", findings, depth + 1) for v in value}
            return type(value)(cleaned)
        if isinstance(value, bytes | bytearray):
            try:
                text = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return value
            cleaned_text = self._scan(text, path, findings)
            return value if cleaned_text == text else type(value)(cleaned_text.encode("utf-8"))
        return value

    def _redact_tree(self, value: Any, path: str, findings: list[Finding], depth: int) -> Any:
        """Everything under a secret key goes; structure (keys, list lengths) is kept."""
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str | bytes) and not value:
            return value
        if depth > _MAX_DEPTH:
            raise ValueError(f"gateway: {path} is nested deeper than {_MAX_DEPTH} levels")
        if isinstance(value, Mapping):
            out = {
                k: self._redact_tree(v, _child_path(path, k), findings, depth + 1)
                for k, v in value.items()
            }
            return _rebuild_mapping(value, out)
        if isinstance(value, list | tuple | set | frozenset):
            items = [
                self._redact_tree(v, f"{path}[{i}]", findings, depth + 1)
                for i, v in enumerate(value)
            ]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, str) and value == REDACTED:
            return value
        raw = value if isinstance(value, str) else repr(value)
        findings.append(Finding(path, "secret_key", self._hash(raw)))
        return REDACTED

    def _scan_int(self, value: int, path: str, findings: list[Finding]) -> Any:
        if -(10**10) < value < 10**10:
            return value
        text = str(value)
        cleaned = self._scan(text, path, findings)
        return value if cleaned == text else cleaned

    # -- text scanning ------------------------------------------------------------------------

    def _scan(self, text: str, path: str, findings: list[Finding]) -> str:
        """Apply every value pattern to one string; each rule runs only if its marker is there."""
        if len(text) < 6:
            return text
        has_digit = _DIGIT_RX.search(text) is not None
        lower = text.lower()

        def note(kind: str, raw: str) -> None:
            findings.append(Finding(path, kind, self._hash(raw)))

        if "-----BEGIN" in text:

            def pem(m: re.Match[str]) -> str:
                note("secret_value", m.group(0))
                return REDACTED

            text = _PEM_RX.sub(pem, text)
        if "://" in text:

            def url(m: re.Match[str]) -> str:
                if m.group(3) == REDACTED:
                    return m.group(0)
                note("secret_value", m.group(3))
                return f"{m.group(1)}{m.group(2)}:{REDACTED}@"

            text = _URL_CRED_RX.sub(url, text)
        if "bearer" in lower:

            def bearer(m: re.Match[str]) -> str:
                if not _looks_random(m.group(3)):
                    return m.group(0)
                note("secret_value", m.group(3))
                return f"{m.group(1)}{m.group(2)}{REDACTED}"

            text = _BEARER_RX.sub(bearer, text)
        if "Basic" in text:

            def basic(m: re.Match[str]) -> str:
                if not _basic_ok(m.group(3)):
                    return m.group(0)
                note("secret_value", m.group(3))
                return f"{m.group(1)}{m.group(2)}{REDACTED}"

            text = _BASIC_RX.sub(basic, text)
        if "eyJ" in text:

            def jwt(m: re.Match[str]) -> str:
                note("secret_value", m.group(0))
                return REDACTED

            text = _JWT_RX.sub(jwt, text)
        if (
            "k_live_" in text
            or "k_test_" in text
            or "AKIA" in text
            or "ASIA" in text
            or "gh" in text
            or "xox" in text
        ):

            def provider(m: re.Match[str]) -> str:
                note("secret_value", m.group(0))
                return REDACTED

            text = _PROVIDER_RX.sub(provider, text)
        if any(s in text for s in _ASSIGN_MARKERS) and any(w in lower for w in _ASSIGN_WORDS):
            text = _ASSIGN_RX.sub(lambda m: self._assign(m, note), text)
        if has_digit:

            def pid(m: re.Match[str]) -> str:
                if not _id_checksum_ok(m.group(1) + m.group(2) + m.group(3)[:3], m.group(3)[3]):
                    return m.group(0)
                note("pii_id", m.group(0))
                return f"{m.group(1)}********{m.group(3)}"

            text = _ID_RX.sub(pid, text)

            def card(m: re.Match[str]) -> str:
                s = m.group(0)
                digits = s.replace(" ", "").replace("-", "")
                if not 13 <= len(digits) <= 19 or not _luhn_ok(digits):
                    return s
                note("pii_card", digits)
                keep_from = len(s)
                seen = 0
                while seen < 4:
                    keep_from -= 1
                    if s[keep_from].isdigit():
                        seen += 1
                return "".join("*" if c.isdigit() else c for c in s[:keep_from]) + s[keep_from:]

            text = _CARD_RX.sub(card, text)

            def phone(m: re.Match[str]) -> str:
                note("pii_phone", m.group("a") + m.group("b") + m.group("c"))
                return _mask_phone_match(m)

            text = _PHONE_RX.sub(phone, text)
        if "@" in text:

            def email(m: re.Match[str]) -> str:
                note("pii_email", m.group(0))
                return f"{m.group(1)}***@{m.group(2)}"

            text = _EMAIL_RX.sub(email, text)
        return text

    @staticmethod
    def _assign(m: re.Match[str], note: Callable[[str, str], None]) -> str:
        key = m.group("k")
        if key.isascii() and not is_secret_key(key):
            return m.group(0)
        v = m.group("v")
        scheme = ""
        low = v.lower()
        for word in ("bearer ", "basic ", "token ", "digest "):
            if low.startswith(word):
                scheme, v = v[: len(word)], v[len(word) :].lstrip()
                break
        if v.startswith('\\"'):
            q_open, q_close, inner = '\\"', '\\"', v[2:-2]
        elif v[:1] in "\"'":
            q_open, q_close, inner = v[0], v[0], v[1:-1]
        else:
            q_open, q_close, inner = "", "", v
        if not inner or inner.startswith(REDACTED) or (not scheme and low in ("bearer", "basic")):
            return m.group(0)
        note("secret_value", inner)
        prefix = m.group(0)[: m.start("v") - m.start(0)]
        return f"{prefix}{scheme}{q_open}{REDACTED}{q_close}"

    # -- audit --------------------------------------------------------------------------------

    def _hash(self, raw: str | bytes) -> str:
        data = raw.encode("utf-8") if isinstance(raw, str) else raw
        if self._audit_key is not None:
            return hmac.new(self._audit_key, data, hashlib.sha256).hexdigest()[:16]
        return hashlib.sha256(data).hexdigest()[:16]

    def _audit(self, where: str, findings: list[Finding]) -> None:
        record = AuditRecord(ts=time.time(), where=mask_mobile(where), findings=tuple(findings))
        line = record.to_json() + "\n"
        with self._lock:
            self._tail.append(record)
            if self.audit_path is None:
                return
            try:
                if not self._dir_ready:
                    self.audit_path.parent.mkdir(parents=True, exist_ok=True)
                    self._dir_ready = True
                with self.audit_path.open("a", encoding="utf-8") as fh:
                    fh.write(line)
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


class _RedactionFilter(logging.Filter):
    """Replaces a record's message by the cleaned, fully formatted message (args cleared)."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__("context_core.gateway")
        self.gateway = gateway

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_ctx_redacted", False):
            return True
        where = f"log:{record.name}"
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
        record._ctx_redacted = True
        return True


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
