"""The redaction rules, declared once: one :class:`Rule` per shape, in :data:`RULES`.

A rule is a pattern (from :mod:`context_core.gateway.patterns`), the cheap pre-check that
decides whether the pattern runs on a text at all, the handler that turns a match into a
replacement (or leaves a lookalike alone), the finding kind it reports, and how far a match
can reach (the window overlap). :mod:`context_core.gateway.redaction` builds its pipeline from this
table, so a rule cannot exist without its pre-check, and the pre-check the engine applies is
the one written here. ``tests/test_redaction_rules.py`` checks every rule against text its
pattern matches: the pre-check must accept it (a pre-check that rejects its own matches would
silently switch the rule off) and the gateway must redact it.

Pre-checks (all tested on the length-preserving fold the patterns see):

* ``needle``: a substring every match contains (looked for in the lower-cased text when
  ``ignore_case``), tested after ``quick``, one character of it (memchr speed);
* ``digits``: a run of that many ASCII digits (the number rules).

The key=value families (``ASSIGN_RXS``: key-word stems with their anchor pattern) and the
base64 decoder are procedures rather than single patterns; they live in the engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from context_core.gateway.patterns import (
    ARTIFACTORY_RXS,
    BASIC_RX,
    BEARER_RX,
    CARD_RX,
    DIGIT_CLASS,
    DISCORD_RX,
    EMAIL_DENSE_RX,
    EMAIL_LOCAL,
    EMAIL_RX,
    ID_RX,
    MAILCHIMP_RX,
    OPENAI_MARK_RX,
    PEM_RX,
    PHONE_RX,
    PROVIDER_RULES,
    PUTTY_RX,
    REDACTED,
    SCAN_OVERLAP,
    SLACK_HOOK_RX,
    SOFTLAYER_URL_RX,
    TELEGRAM_RX,
    TOKEN_MAX,
    TWILIO_RXS,
    URL_CRED_RX,
    basic_ok,
    birth_date_ok,
    id_checksum_ok,
    looks_random,
    luhn_ok,
)

__all__ = ["RULES", "UNBOUNDED", "Edit", "Handler", "Rule", "RuleTableError", "build_rules"]

# A replacement is a sequence of literal strings and (start, end) spans of the scanned text;
# spans are rendered from the original characters, literals are what replaces the secret.
Piece = str | tuple[int, int]
Edit = tuple[int, int, tuple[Piece, ...], str, str]  # start, end, pieces, kind, raw
#: match, the scanned (folded) text, the rule's finding kind -> an edit, or None (lookalike)
Handler = Callable[[re.Match[str], str, str], "Edit | None"]
#: overlap of a pattern that scans the whole text, never a window (a PEM block)
UNBOUNDED = -1
_QUICK_PREFERENCE = "_-:/@."


class RuleTableError(ValueError):
    """A rule that could never run (no pre-check) or a table that contradicts itself."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One redaction rule: pattern, pre-check, handler and finding kind, declared together."""

    name: str
    rx: re.Pattern[str]
    handle: Handler
    kind: str  # the finding kind audited for each removal ("secret_value", "pii_card", ...)
    stage: Literal["credential", "pii"]  # credentials run before key=value, PII after base64
    needle: str = ""
    quick: str = ""  # derived from ``needle`` when empty
    ignore_case: bool = False
    digits: int = 0
    overlap: int = SCAN_OVERLAP  # >= longest match plus lookahead (window-wise scanning)
    dense_rx: re.Pattern[str] | None = None  # charset-first twin for text dense in ``needle``

    def __post_init__(self) -> None:
        if bool(self.needle) == bool(self.digits > 0):
            raise RuleTableError(
                f"redaction rule {self.name!r}: give exactly one pre-check, a needle or a "
                "digit-run length; a rule without one would never run (or always)"
            )
        if self.needle:
            needle = self.needle.lower() if self.ignore_case else self.needle
            quick = self.quick or _quick_char(needle)
            if len(quick) != 1:
                raise RuleTableError(f"redaction rule {self.name!r}: quick must be one character")
            object.__setattr__(self, "needle", needle)
            object.__setattr__(self, "quick", quick.lower() if self.ignore_case else quick)
        if self.overlap != UNBOUNDED and self.overlap <= 0:
            raise RuleTableError(f"redaction rule {self.name!r}: overlap must be > 0")

    def precheck(self, fold: str) -> bool:
        """Whether the engine runs this rule's pattern on ``fold`` (the folded text).

        The engine inlines these tests (see ``redaction._pipeline``); this method is their
        reference statement, which the property tests hold every pattern match to.
        """
        if self.digits:
            return b"d" * self.digits in digit_class(fold)
        if self.ignore_case:
            return (self.quick in fold or self.quick.upper() in fold) and self.needle in (
                fold.lower()
            )
        return self.quick in fold and self.needle in fold


def _quick_char(needle: str) -> str:
    """The needle's rarest-looking character: punctuation, then capitals, digits, the last."""
    for group in (_QUICK_PREFERENCE, str.isupper, str.isdigit):
        for ch in needle:
            if (ch in group) if isinstance(group, str) else group(ch):
                return ch
    return needle[-1]


def digit_class(text: str) -> bytes:
    """``text`` as bytes with every ASCII digit as ``d`` and anything else as a space."""
    raw = text.encode("ascii", "replace") if not text.isascii() else text.encode("ascii")
    return raw.translate(DIGIT_CLASS)


def build_rules(rules: Sequence[Rule]) -> tuple[Rule, ...]:
    """The table, checked: names are unique and each pattern belongs to one rule."""
    names = [r.name for r in rules]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuleTableError(f"redaction rules named twice: {dup}")
    patterns = [id(r.rx) for r in rules]
    if len(set(patterns)) != len(patterns):
        raise RuleTableError("a redaction pattern is used by two rules: give each its own")
    return tuple(rules)


# --------------------------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------------------------


def _whole(m: re.Match[str], _f: str, kind: str) -> Edit:
    return m.start(), m.end(), (REDACTED,), kind, m.group(0)


def _group(name: str, check: Callable[[str], bool] | None = None) -> Handler:
    """Redact one named group (keeping what surrounds it), if ``check`` accepts it."""

    def handle(m: re.Match[str], _f: str, kind: str) -> Edit | None:
        value = m.group(name)
        if value.startswith(REDACTED) or (check is not None and not check(value)):
            return None
        return m.start(name), m.end(name), (REDACTED,), kind, value

    return handle


_PORT_PATH_RX = re.compile(r"[0-9]{1,5}/")


def _random_token(m: re.Match[str], f: str, kind: str) -> Edit | None:
    return _whole(m, f, kind) if looks_random(m.group(0)[3:]) else None


_B64URL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_LOWER_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def _back(f: str, i: int, chars: frozenset[str], limit: int) -> int:
    """Start of the run of ``chars`` that ends at ``i`` (at most ``limit`` characters)."""
    lo = max(0, i - limit)
    j = i
    while j > lo and f[j - 1] in chars:
        j -= 1
    return j


def _mixed(tok: str) -> bool:
    return any(c.isdigit() for c in tok) and any(c.isalpha() for c in tok)


def _openai(m: re.Match[str], f: str, kind: str) -> Edit | None:
    """``sk-...T3BlbkFJ...``: the whole token around the marker (base64 of "OpenAI")."""
    start = _back(f, m.start(), _B64URL_CHARS, 512)
    return start, m.end(), (REDACTED,), kind, f[start : m.end()]


def _mailchimp(m: re.Match[str], f: str, kind: str) -> Edit | None:
    start = m.start() - 32
    if (start > 0 and f[start - 1].isalnum()) or not _mixed(f[start : m.start()]):
        return None
    return start, m.end(), (REDACTED,), kind, f[start : m.end()]


def _telegram(m: re.Match[str], f: str, kind: str) -> Edit | None:
    start = _back(f, m.start(), frozenset("0123456789"), 11)
    n = m.start() - start
    if not 8 <= n <= 10 or (start > 0 and f[start - 1].isalnum()):
        return None
    if not looks_random(m.group(0)[1:]):
        return None
    return start, m.end(), (REDACTED,), kind, f[start : m.end()]


def _discord(m: re.Match[str], f: str, kind: str) -> Edit | None:
    start = _back(f, m.start(), _B64URL_CHARS, 26)
    if not 23 <= m.start() - start <= 25 or f[start] not in "MNO":
        return None
    if start > 0 and (f[start - 1] in _B64URL_CHARS or f[start - 1] == "."):
        return None
    tok = f[start : m.end()]
    return (start, m.end(), (REDACTED,), kind, tok) if looks_random(tok) else None


def _twilio(m: re.Match[str], f: str, kind: str) -> Edit | None:
    return _whole(m, f, kind) if _mixed(m.group(0)[2:]) else None


def _artifactory(m: re.Match[str], f: str, kind: str) -> Edit | None:
    tok = m.group(0)
    if tok.startswith("AKC"):
        ok = looks_random(tok[3:])
    else:  # "AP" + hex digit + ...: all three character classes, 12+ characters
        ok = (
            len(tok) >= 12
            and any(c.isdigit() for c in tok[2:])
            and any(c.islower() for c in tok)
            and any(c.isupper() for c in tok[2:])
        )
    return _whole(m, f, kind) if ok else None


def _in_run(m: re.Match[str], f: str) -> bool:
    """The "skip" branch of a number pattern matched: the rest of a long digit run."""
    return m.start() > 0 and f[m.start() - 1].isdigit()


def _prc_id(m: re.Match[str], f: str, kind: str) -> Edit | None:
    if _in_run(m, f):
        return None
    s1, b, s2, c = m.group("s1", "b", "s2", "c")
    start = m.start()
    a = f[start : start + 6]
    ok = id_checksum_ok(a + b + c[:3], c[3])
    if not ok and (s1 or s2):
        ok = birth_date_ok(b)
    if not ok:
        return None
    pieces = ((start, start + 6), m.span("s1"), "********", m.span("s2"), m.span("c"))
    return start, m.end("c"), pieces, kind, a + b + c


def _card(m: re.Match[str], f: str, kind: str) -> Edit | None:
    if _in_run(m, f):
        return None
    s = m.group(0)
    digits = s.replace(" ", "").replace("-", "")
    if not 13 <= len(digits) <= 19 or not luhn_ok(digits):
        return None
    keep_from, seen = len(s), 0
    while seen < 4:
        keep_from -= 1
        seen += s[keep_from].isdigit()
    masked = "".join("*" if c.isdigit() else c for c in s[:keep_from])
    start, end = m.span()
    return start, end, (masked, (start + keep_from, end)), kind, digits


def _phone(m: re.Match[str], _f: str, kind: str) -> Edit | None:
    if m.group("a") is None:  # the rest of a long digit run
        return None
    start, a_start = m.start(), m.start("a") - 1  # "a" is the 2 digits after the leading 1
    raw = "1" + m.group("a") + m.group("mid").strip(" -.") + m.group("c")
    pieces = ((start, a_start), (a_start, m.end("a")), "****", m.span("c"))
    return start, m.end("c"), pieces, kind, raw


def _email(m: re.Match[str], f: str, kind: str) -> Edit | None:
    at = m.start("at")
    lo = max(0, at - 64)
    j = at
    while j > lo and f[j - 1] in EMAIL_LOCAL:
        j -= 1
    while j < at and not f[j].isalnum():  # a local part starts with a letter or digit
        j += 1
    if j == at:
        return None
    pieces = ((j, j + 1), "***@", m.span("d"))  # a trailing "." stays, as written
    return j, m.end(), pieces, kind, f[j : m.end()].rstrip(".")


# --------------------------------------------------------------------------------------------
# The table, in pipeline order within each stage
# --------------------------------------------------------------------------------------------

_TOKEN = TOKEN_MAX + 64
_SECRET = "secret_value"

RULES: tuple[Rule, ...] = build_rules(
    [
        # whole private-key blocks first: a PEM body may hold key=value text
        Rule(
            "pem_private_key",
            PEM_RX,
            _whole,
            _SECRET,
            "credential",
            needle="-----BEGIN",
            overlap=UNBOUNDED,
        ),
        # "http://host:8080/a@b": that "password" is a port and a path, not a credential
        Rule(
            "url_credentials",
            URL_CRED_RX,
            _group("pw", lambda pw: _PORT_PATH_RX.match(pw) is None),
            _SECRET,
            "credential",
            needle="://",
            overlap=1024,
        ),
        Rule(
            "slack_webhook",
            SLACK_HOOK_RX,
            _group("secret"),
            _SECRET,
            "credential",
            needle="hooks.slack.com",
            quick="/",
            overlap=2048,
        ),
        # prose ("use a bearer token") survives: the token must look random
        Rule(
            "bearer_token",
            BEARER_RX,
            _group("tok", looks_random),
            _SECRET,
            "credential",
            needle="bearer",
            ignore_case=True,
            overlap=_TOKEN,
        ),
        Rule(
            "basic_auth",
            BASIC_RX,
            _group("tok", basic_ok),
            _SECRET,
            "credential",
            needle="Basic",
            overlap=_TOKEN,
        ),
        *(
            Rule(
                name,
                rx,
                _random_token if random else _whole,
                _SECRET,
                "credential",
                needle=gate,
                overlap=SCAN_OVERLAP if name == "jwt" else _TOKEN,
            )
            for name, gate, rx, random in PROVIDER_RULES
        ),
        # provider shapes anchored on an inner literal (the handler extends the span back)
        Rule(
            "openai_key",
            OPENAI_MARK_RX,
            _openai,
            _SECRET,
            "credential",
            needle="T3BlbkFJ",
            overlap=_TOKEN + 512,
        ),
        Rule(
            "mailchimp_key",
            MAILCHIMP_RX,
            _mailchimp,
            _SECRET,
            "credential",
            needle="-us",
            overlap=64,
        ),
        Rule(
            "telegram_bot_token",
            TELEGRAM_RX,
            _telegram,
            _SECRET,
            "credential",
            needle=":",
            overlap=64,
        ),
        Rule(
            "discord_token",
            DISCORD_RX,
            _discord,
            _SECRET,
            "credential",
            needle=".",
            overlap=128,
        ),
        *(
            Rule(name, rx, _twilio, _SECRET, "credential", needle=gate, overlap=64)
            for name, gate, rx in TWILIO_RXS
        ),
        *(
            Rule(name, rx, _artifactory, _SECRET, "credential", needle=gate, overlap=_TOKEN)
            for name, gate, rx in ARTIFACTORY_RXS
        ),
        Rule(
            "softlayer_api_url",
            SOFTLAYER_URL_RX,
            _group("secret"),
            _SECRET,
            "credential",
            needle="softlayer.com/soap/",
            quick="/",
            overlap=128,
        ),
        Rule(
            "putty_private_key",
            PUTTY_RX,
            _whole,
            _SECRET,
            "credential",
            needle="PuTTY-User-Key-File-",
            overlap=UNBOUNDED,
        ),
        # an ID number is checked before it can look like a card
        Rule("id_number", ID_RX, _prc_id, "pii_id", "pii", digits=6, overlap=128),
        Rule("card_number", CARD_RX, _card, "pii_card", "pii", digits=2, overlap=128),
        Rule("mobile_number", PHONE_RX, _phone, "pii_phone", "pii", digits=3, overlap=128),
        Rule(
            "email",
            EMAIL_RX,
            _email,
            "pii_email",
            "pii",
            needle="@",
            overlap=1024,
            dense_rx=EMAIL_DENSE_RX,
        ),
    ]
)
