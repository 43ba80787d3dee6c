"""The patterns behind :mod:`context_core.gateway.redaction`: which keys are secret, which shapes
match.

Split from the rules engine so each module stays readable: this one holds data (word lists,
compiled patterns, validators), :func:`is_secret_key` and the JSON nesting check the gateway
uses; :mod:`context_core.gateway.rules` pairs each pattern with its pre-check and handler,
and the engine (:mod:`context_core.gateway.redaction`) applies them.

Every pattern runs in linear time on hostile input, because a tool result is attacker-shaped
text (``"eyJ" * 40000`` once took 16 s through a backtracking JWT pattern). The rules that keep
it so, and that any new pattern must follow:

* every run is bounded (``{n,TOKEN_MAX}``) and possessive (``++``/``{n,m}+``): a failed
  attempt never backtracks into the run; no quantified group holds an unbounded or
  ambiguous run (a group repeats one fixed step, like ``(?:[ -]?[0-9]){11,17}``);
* a run whose character class contains its own prefix (``eyJ`` in base64url, ``gl`` in
  ``[0-9A-Za-z_-]``) starts only at a boundary, checked by a lookbehind placed *after* the
  literal, so the engine still uses its fast literal search and never restarts inside a run;
* no pattern starts with a lookbehind or an alternation of non-literals where avoidable: those
  cost one engine entry per character, the literal- or charset-first ones skip ahead in C;
* no recursion over input: nested values are found by bounded patterns, not by re-scanning.

The longest bounded match (a JWT: three 4 KiB segments) is below :data:`SCAN_OVERLAP`, which
is what makes window-wise scanning of long values exact (see ``redaction._matches``).
"""

from __future__ import annotations

import base64
import binascii
import collections
import datetime as dt
import functools
import math
import re
import sys
import unicodedata

__all__ = [
    "REDACTED",
    "SCAN_OVERLAP",
    "SCAN_WINDOW",
    "TOKEN_MAX",
    "EngineSelfTestError",
    "check_engine",
    "fix_surrogates",
    "fold_text",
    "is_secret_key",
    "json_too_deep",
]

REDACTED = "[REDACTED]"
TOKEN_MAX = 4096  # longest credential-shaped run that is matched as one token
SCAN_WINDOW = 64 * 1024  # values longer than this are scanned window by window
SCAN_OVERLAP = 16 * 1024  # >= the longest bounded match (JWT: 3 x TOKEN_MAX + 5)
B64_MIN, B64_MAX = 20, TOKEN_MAX  # base64 tokens (with padding) decoded for wrapped secrets

# --------------------------------------------------------------------------------------------
# Text normalisation
# --------------------------------------------------------------------------------------------

_SURROGATE_RX = re.compile("[\ud800-\udfff]")


def fix_surrogates(text: str) -> str:
    """Replace lone surrogates by U+FFFD: they cannot be encoded as UTF-8 (JSON, Redis)."""
    if text.isascii() or _SURROGATE_RX.search(text) is None:
        return text
    return _SURROGATE_RX.sub("\ufffd", text)


@functools.lru_cache(maxsize=8192)
def _fold_char(ch: str) -> str | None:
    folded = unicodedata.normalize("NFKC", ch)
    return folded if len(folded) == 1 and folded != ch else None


class _FoldTable(dict[int, int]):
    """code point -> code point of its one-character NFKC form (itself if none), filled on
    first sight: ``str.translate`` then never takes its slow missing-key path."""

    def __missing__(self, cp: int) -> int:
        if len(self) > 65536:
            self.clear()
        folded = _fold_char(chr(cp))
        out = ord(folded) if folded is not None else cp
        self[cp] = out
        return out


_FOLD_TABLE = _FoldTable()


def fold_text(text: str) -> str:
    """NFKC per character where that keeps the length (full-width ``１３８``, ``＠``, ``：``).

    Patterns run on the folded copy, so ``ｐａｓｓｗｏｒｄ＝x`` and full-width phone numbers are
    caught; because positions are unchanged, the output keeps the original characters of
    everything that is not replaced (non-PII text stays intact). Already-normalised text
    (ASCII, plain Chinese) is returned as is after a quick check.
    """
    if text.isascii() or unicodedata.is_normalized("NFKC", text):
        return text
    return text.translate(_FOLD_TABLE)


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
# x-api-key, X-Auth-Key, Ocp-Apim-Subscription-Key, Proxy-Authorization, Set-Cookie ...).
_STRONG = _words(
    "password passwd passphrase passcode pincode secret apikey privatekey credential "
    "authorization authkey subscriptionkey cookie accesskey signingkey encryptionkey "
    "masterkey sshkey licensekey accountkey пароль 密码 口令 密钥 令牌 凭证"
)
# Whole words that mean "secret": pwd, pass, pin, jwt, sig (the signature of an Azure SAS
# URL) ... and any word ending in "token"
# (token, access_token, csrftoken, ACCESSTOKEN). "tokens" (plural) is NOT a secret word:
# tokens_used / max_tokens / prompt_tokens are counts in every LLM API response.
_WEAK_WORDS = frozenset({"pwd", "pass", "jwt", "otp", "bearer", "pin", "sig"})
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

    Rule: the NFKC-normalised (``ｐａｓｓｗｏｒｄ`` is ``password``), lower-cased key with
    separators removed contains a strong word (password, passcode, secret, apikey, authkey,
    credential, authorization, cookie, пароль, 密码, ...), or one of its words ends in
    ``token`` or is pwd/pass/pin/jwt/otp/bearer, or its last word is ``auth``. Exception: a key
    whose last word is a metadata word (count, type, length, expires_at, name, ...) describes a
    secret and is kept, so ``tokens_used``, ``token_count`` and ``token_type`` survive while
    ``session_token`` and ``AWS_SECRET_ACCESS_KEY`` do not.
    """
    if not key.isascii():
        key = unicodedata.normalize("NFKC", key)
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
# Whole-credential shapes
# --------------------------------------------------------------------------------------------

_T = TOKEN_MAX
# PEM and PGP private keys. Unbounded on purpose (a key block is kilobytes) yet linear: once
# the header matched, the lazy body always succeeds (at END or at the end of the text).
PEM_RX = re.compile(
    r"-----BEGIN (?P<label>[A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?)-----"
    r"(?s:.*?)(?:-----END (?P=label)-----|\Z)"
)
# user:password@ in URLs. Anchored on "://" (fast literal search); the password may contain
# "/" and ":" (not first, and never "://"), so one run can never swallow the next URL.
URL_CRED_RX = re.compile(
    r"://(?<=[A-Za-z0-9+.\-]://)(?P<user>[^\s:/@?#]{0,256}+):"
    r"(?!/)(?P<pw>(?:(?!://)[^\s@?#]){1,512}+)@"
)
BEARER_RX = re.compile(
    rf"[bB](?<!\w[bB])[eE][aA][rR][eE][rR](?P<sp>\s{{1,16}}+)"
    rf"(?P<tok>[A-Za-z0-9\-._~+/]{{8,{_T}}}+={{0,3}})"
)
BASIC_RX = re.compile(
    rf"Basic(?<!\wBasic)(?P<sp>\s{{1,16}}+)(?P<tok>[A-Za-z0-9+/]{{4,{_T}}}+={{0,2}})"
)
_B64URL = r"[A-Za-z0-9_\-]"
# (rule name, needle every match contains, pattern, validate-as-random) per provider; each
# pattern starts with its literal so the engine's prefix search skips everything else. The
# needle is the rule's pre-check (context_core.gateway.rules), so it must be in every match.
PROVIDER_RULES: tuple[tuple[str, str, re.Pattern[str], bool], ...] = tuple(
    (name, gate, re.compile(rx), random)
    for name, gate, rx, random in (
        (
            "jwt",
            "eyJ",
            rf"eyJ(?<!{_B64URL}eyJ){_B64URL}{{4,{_T}}}+\.{_B64URL}{{4,{_T}}}+\.{_B64URL}{{0,{_T}}}+",
            False,
        ),
        ("stripe_live_key", "k_live_", rf"[sr]k_live_[A-Za-z0-9]{{8,{_T}}}+", False),
        ("stripe_test_key", "k_test_", rf"[sr]k_test_[A-Za-z0-9]{{8,{_T}}}+", False),
        ("aws_access_key_id", "AKIA", rf"AKIA[0-9A-Z]{{16,{_T}}}+", False),
        ("aws_temporary_key_id", "ASIA", rf"ASIA[0-9A-Z]{{16,{_T}}}+", False),
        # the other AWS key-id prefixes (detect-secrets' list): A3T?, ABIA (STS), ACCA
        ("aws_a3t_key_id", "A3T", rf"A3T[A-Z0-9][0-9A-Z]{{16,{_T}}}+", False),
        ("aws_abia_key_id", "ABIA", rf"ABIA[0-9A-Z]{{16,{_T}}}+", False),
        ("aws_acca_key_id", "ACCA", rf"ACCA[0-9A-Z]{{16,{_T}}}+", False),
        ("github_token", "gh", rf"gh[pousr]_[A-Za-z0-9]{{20,{_T}}}+", False),
        ("github_pat", "github_pat_", rf"github_pat_[A-Za-z0-9_]{{20,{_T}}}+", False),
        ("slack_token", "xox", rf"xox[abposre]-[A-Za-z0-9\-]{{10,{_T}}}+", False),
        ("slack_app_token", "xapp-", rf"xapp-[0-9]-[A-Za-z0-9\-]{{10,{_T}}}+", False),
        ("npm_token", "npm_", rf"npm_(?<![A-Za-z0-9_]npm_)[A-Za-z0-9]{{30,{_T}}}+", False),
        (
            "sendgrid_key",
            "SG.",
            rf"SG\.(?<![A-Za-z0-9_.\-]SG\.){_B64URL}{{16,64}}+\.{_B64URL}{{16,{_T}}}+",
            False,
        ),
        ("pypi_token", "pypi-Ag", rf"pypi-(?<!{_B64URL}pypi-)Ag{_B64URL}{{50,{_T}}}+", False),
        (
            "square_token",
            "sq0",
            rf"sq0(?<![A-Za-z0-9]sq0)(?:csp|atp|idp|atb)-[A-Za-z0-9_\\\-]{{20,{_T}}}+",
            False,
        ),
        ("gitlab_runner_token", "GR1348941", rf"GR1348941{_B64URL}{{20,{_T}}}+", False),
        # OpenAI / Anthropic: project, admin, service-account keys, then the legacy shape
        (
            "llm_provider_key",
            "sk-",
            rf"sk-(?<!{_B64URL}sk-)(?:proj|ant|svcacct|admin)-{_B64URL}{{16,{_T}}}+",
            False,
        ),
        (
            "llm_legacy_key",
            "sk-",
            rf"sk-(?<!{_B64URL}sk-)[A-Za-z0-9]{{32,{_T}}}+(?!{_B64URL})",
            True,
        ),
        ("google_api_key", "AIza", rf"AIza(?<!{_B64URL}AIza){_B64URL}{{35}}(?!{_B64URL})", False),
        (
            "gitlab_token",
            "gl",
            rf"gl(?<!{_B64URL}gl)(?:pat|ptt|dt|rt|ft|cbt|soat|oas|imt|agent)-{_B64URL}{{20,{_T}}}+",
            False,
        ),
        ("huggingface_token", "hf_", rf"hf_(?<![A-Za-z0-9_]hf_)[A-Za-z0-9]{{30,{_T}}}+", False),
        ("ctx_api_key", "ctxk_", rf"ctxk_(?<!{_B64URL}ctxk_){_B64URL}{{16,{_T}}}+", False),
    )
)
# Provider shapes whose distinctive literal is not at the start (the match is anchored on it,
# for the engine's fast literal search; the handler in redaction_rules extends the span back
# over the rest of the token and checks its shape).
# OpenAI keys embed base64("OpenAI"): sk-...T3BlbkFJ...
OPENAI_MARK_RX = re.compile(rf"T3BlbkFJ(?<=[A-Za-z0-9]{{8}}T3BlbkFJ)[A-Za-z0-9]{{16,{_T}}}+")
# Mailchimp: 32 [0-9a-z] then -us<datacenter>
MAILCHIMP_RX = re.compile(r"-us(?<=[0-9a-z]{32}-us)[0-9]{1,2}(?![0-9A-Za-z])")
# Telegram bot tokens: <8-10 digit bot id>:<35 base64url>
TELEGRAM_RX = re.compile(rf":(?<=[0-9]{{8}}:){_B64URL}{{35}}(?!{_B64URL})")
# Discord bot tokens: <23-25 base64url, first M/N/O>.<6>.<27+>; anchored on the first dot
DISCORD_RX = re.compile(
    rf"\.(?<={_B64URL}{{23}}\.){_B64URL}{{6}}\.{_B64URL}{{25,45}}+(?![A-Za-z0-9_.\-])"
)
# Twilio account SID / API key SID: AC / SK + 32 [0-9a-z]
TWILIO_RXS = (
    ("twilio_account_sid", "AC", re.compile(r"AC(?<![A-Za-z0-9]AC)[0-9a-z]{32}(?![A-Za-z0-9])")),
    ("twilio_api_key", "SK", re.compile(r"SK(?<![A-Za-z0-9]SK)[0-9a-z]{32}(?![A-Za-z0-9])")),
)
# Artifactory API keys (AKC...) and reference tokens / encrypted passwords (AP<hex>...)
ARTIFACTORY_RXS = (
    (
        "artifactory_api_key",
        "AKC",
        re.compile(rf"AKC(?<![A-Za-z0-9]AKC)[A-Za-z0-9]{{10,{_T}}}+(?![A-Za-z0-9])"),
    ),
    (
        "artifactory_password",
        "AP",
        re.compile(rf"AP(?<![A-Za-z0-9]AP)[0-9A-F][A-Za-z0-9]{{8,{_T}}}+(?![A-Za-z0-9])"),
    ),
)
# SoftLayer API URLs carry the 64-character key in the path
SOFTLAYER_URL_RX = re.compile(
    r"softlayer\.com/soap/v3(?:\.1)?/(?P<secret>[A-Za-z0-9]{64})(?![A-Za-z0-9])"
)
# PuTTY private key files: from the header to the Private-MAC line (linear like PEM_RX)
PUTTY_RX = re.compile(
    r"PuTTY-User-Key-File-[0-9]{1,2}:(?s:.*?)(?:Private-MAC:[ \t]{0,8}+[0-9A-Fa-f]{0,128}+|\Z)"
)

# Slack incoming-webhook URLs: the path after /services/ is the secret.
SLACK_HOOK_RX = re.compile(
    r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9_/\-]{8,1024}+)"
)

# --------------------------------------------------------------------------------------------
# key=value assignments in free text
# --------------------------------------------------------------------------------------------


def _ci(word: str) -> str:
    """Case-insensitive literal as character classes: unlike re.IGNORECASE, the engine keeps
    its fast first-character skip, and case-sensitive lookarounds stay possible around it."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def _whole(word: str) -> str:
    """After a weak word: it is a word of its own, not glued to lower-case letters (byPass yes,
    bypass and passed no), mirroring the camelCase split of :func:`is_secret_key`."""
    return rf"(?<![a-z]{word[0]}{_ci(word[1:])})(?![a-z])"


def _alt(*parts: str) -> str:
    return "(?:" + "|".join(parts) + ")"


_KEY = r"[\-_.]{0,3}" + _ci("key")  # api_key, API-KEY, apikey
# One anchor per first letter, factored by hand so that a candidate letter costs one engine
# entry and a few character tests: the pattern starts with a character class (the engine
# skips to candidate letters in C). Each anchor is a prefilter, is_secret_key decides; it may
# say yes too often, never too rarely, except for freak casings ("tokenS") no API uses.
_GROUPS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("token",), _ci("token") + r"(?![a-z])"),  # access_token, tokenValue; not tokens/tokenizer
    (
        ("pass", "pin", "pwd", "private"),
        "[pP]"
        + _alt(
            _ci("ass") + _alt(*map(_ci, _words("word wd phrase code")), _whole("pass")),
            _ci("in") + _alt(_ci("code"), _whole("pin")),
            _ci("wd") + _whole("pwd"),
            _ci("rivate") + _KEY,
        ),
    ),
    (
        ("secret", "signing", "ssh", "subscription"),
        "[sS]"
        + _alt(_ci("ecret"), _ci("igning") + _KEY, _ci("sh") + _KEY, _ci("ubscription") + _KEY),
    ),
    (
        ("auth", "api", "access"),
        "[aA]"
        + _alt(
            _ci("uth") + _alt(_ci("orization"), _KEY, r"[._\-]{0,8}+(?![\w.\-])"),
            _ci("pi") + _KEY,
            _ci("ccess") + _KEY,
        ),
    ),
    (("credential", "cookie"), "[cC]" + _alt(_ci("redential"), _ci("ookie"))),
    (("jwt",), _ci("jwt") + _whole("jwt")),
    (("otp",), _ci("otp") + _whole("otp")),
    (("bearer",), _ci("bearer") + _whole("bearer")),
    (("sig",), _ci("sig") + _whole("sig")),  # Azure SAS: ...&sig=<signature>
    *(((w,), _ci(w) + _KEY) for w in _words("encryption master license account")),
    ((_NON_ASCII := _words("пароль 密码 口令 密钥 令牌 凭证")), _alt(*map(_ci, _NON_ASCII))),
)
_by_len: dict[int, list[str]] = {}
for _w in sorted(_HARMLESS_LAST):
    _by_len.setdefault(len(_w), []).append(_w)
# Lookbehinds at the end of the key: "<word>_count", "<word>.type" are metadata keys
# (fixed-width lookbehinds, grouped by length; O(1) each, no scan).
# stems whose anchors all end in "key" (api_key, privateKey, ...): not looked for without "key"
KEYED_STEMS = frozenset(
    _words("private signing ssh subscription api access encryption master license account")
)
_NOT_HARMLESS_LAST = "".join(
    rf"(?<![._\-](?:{'|'.join(_ci(w) for w in ws)}))" for ws in _by_len.values()
)
_KEY_REST = (
    r"[\w.\-]{0,120}+" + _NOT_HARMLESS_LAST + r"(?P<kq>\\{0,8}+[\"']?)"
    r"(?P<sep>\s{0,16}+(?::=|=>|[:=：])\s{0,16}+)"
)
# (stems that gate it, pattern) per group of key words; the stems are tested on lower case
ASSIGN_RXS: tuple[tuple[tuple[str, ...], re.Pattern[str]], ...] = tuple(
    (stems, re.compile(anchor + _KEY_REST)) for stems, anchor in _GROUPS
)
_Q = rf"(?:[^\"\\\n]|\\.){{0,{_T}}}+"
_SQ = rf"(?:[^'\\\n]|\\.){{0,{_T}}}+"
# The value after a secret key, anchored at the separator's end (bounded, no nesting).
VALUE_RX = re.compile(
    # a quoted value, also when escaped once or more (JSON inside JSON inside a log line)
    # (an atomic group, not a possessive repeat: CPython before 3.11.5 loses the group's
    # backreference state under a possessive repeat, see _ENGINE_PROBES)
    rf"(?P<eq>\\{{1,8}}+[\"'])(?>(?:(?!(?P=eq))[^\n]){{0,{_T}}})(?P=eq)"
    rf"|\"{_Q}\"|'{_SQ}'"
    rf"|\{{[^{{}}]{{0,{_T}}}+\}}|\[[^\[\]]{{0,{_T}}}+\]"  # one level of {...}/[...] (reprs)
    rf"|(?P<open>[\"'])(?:[^\"'\\\n]|\\.){{1,{_T}}}+"  # an unterminated quote: up to line end
    # a bare run, after an auth scheme on the same line ("Authorization: Bearer x")
    rf"|(?:(?:{_ci('bearer')}|{_ci('basic')}|{_ci('token')}|{_ci('digest')})[ \t]{{1,16}}+)?"
    # ... up to whitespace, a quote, "<>" or an escape sequence: "&", ";", "#", "%", "," and
    # brackets may be part of a password; the engine trims the run afterwards (BARE_CUT_RX)
    # (an atomic group: a lookahead inside a possessive repeat is lost on CPython < 3.11.5)
    rf"(?>(?:[^\s\"'`<>\\]|\\(?![\"'nrt\\])){{1,{_T}}})"
)
#: Where a bare value really ends inside its run: the next assignment of the surrounding
#: syntax (``&user=`` in a query string, ``;Server=`` in a connection string, ``,user:``).
BARE_CUT_RX = re.compile(r"[;&,]\s{0,4}+[A-Za-z_][\w.\-]{0,64}+\s{0,4}+[=:]")
# ("password", "v") / ["token", "v"] pairs in reprs and JSON-ish text
PAIR_RX = re.compile(
    r"[\[(]\s{0,8}+(?P<q>[\"'])(?P<k>[\w.\-]{1,64}+)(?P=q)\s{0,8}+,\s{0,8}+"
    rf"(?P<v>\"{_Q}\"|'{_SQ}')"
)

# --------------------------------------------------------------------------------------------
# PII
# --------------------------------------------------------------------------------------------

# Numbers are anchored on their first character (the engine skips non-candidates in C) with
# the "not glued to a letter or digit" test as a lookbehind *after* it; digits glued to
# letters are parts of hashes and ids (content_hash), not PII. Inside a long digit run the
# "skip" branch consumes the rest of the run in one step, so a 256 KB digit string costs a
# handful of engine entries instead of one per digit (no number can start inside a run).


def _skip(first: str) -> str:
    return rf"(?<=[0-9]{first})[0-9]{{16,{_T}}}+"


def _left(first: str, tel: bool = False) -> str:
    """Not glued on the left of the character just consumed (or, for phones, after "tel")."""
    tests = [rf"(?<![0-9A-Za-z]{first})"]
    if tel:
        tests += [rf"(?<={t}{first})" for t in ("tel", "TEL", "Tel")]
    return "(?:" + "|".join(tests) + ")"


ID_RX = re.compile(
    r"[1-9](?:" + _skip("[1-9]") + "|" + _left("[1-9]") + r"[0-9]{5}(?P<s1>[ \-]?)"
    r"(?P<b>[0-9]{8})(?P<s2>[ \-]?)(?P<c>[0-9]{3}[0-9Xx])(?![0-9A-Za-z]))"
)
CARD_RX = re.compile(
    r"[2-69](?:" + _skip("[2-69]") + "|" + _left("[2-69]") + r"[0-9](?:[ \-]?[0-9]){11,17}"
    r"(?![0-9A-Za-z]))"
)
# Mobile numbers: optional +86/0086/86, groups 3-4-4 with one space/dash each or dots on both
# sides; "tel13912341234" counts although glued to letters. Every branch starts with a
# literal, so the engine still skips to a digit or "+" in C; after a skip branch (17+ digits
# just consumed) the tail is not required, and its groups stay empty.
_PHONE_TAIL = (
    r"(?P<a>[3-9][0-9])(?P<mid>[ \-]?[0-9]{4}[ \-]?|\.[0-9]{4}\.)(?P<c>[0-9]{4})(?![0-9A-Za-z])"
)
PHONE_RX = re.compile(
    "(?:"
    + "|".join(
        [
            r"\+" + _left(r"\+", tel=True) + r"86[ \-]?1",
            "0(?:" + _left("0", tel=True) + r"086[ \-]?1|" + _skip("0") + ")",
            "8(?:" + _left("8", tel=True) + r"6[ \-]?1|" + _skip("8") + ")",
            "1(?:(?=[3-9][0-9])" + _left("1", tel=True) + "|" + _skip("1") + ")",
        ]
    )
    + ")"
    + f"(?:(?<=[0-9]{{17}})|{_PHONE_TAIL})"
)
# bytes.translate table: digits -> "d", everything else -> " " (cheap gates for the above)
DIGIT_CLASS = bytes(ord("d") if 48 <= i <= 57 else ord(" ") for i in range(256))
LONG_DIGITS_RX = re.compile(r"[0-9](?:[ \-.]?[0-9]){10}")  # 11+ digits: phone, card, ID
# Anchored on "@" (literal: the engine jumps from one "@" to the next in C) with the local
# character before it checked by a lookbehind; the local part is then read backwards (<= 64).
# Text that is mostly "@" uses the charset-first twin, which skips runs of "@" in C instead.
# The domain is one flat run (a label, a dot, then labels and dots): no nested quantifier.
_DOMAIN = r"(?P<d>[A-Za-z0-9\-]{1,63}+\.[A-Za-z0-9\-][A-Za-z0-9.\-]{0,252}+)(?!@)"
EMAIL_RX = re.compile(r"(?P<at>@)(?<=[A-Za-z0-9._%+\-]@)" + _DOMAIN)
EMAIL_DENSE_RX = re.compile(r"[A-Za-z0-9._%+\-](?P<at>@)" + _DOMAIN)
EMAIL_LOCAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")
# bytes.translate table for the base64 run finder: alphabet -> "a", everything else -> " "
B64_CLASS = bytes(
    ord("a") if chr(i).isascii() and (chr(i).isalnum() or chr(i) in "+/_-") else ord(" ")
    for i in range(256)
)

# --------------------------------------------------------------------------------------------
# Validators
# --------------------------------------------------------------------------------------------

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"


def id_checksum_ok(id17: str, check: str) -> bool:
    total = sum(int(c) * w for c, w in zip(id17, _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == check.upper()


def birth_date_ok(yyyymmdd: str) -> bool:
    """A grouped 6-8-4 number is an ID when its middle group is a real birth date."""
    if yyyymmdd[:2] not in ("19", "20"):
        return False
    try:
        dt.date(int(yyyymmdd[:4]), int(yyyymmdd[4:6]), int(yyyymmdd[6:]))
    except ValueError:
        return False
    return True


_LUHN_DOUBLE = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)


def luhn_ok(digits: str) -> bool:
    odd = sum(map(int, digits[-1::-2]))
    even = sum(_LUHN_DOUBLE[int(c)] for c in digits[-2::-2])
    return (odd + even) % 10 == 0


def looks_random(tok: str) -> bool:
    """A credential rather than an English word: long enough and not plain lowercase prose."""
    if len(tok) < 8:
        return False
    has_digit = any(c.isdigit() for c in tok)
    return has_digit or (any(c.isupper() for c in tok) and any(c.islower() for c in tok))


# --------------------------------------------------------------------------------------------
# Values after a cue word ("the secret key is ...", "token: ...", "password was ...")
# --------------------------------------------------------------------------------------------

#: Characters of a high-entropy token: base64, base64url, hex, plus "." "~" and "%" (URL-encoded
#: base64, Azure client secrets).
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-.~%")
_HEX_CHARS = frozenset("0123456789abcdefABCDEF")
_VOWELS = frozenset("aeiouyAEIOUY")
ENTROPY_MIN_LEN = 16
_PIECE_RX = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_SEGMENT_RX = re.compile(r"[-_./~]")


def shannon_entropy(text: str) -> float:
    """Shannon entropy of ``text`` in bits per character (over its character frequencies)."""
    n = len(text)
    if not n:
        return 0.0
    return -sum(c / n * math.log2(c / n) for c in collections.Counter(text).values())


def _word_like(tok: str) -> bool:
    """An identifier made of words (maxTokensPerRequest, max_tokens_per_request, v2_config):
    its letter pieces average 4+ letters, 30 %+ of the letters are vowels (random letters:
    ~23 %, y counted) and every piece of 3+ letters has one. A random
    token's camelCase pieces are short ("wJalr XUtn FEMI K7 ...") or vowel-less. Upper case
    only is never word-like here (base32 secrets)."""
    if not any(c.islower() for c in tok):
        return False  # CONSTANT_CASE with digits: base32 secrets look like that
    alpha = [p for p in _PIECE_RX.findall(tok) if p.isalpha()]
    letters = sum(map(len, alpha))
    if not alpha or letters < 4 * len(alpha):
        return False
    vowels = sum(c in _VOWELS for p in alpha for c in p)
    if vowels * 10 < 3 * letters:
        return False
    return all(len(p) < 3 or not _VOWELS.isdisjoint(p) for p in alpha)


def high_entropy(tok: str) -> bool:
    """A random-looking token (a key, a secret, a token) rather than a word or an identifier.

    The rule (``H`` is :func:`shannon_entropy` in bits per character, ``n`` the length):

    * 16..4096 characters of :data:`TOKEN_CHARS` (base64/base64url/hex, ``.~%``), not all
      digits, trailing ``=`` padding included; a UUID counts as its 32 hex digits; 3+
      segments between ``-_./~`` of at most 8 characters each are a structured name
      (``gpt-4o-mini-2024-07-18``, a version, a date), not a secret;
    * hex (``[0-9a-f]`` or ``[0-9A-F]``, with a digit and a letter): ``H >= 2.75 + 0.03 (n -
      16)``, capped at 3.3;
    * letters of one case only: ``n >= 20``, ``H >= 3.3`` and at most 30 % vowels (random
      lower case has ~19 %, English words ~40 %);
    * otherwise at least two of lower case / upper case / digits, ``H >= 3.3 + 0.04 (n -
      16)`` capped at 4.2, and not word-like (``maxTokensPerRequest``: see ``_word_like``).

    The thresholds sit under the 1st percentile of uniformly random tokens of each alphabet
    and length (16 base62 characters: 3.38 bits; 40: 4.47), above English words and the
    identifiers of code (``max_tokens_per_request``: 3.61 at 22 characters, limit 3.54, and
    word-like anyway).
    """
    n = len(tok)
    if n < ENTROPY_MIN_LEN or n > TOKEN_MAX or not TOKEN_CHARS.issuperset(tok):
        return False
    core = tok.rstrip("=")
    if core.isdigit() or not core:
        return False
    if "-" in core and _HEX_CHARS.issuperset(core.replace("-", "")):
        core = core.replace("-", "")  # a UUID (npm's legacy tokens, Heroku keys): its hex
        n = len(core)
    elif len(parts := _SEGMENT_RX.split(core)) >= 3 and max(map(len, parts)) <= 8:
        return False  # a structured name: gpt-4o-mini-2024-07-18, llama-3.1-70b, 1.2.3-rc.4
    h = shannon_entropy(core)
    lower = any(c.islower() for c in core)
    upper = any(c.isupper() for c in core)
    digit = any(c.isdigit() for c in core)
    if _HEX_CHARS.issuperset(core) and digit and not (lower and upper):
        return h >= min(2.75 + 0.03 * (n - 16), 3.3)
    if not digit and (lower != upper) and core.isalpha():
        vowels = sum(c in _VOWELS for c in core)
        return n >= 20 and h >= 3.3 and vowels * 10 <= 3 * n
    if lower + upper + digit < 2:
        return False
    return h >= min(3.3 + 0.04 * (n - 16), 4.2) and not _word_like(core)


def password_like(tok: str) -> bool:
    """A value right after "password is" / "password:" that is a password, not prose: 6+
    characters with a digit, a symbol (not a hyphen or apostrophe) or a capital after the first
    letter ("hunter22", "P@ss&w0rd", "correctHorse"; not "required", "e-mail", "Changed")."""
    core = tok.rstrip("!?.,;:")  # "required!" ends a sentence; "Summer2024!" keeps its "!"
    if len(core) < 6 or len(tok) > TOKEN_MAX:
        return False
    return any(c.isdigit() or (not c.isalnum() and c not in "-'") for c in core) or any(
        c.isupper() for c in core[1:]
    )


def basic_ok(tok: str) -> bool:
    """HTTP Basic credentials are base64 of ``user:password``; anything else is prose."""
    if len(tok) % 4:
        return False
    try:
        raw = base64.b64decode(tok, validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in raw


def b64_text(token: str) -> str | None:
    """The printable text a base64 (or base64url) token decodes to, else None."""
    core = token.rstrip("=")
    if len(core) % 4 == 1 or (("-" in core or "_" in core) and ("+" in core or "/" in core)):
        return None
    core = core.replace("-", "+").replace("_", "/")
    try:
        text = base64.b64decode(core + "=" * (-len(core) % 4), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    if not text.replace("\n", " ").replace("\t", " ").replace("\r", " ").isprintable():
        return None
    return text


# --------------------------------------------------------------------------------------------
# JSON nesting
# --------------------------------------------------------------------------------------------

_JSON_STRING_RX = re.compile(r'"(?:[^"\\]|\\.)*+"')  # disjoint branches, possessive: linear
_NOT_BRACKET_RX = re.compile(r"[^\[\]{}]++")


def json_too_deep(text: str, limit: int) -> bool | None:
    """Whether JSON-looking ``text`` nests brackets deeper than ``limit`` (strings ignored).

    For text that ``json.loads`` could not decode within the interpreter's recursion limit:
    True means deep JSON (refuse it), False means shallow enough (the caller's own stack was
    the problem), None means its brackets do not even balance, so it is text, not JSON (scan
    it as text). Linear, iterative, and free when there are fewer brackets than the limit.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    bare = _JSON_STRING_RX.sub("", text) if '"' in text else text
    if bare.count("[") != bare.count("]") or bare.count("{") != bare.count("}"):
        return None
    depth = 0
    for ch in _NOT_BRACKET_RX.sub("", bare):
        if ch in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


# --------------------------------------------------------------------------------------------
# The engine's own answers, checked at import
# --------------------------------------------------------------------------------------------


class EngineSelfTestError(RuntimeError):
    """This interpreter's ``re`` gives a wrong answer for a construct the patterns rely on."""


#: (what, pattern, text, the whole match ``search`` must find, or None for no match): one per
#: kind of construct the patterns above use, on an input where a wrong engine shows. Checked
#: against the real engine at import rather than a version number. CPython 3.11.0-3.11.4 lose a
#: group's backreference state under a *possessive repeat* (on Debian's 3.11.2 the escaped value
#: of ``esc {\\"password\\": \\"s3cr3t\\"}`` kept its secret), so the patterns use an atomic
#: group there instead, which those releases get right: the first probe.
_ENGINE_PROBES: tuple[tuple[str, str, str, str | None], ...] = (
    (
        "atomic group with a backreference lookahead",
        r"(?P<q>\\{1,8}+[\"'])(?>(?:(?!(?P=q))[^\n]){0,64})(?P=q)",
        '\\"s3cr3t\\"}',
        '\\"s3cr3t\\"',
    ),
    ("possessive run never gives back", r"[a-z]{1,8}+z", "abcz", None),
    (
        "atomic group over a lookahead alternation",
        r"(?>(?:[^\s\\]|\\(?![nrt])){1,64})",
        "abc\\ndef",
        "abc",
    ),
    ("possessive alternation group", r'"(?:[^"\\]|\\.)*+"', 'x "a\\"b" y', '"a\\"b"'),
    ("lookbehind after a literal", r"eyJ(?<![A-Za-z]eyJ)[A-Za-z]{2,8}+", "xeyJab eyJcd", "eyJcd"),
)


def check_engine() -> None:
    """Raise :class:`EngineSelfTestError` naming the first probe this interpreter's ``re``
    answers wrongly (see :data:`_ENGINE_PROBES`)."""
    for what, pattern, text, expected in _ENGINE_PROBES:
        m = re.search(pattern, text)
        got = m.group(0) if m else None
        if got != expected:
            raise EngineSelfTestError(
                f"the re module of this Python ({sys.version.split()[0]}) gets the redaction "
                f"patterns wrong ({what}: {pattern!r} on {text!r} gave {got!r}, expected "
                f"{expected!r}), so secrets could pass the gateway; run the platform on "
                "another CPython build"
            )


check_engine()
