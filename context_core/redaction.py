"""What counts as a secret or as PII, and how it is masked: the rules behind the gateway.

Pure functions and precompiled patterns, no I/O: :mod:`context_core.gateway` walks the data,
audits and caps; this module only decides about one key or one string. The one piece of state
is :data:`KNOWN_CLEAN`, a bounded memo of short strings that had *no* finding (keys, status
words), which lets the walk skip them.

Choices (documented because they trade false positives against false negatives; a leaked
secret costs more than an over-redacted field):

* Keys: see :func:`is_secret_key`. ``tokens``/``tokens_used``/``token_count`` are kept (LLM
  usage counters are everywhere), ``token``/``*_token``/``*Token`` are secrets.
* ID numbers (18 digits, last may be X) are masked only when the ISO 7064 MOD 11-2 check
  character is right, so random 18-digit numbers (order ids) survive; the mask keeps the
  6-digit region code and the last 4 characters: ``110101********123X``.
* Card numbers (13-19 digits, single spaces/dashes allowed) must pass Luhn and start with 2-6
  or 9 (Visa, Mastercard, Amex, JCB, Discover, UnionPay ranges), so 13-digit epoch-millisecond
  timestamps are left alone. Every digit but the last 4 becomes ``*``; separators are kept.
* Mobile numbers ``1[3-9]`` + 9 digits, optional ``+86``/``0086``/``86`` and separators:
  ``138****1234`` (the country prefix is kept as written).
* E-mail: first character of the local part and the domain are kept: ``j***@example.com``.
* ``Bearer x`` needs a token that looks random (8+ chars with a digit or mixed case) so prose
  ("use a bearer token") survives; ``Basic x`` must decode to ``user:password``.
* ``key=value`` / ``key: value`` / ``"key": "value"`` in free text: redacted when the key
  passes :func:`is_secret_key`; the value is one quoted string, one ``{...}``/``[...]`` level,
  or one run of non-separator characters. A secret containing spaces or commas unquoted in
  prose is only partly caught: structured data is the safe path.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Callable

__all__ = ["KNOWN_CLEAN", "REDACTED", "Hits", "is_secret_key", "mask_mobile", "redact_text"]

REDACTED = "[REDACTED]"

# --------------------------------------------------------------------------------------------
# Secret keys
# --------------------------------------------------------------------------------------------

# A key is split into parts at separators (anything but letters/digits, and "_"); a part in
# proper camelCase is also split into pieces. Random-case keys ("aCCESS_tOKEN") are judged by
# their separator parts, so odd casing cannot hide a secret key.
_SEP_RX = re.compile(r"[\W_]+")
_CAMEL_RX = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+|[^\W\d_A-Za-z]+")
_TITLE_RX = re.compile(r"[A-Z][a-z]+\Z")


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Substrings of the compact key that always mean "secret" (dbPassword, AWS_SECRET_ACCESS_KEY,
# x-api-key, Proxy-Authorization, Set-Cookie, client_secret, privateKey ...).
_STRONG = _words(
    "password passwd passphrase secret apikey privatekey credential authorization "
    "cookie accesskey signingkey encryptionkey masterkey sshkey licensekey 密码 口令 密钥 "
    "令牌 凭证"
)
# Whole words that mean "secret": pwd, pass, jwt ... and any word ending in "token"
# (token, access_token, csrftoken, ACCESSTOKEN). "tokens" (plural) is NOT a secret word:
# tokens_used / max_tokens / prompt_tokens are counts in every LLM API response.
_WEAK_WORDS = frozenset({"pwd", "pass", "jwt", "otp", "bearer"})
# A key whose LAST word is one of these describes a secret rather than holding it:
# token_count, token_type, password_length, secret_name, token_expires_at.
_HARMLESS_LAST = frozenset(
    _words(
        "count counts type types usage used limit limits len length size num number total "
        "max min ttl expiry expires expired exp at in name kind index idx budget policy "
        "url uri endpoint present set required enabled"
    )
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
    parts = [p for p in _SEP_RX.split(key) if p]
    if not parts:
        return False
    last = parts[-1]
    if len(parts) > 1 and last.lower() in _HARMLESS_LAST:
        return False
    last_pieces = _CAMEL_RX.findall(last)
    if (
        len(last_pieces) > 1
        and _TITLE_RX.match(last_pieces[-1])
        and last_pieces[-1].lower() in _HARMLESS_LAST
    ):
        return False  # tokenCount, tokensUsed
    compact = "".join(parts).lower()
    if any(s in compact for s in _STRONG):
        return True
    if last.lower().endswith("auth"):  # auth, basic_auth, basicAuth, oauth
        return True
    words = {p.lower() for p in parts}
    words.update(w.lower() for p in parts for w in _CAMEL_RX.findall(p))
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
_ASSIGN_KEYWORDS = (
    r"pass|pwd|secret|token|api[\-_.]?key|private[\-_.]?key|access[\-_.]?key|auth|credential"
    r"|cookie|jwt|otp|密码|口令|密钥|令牌|凭证"
)
_ASSIGN_RX = re.compile(
    # A key starts a word, holds a keyword (found by a lookahead, which never backtracks) and
    # is then taken whole and possessively: linear time even on 100 KB of "passpass...".
    # Whether the key really names a secret is decided by is_secret_key in _assign.
    rf"""(?<![\w.\-])(?=[\w.\-]*?(?:{_ASSIGN_KEYWORDS}))(?P<k>[\w.\-]++)"""
    r"""(?P<kq>\\*["']?)(?P<sep>\s*[:=：]\s*)(?P<v>"""
    # a quoted value, also when escaped once or more (JSON inside JSON inside a log line)
    r"""(?P<eq>\\+["'])(?:(?!(?P=eq))[^\n])*(?P=eq)"""
    r"""|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"""
    r"""|\{[^{}]*\}|\[[^\[\]]*\]"""  # one level of {...} / [...] (Python reprs in log lines)
    r"""|(?:(?:bearer|basic|token|digest)\s+)?[^\s"',;&<>(){}\[\]]+)""",
    re.IGNORECASE,
)

_ID_RX = re.compile(r"(?<![0-9A-Za-z])([1-9][0-9]{5})([0-9]{8})([0-9]{3}[0-9Xx])(?![0-9A-Za-z])")
# Digit runs glued to ASCII letters are parts of hex hashes and ids (content_hash,
# data_sha256), not phone or card numbers: masking them would corrupt the hash.
_CARD_RX = re.compile(r"(?<![0-9A-Za-z])[2-69][0-9](?:[ \-]?[0-9]){11,17}(?![0-9A-Za-z])")
_PHONE_RX = re.compile(
    r"(?<![0-9A-Za-z])(?P<cc>(?:\+|00)?86[ \-]?)?(?P<a>1[3-9][0-9])[ \-]?(?P<b>[0-9]{4})"
    r"[ \-]?(?P<c>[0-9]{4})(?![0-9A-Za-z])"
)
_EMAIL_RX = re.compile(
    r"(?<![A-Za-z0-9._%+\-])([A-Za-z0-9])[A-Za-z0-9._%+\-]*@([A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+)"
)
_DIGIT_RX = re.compile(r"[0-9]")
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_CLOSERS = {"{": "}", "[": "]"}


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


# Each handler gets a match and returns (replacement, finding kind, original value) or None
# to leave the match alone (a lookalike that failed validation).
_Hit = tuple[str, str, str] | None
_Handler = Callable[[re.Match[str]], _Hit]
Hits = list[tuple[str, str]]  # (finding kind, original value) per removal


def _whole(m: re.Match[str]) -> _Hit:
    return REDACTED, "secret_value", m.group(0)


def _url_cred(m: re.Match[str]) -> _Hit:
    if m.group(3) == REDACTED:
        return None
    return f"{m.group(1)}{m.group(2)}:{REDACTED}@", "secret_value", m.group(3)


def _bearer(m: re.Match[str]) -> _Hit:
    if not _looks_random(m.group(3)):
        return None
    return f"{m.group(1)}{m.group(2)}{REDACTED}", "secret_value", m.group(3)


def _basic(m: re.Match[str]) -> _Hit:
    if not _basic_ok(m.group(3)):
        return None
    return f"{m.group(1)}{m.group(2)}{REDACTED}", "secret_value", m.group(3)


def _assign(m: re.Match[str]) -> _Hit:
    if not is_secret_key(m.group("k")):
        return None
    v = m.group("v")
    scheme = ""
    low = v.lower()
    for word in ("bearer ", "basic ", "token ", "digest "):
        if low.startswith(word):
            scheme, v = v[: len(word)], v[len(word) :].lstrip()
            break
    eq = m.group("eq")
    if eq and not scheme:
        q_open, q_close, inner = eq, eq, v[len(eq) : -len(eq)]
    elif v[:1] in "\"'{[":
        q_open, q_close, inner = v[0], _CLOSERS.get(v[0], v[0]), v[1:-1]
    else:
        q_open, q_close, inner = "", "", v
    if not inner.strip() or inner.startswith(REDACTED):
        return None
    if not scheme and low in ("bearer", "basic"):  # "Bearer [REDACTED]" was done already
        return None
    prefix = m.group(0)[: m.start("v") - m.start(0)]
    return f"{prefix}{scheme}{q_open}{REDACTED}{q_close}", "secret_value", inner


def _redact_assignments(text: str, hits: Hits) -> str:
    """key=value rule. A value after a key that is *not* secret ("tokens: api_key=...") is
    scanned again, so a non-secret key can never swallow a secret assignment behind it."""
    if _ASSIGN_RX.search(text) is None:
        return text

    def sub(m: re.Match[str]) -> str:
        hit = _assign(m)
        if hit is not None:
            replacement, kind, raw = hit
            hits.append((kind, raw))
            return replacement
        if is_secret_key(m.group("k")):  # secret key, value already redacted or empty
            return m.group(0)
        prefix = m.group(0)[: m.start("v") - m.start(0)]
        return prefix + _redact_assignments(m.group("v"), hits)

    return _ASSIGN_RX.sub(sub, text)


def _prc_id(m: re.Match[str]) -> _Hit:
    if not _id_checksum_ok(m.group(1) + m.group(2) + m.group(3)[:3], m.group(3)[3]):
        return None
    return f"{m.group(1)}********{m.group(3)}", "pii_id", m.group(0)


def _card(m: re.Match[str]) -> _Hit:
    s = m.group(0)
    digits = s.replace(" ", "").replace("-", "")
    if not 13 <= len(digits) <= 19 or not _luhn_ok(digits):
        return None
    keep_from, seen = len(s), 0
    while seen < 4:
        keep_from -= 1
        seen += s[keep_from].isdigit()
    masked = "".join("*" if c.isdigit() else c for c in s[:keep_from]) + s[keep_from:]
    return masked, "pii_card", digits


def _phone(m: re.Match[str]) -> _Hit:
    return _mask_phone_match(m), "pii_phone", m.group("a") + m.group("b") + m.group("c")


def _email(m: re.Match[str]) -> _Hit:
    return f"{m.group(1)}***@{m.group(2)}", "pii_email", m.group(0)


_LONG_DIGITS_RX = re.compile(r"[0-9](?:[ \-]?[0-9]){10}")  # 11+ digits: phone, card, ID
_ASSIGN_GATE_RX = re.compile(_ASSIGN_KEYWORDS, re.IGNORECASE)
# Short strings seen clean before (keys, enum values, status words) skip the rules entirely.
# Only strings with no finding are remembered, so no secret is ever kept here.
KNOWN_CLEAN: dict[str, None] = {}
_KNOWN_CLEAN_MAX_LEN = 64
_KNOWN_CLEAN_MAX_ITEMS = 8192


def _apply(text: str, rx: re.Pattern[str], handle: _Handler, hits: Hits) -> str:
    if rx.search(text) is None:  # the common case: no match, no closure, no copy
        return text

    def sub(m: re.Match[str]) -> str:
        hit = handle(m)
        if hit is None:
            return m.group(0)
        replacement, kind, raw = hit
        hits.append((kind, raw))
        return replacement

    return rx.sub(sub, text)


def redact_text(text: str) -> tuple[str, Hits]:
    """Apply every value rule to one string; return the cleaned text and (kind, original) hits.

    Order matters: whole-credential shapes first (a PEM block or JWT may contain ``key=`` text),
    then key=value assignments, then PII (an ID number is checked before it can look like a
    card). Each rule runs only behind a cheap gate (a marker substring), so the common case, a
    short string with no digits and no markers, costs a few ``in`` tests.
    """
    hits: Hits = []
    if len(text) < 6:
        return text, hits
    short = len(text) <= _KNOWN_CLEAN_MAX_LEN
    if short and text in KNOWN_CLEAN:
        return text, hits
    lower = text.lower()
    if "-----BEGIN" in text:
        text = _apply(text, _PEM_RX, _whole, hits)
    if "://" in text:
        text = _apply(text, _URL_CRED_RX, _url_cred, hits)
    if "bearer" in lower:
        text = _apply(text, _BEARER_RX, _bearer, hits)
    if "Basic" in text:
        text = _apply(text, _BASIC_RX, _basic, hits)
    if "eyJ" in text:
        text = _apply(text, _JWT_RX, _whole, hits)
    if (
        "gh" in text
        or "xox" in text
        or "k_live_" in text
        or "k_test_" in text
        or "AKIA" in text
        or "ASIA" in text
        or "github_pat_" in text
    ):
        text = _apply(text, _PROVIDER_RX, _whole, hits)
    if ("=" in text or ":" in text or "：" in text) and _ASSIGN_GATE_RX.search(lower):
        text = _redact_assignments(text, hits)
    if _LONG_DIGITS_RX.search(text):
        text = _apply(text, _ID_RX, _prc_id, hits)
        text = _apply(text, _CARD_RX, _card, hits)
        text = _apply(text, _PHONE_RX, _phone, hits)
    if "@" in text:
        text = _apply(text, _EMAIL_RX, _email, hits)
    if short and not hits:
        if len(KNOWN_CLEAN) >= _KNOWN_CLEAN_MAX_ITEMS:
            KNOWN_CLEAN.clear()
        KNOWN_CLEAN[text] = None
    return text, hits
