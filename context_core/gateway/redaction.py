"""What counts as a secret or as PII, and how it is masked: the rules behind the gateway.

Pure functions and precompiled patterns (in :mod:`context_core.gateway.patterns`), no I/O:
:mod:`context_core.gateway.sanitize` walks the data, audits and caps; this module only decides about
one key or one string. Its pipeline is built from the rule table
(:data:`context_core.gateway.rules.RULES`: pattern, pre-check, handler, finding kind per
rule), plus the key=value and base64 procedures below. The one piece of state is
:data:`KNOWN_CLEAN`, a bounded memo of short strings that had *no* finding (keys, status
words), which lets the walk skip them.

Choices (documented because they trade false positives against false negatives; a leaked
secret costs more than an over-redacted field):

* Keys: see :func:`is_secret_key`. ``tokens``/``tokens_used``/``token_count`` are kept (LLM
  usage counters are everywhere), ``token``/``*_token``/``*Token`` are secrets; key names are
  NFKC-normalised (``ｐａｓｓｗｏｒｄ``), Cyrillic ``пароль`` and Chinese ``密码``/``口令`` count.
* Text is matched on a length-preserving NFKC fold (full-width digits, ``＠``, ``：``), and the
  output keeps the original characters of everything not replaced. Lone surrogates become
  U+FFFD, so a cleaned string always encodes as UTF-8.
* ID numbers (18 digits, last may be X) are masked when the ISO 7064 MOD 11-2 check character
  is right, so random 18-digit numbers (order ids) survive; written in 6-8-4 groups (spaces or
  dashes) a valid birth date in the middle group is enough. The mask keeps the region code
  and the last 4 characters: ``110101********123X``.
* Card numbers (13-19 digits, single spaces/dashes allowed) must pass Luhn and start with 2-6
  or 9 (Visa, Mastercard, Amex, JCB, Discover, UnionPay ranges), so 13-digit epoch-millisecond
  timestamps are left alone. Every digit but the last 4 becomes ``*``; separators are kept.
* Mobile numbers ``1[3-9]`` + 9 digits, optional ``+86``/``0086``/``86``, groups split by
  spaces, dashes or dots, also glued to ``tel``: ``138****1234`` (country prefix kept).
* E-mail: first character of the local part and the domain are kept: ``j***@example.com``.
* ``Bearer x`` needs a token that looks random (8+ chars with a digit or mixed case) so prose
  ("use a bearer token") survives; ``Basic x`` must decode to ``user:password``.
* ``key=value`` / ``key: value`` / ``"key": "value"`` / ``("key", "value")`` in free text:
  redacted when the key passes :func:`is_secret_key`; the value is one quoted string, one
  ``{...}``/``[...]`` level, or one run of non-separator characters (all bounded to 4 KiB).
  A secret containing spaces or commas unquoted in prose is only partly caught: structured
  data is the safe path.
  A bare value runs to whitespace or a quote, so ``&``, ``;``, ``#``, ``%`` inside a password
  are masked with it; it ends before the next assignment of the surrounding syntax
  (``&next=`` in a query, ``;Database=`` in a connection string) and, in multi-line text on a
  line that starts with the key (INI, YAML, .env), at the end of the line.
* Cue words (secret, key, token, credential, password/passwd/passphrase/passcode, pwd, and
  пароль, 密码, 口令, 密钥, 令牌, 凭证, токен, ключ, секрет) followed within six pieces / 96
  characters (``is``, ``was``, ``:``, ``=``, ``->``, quotes, a few words) by a high-entropy
  token redact that token (:func:`context_core.gateway.patterns.high_entropy` states the
  rule); after a password cue and a connector a password-like value (6+ characters with a
  digit, symbol or inner capital) goes too. Prose survives: "the key is to be patient",
  "password reset link sent", "tokens used". Cue words and secret keys written with
  look-alikes (Cyrillic ``а``, zero-width characters, mathematical letters) are found on the
  UTS #39 skeleton (:mod:`context_core.gateway.skeleton`), only for text with characters outside
  ASCII and CJK; the value is judged and replaced in the original text.
* A base64 token (20..4096 chars, padding included) whose decoded text holds a finding is
  redacted whole (``password=...``, a provider key, PII; two levels of wrapping at most).
* Idempotent: a second pass changes nothing (placeholders are never taken for values; the
  pipeline reruns until stable, at most three passes).

Cost: linear in the text, whatever its shape (see the module docstring of the patterns);
strings over :data:`SCAN_WINDOW` are scanned in overlapping windows.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Iterator

from context_core.gateway.patterns import (
    ASSIGN_RXS,
    B64_CLASS,
    B64_MAX,
    B64_MIN,
    BARE_CUT_RX,
    KEYED_STEMS,
    LONG_DIGITS_RX,
    PAIR_RX,
    REDACTED,
    SCAN_OVERLAP,
    SCAN_WINDOW,
    TOKEN_MAX,
    VALUE_RX,
    EngineSelfTestError,
    b64_text,
    fix_surrogates,
    fold_text,
    high_entropy,
    is_secret_key,
    json_too_deep,
    password_like,
)
from context_core.gateway.rules import RULES, UNBOUNDED, Edit, Handler, Rule, digit_class

__all__ = [
    "KNOWN_CLEAN",
    "KNOWN_CLEAN_TEXT_MAX_LEN",
    "REDACTED",
    "Hits",
    "cue_value_secret",
    "fix_surrogates",
    "is_cue_key",
    "is_secret_key",
    "json_too_deep",
    "mask_mobile",
    "redact_text",
    "remember_clean",
]

Hits = list[tuple[str, str]]  # (finding kind, original value) per removal
_SECRET = "secret_value"


def _words_of(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Longest match (with lookahead context) of each windowed pattern: the overlap its windows
# need; a rule declares its own (see redaction_rules), the procedures' patterns are here.
# Quoted values count twice TOKEN_MAX (an escape pair is two characters).
_OVERLAP_BY_PATTERN: dict[re.Pattern[str], int] = {
    **{rx: 256 for _stems, rx in ASSIGN_RXS},  # key and separator; values match on the text
    PAIR_RX: 2 * TOKEN_MAX + 256,
    **{rx: r.overlap for r in RULES for rx in (r.rx, r.dense_rx) if rx is not None},
}
# keyed by id(): hashing a compiled pattern hashes its whole program, on every lookup
_OVERLAPS = {id(rx): n for rx, n in _OVERLAP_BY_PATTERN.items()}


class _Text:
    """The text being cleaned: ``fold`` is what patterns see, ``src`` what is kept.

    Both always have the same length (folding is per character), so a match on ``fold`` is a
    span of ``src`` too; when the text needs no folding both are the same object.
    """

    __slots__ = ("fold", "src")

    def __init__(self, src: str) -> None:
        self.src = src
        self.fold = fold_text(src)

    def commit(self, edits: list[Edit], hits: Hits) -> None:
        if not edits:
            return
        for _s, _e, _p, kind, raw in edits:
            hits.append((kind, raw))
        same = self.src is self.fold
        self.fold = _render(self.fold, edits)
        self.src = self.fold if same else _render(self.src, edits)


def _render(text: str, edits: list[Edit]) -> str:
    out: list[str] = []
    last = 0
    for start, end, pieces, _k, _r in edits:
        out.append(text[last:start])
        out.extend(p if isinstance(p, str) else text[p[0] : p[1]] for p in pieces)
        last = end
    out.append(text[last:])
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Window-wise scanning
# --------------------------------------------------------------------------------------------


def _matches(
    rx: re.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
) -> Iterator[re.Match[str]]:
    """``rx.finditer(text, pos, endpos)``, scanning over SCAN_WINDOW in overlapping windows.

    A window owns the matches that *start* before its last ``overlap`` characters; later ones
    are found again, whole, by the next window, which starts where the owned part ended (or
    after the last match). ``overlap`` is at least the longest match of ``rx`` plus its
    lookahead, so a secret straddling a window edge is matched exactly as in a single scan;
    the cost is at most SCAN_WINDOW / (SCAN_WINDOW - overlap) scans of the text.
    """
    n = len(text) if endpos is None else endpos
    overlap = _OVERLAPS.get(id(rx), SCAN_OVERLAP)
    while True:
        end = pos + SCAN_WINDOW
        if end >= n or overlap == UNBOUNDED:
            yield from rx.finditer(text, pos, n)
            return
        owned = end - overlap
        for m in rx.finditer(text, pos, end):
            if m.start() >= owned:
                break
            yield m
            pos = m.end()
        pos = max(pos, owned)


def _search(rx: re.Pattern[str], text: str, pos: int) -> re.Match[str] | None:
    """``rx.search(text, pos)`` with the same window rule as :func:`_matches`."""
    n = len(text)
    overlap = _OVERLAPS.get(id(rx), SCAN_OVERLAP)
    while True:
        end = pos + SCAN_WINDOW
        if end >= n:
            return rx.search(text, pos)
        m = rx.search(text, pos, end)
        if m is not None and m.start() < end - overlap:
            return m
        pos = end - overlap


def _collect(
    f: str,
    rx: re.Pattern[str],
    handle: Handler,
    kind: str,
    pos: int = 0,
    endpos: int | None = None,
) -> list[Edit]:
    """Edits for every accepted match of ``rx`` in ``f[pos:endpos]``; overlaps are dropped."""
    out: list[Edit] = []
    last = 0
    for m in _matches(rx, f, pos, endpos):
        edit = handle(m, f, kind)
        if edit is not None and edit[0] >= last:
            out.append(edit)
            last = edit[1]
    return out


def _apply(st: _Text, rule: Rule, hits: Hits, pos: int = 0, endpos: int | None = None) -> None:
    """Run one rule on ``st`` (its pre-check already passed) and commit its edits."""
    rx = rule.rx
    if rule.dense_rx is not None and st.fold.count(rule.needle) * 4 > len(st.fold):
        rx = rule.dense_rx  # mostly needle ("@" * N): the charset-first twin skips runs in C
    st.commit(_collect(st.fold, rx, rule.handle, rule.kind, pos, endpos), hits)


# --------------------------------------------------------------------------------------------
# key=value assignments and ("key", "value") pairs
# --------------------------------------------------------------------------------------------


_SCHEME_RX = re.compile(r"(?i:bearer|basic|token|digest)[ \t]{1,16}+")
_CLOSERS = {"{": "}", "[": "]", '"': '"', "'": "'"}


def _bare_end(f: str, key_start: int, a: int, b: int) -> int:
    """The real end of a bare value ``f[a:b]`` (a run up to whitespace or a quote): before the
    next assignment of the surrounding syntax (``&user=``, ``;Server=``, ``,user:``), without
    trailing ``,.;:`` and unbalanced closers; in multi-line text, on a line that starts with
    the key (INI, YAML, .env), up to the end of the line (a ``#`` comment after a space
    included: the safe side)."""
    cut = BARE_CUT_RX.search(f, a, b)
    if cut is not None and cut.start() > a:
        return cut.start()
    if b < len(f) and f[b] in " \t" and cut is None:
        # (bounded look-arounds: a text of many short values must not rescan the text)
        nl = f.rfind("\n", max(0, key_start - 64), key_start)
        if (nl != -1 or key_start < 64) and f[nl + 1 : key_start].strip() in _LINE_LEADS:
            eol = f.find("\n", b, b + TOKEN_MAX)
            if nl != -1 or eol != -1:  # multi-line text only
                eol = min(len(f), b + TOKEN_MAX) if eol == -1 else eol
                rest = f[b:eol].rstrip()
                if rest and not rest.lstrip().startswith(("#", "//")):
                    b += len(rest)
    while b > a + 1:
        c = f[b - 1]
        if c in ",.;:" or (c in _OPENERS and f.count(_OPENERS[c], a, b) < f.count(c, a, b)):
            b -= 1
        else:
            break
    return b


_OPENERS = {")": "(", "]": "[", "}": "{"}
_LINE_LEADS = frozenset({"", "-", "export", "set"})


def _assign_edit(f: str, key_start: int, vm: re.Match[str]) -> Edit | None:
    """Redact the value ``vm`` of a secret key; quotes, brackets and an auth scheme stay."""
    span = _assign_span(f, key_start, vm)
    if span is None:
        return None
    scheme_end, q_open, a, b, q_close = span
    pieces = ((key_start, scheme_end), q_open, REDACTED, q_close)
    return key_start, b + len(q_close), pieces, "secret_value", f[a:b]


def _assign_span(
    f: str, key_start: int, vm: re.Match[str]
) -> tuple[int, str, int, int, str] | None:
    """(end of what is kept before the value, opening quote, value start, value end, closing
    quote) for the value ``vm`` of a secret key, or None when there is nothing to redact."""
    v_start, v_end = vm.span()
    if f.startswith(REDACTED, v_start):
        return None
    sm = _SCHEME_RX.match(f, v_start, v_end)
    scheme_end = sm.end() if sm is not None and sm.end() < v_end else v_start
    eq, opened = vm.group("eq"), vm.group("open")
    first = f[v_start]
    if scheme_end > v_start:
        q_open = q_close = ""
        a, b = scheme_end, v_end
    elif eq:
        q_open = q_close = eq
        a, b = v_start + len(eq), v_end - len(eq)
    elif opened:  # unterminated quote: up to the end of the line
        q_open, q_close, a, b = opened, "", v_start + 1, v_end
    elif first in _CLOSERS:
        q_open, q_close, a, b = first, _CLOSERS[first], v_start + 1, v_end - 1
    else:
        q_open = q_close = ""
        a, b = v_start, _bare_end(f, key_start, v_start, v_end)
    if scheme_end > v_start:
        b = _bare_end(f, key_start, a, b)
    inner = f[a:b]
    if not inner.strip() or inner.startswith(REDACTED):
        return None
    if scheme_end == v_start and inner.lower() in ("bearer", "basic"):
        return None  # "Authorization: Bearer [REDACTED]": the token went already
    return scheme_end, q_open, a, b, q_close


def _key_start(f: str, i: int) -> int | None:
    """Start of the key that ends after position ``i`` (keys are runs of [\\w.-], <= 128)."""
    lo = max(0, i - 128)
    j = i
    while j > lo and (f[j - 1].isalnum() or f[j - 1] in "_.-"):
        j -= 1
    if j == lo and lo > 0 and (f[lo - 1].isalnum() or f[lo - 1] in "_.-"):
        return None
    return j


def _assign_family(st: _Text, rx: re.Pattern[str], hits: Hits) -> None:
    """key=value rule for one family of key words. The anchor regex finds a key word that is
    followed by the rest of the key and a separator; is_secret_key decides on the whole key.
    A secret key's value is consumed (searching resumes after it); after a key that is not a
    secret, searching resumes at its value, so "tokens: api_key=..." is still caught."""
    f = st.fold
    edits: list[Edit] = []
    for ks, vm in _assignments(f, rx):
        if edits and ks < edits[-1][1]:
            continue
        edit = _assign_edit(f, ks, vm)
        if edit is not None:
            edits.append(edit)
    st.commit(edits, hits)


def _assignments(f: str, rx: re.Pattern[str]) -> Iterator[tuple[int, re.Match[str]]]:
    """(key start, value match) of each secret-key assignment of the family ``rx`` in ``f``."""
    pos = 0
    last = 0
    while (m := _search(rx, f, pos)) is not None:
        pos = m.end()
        ks = _key_start(f, m.start())
        if ks is None or ks < last:
            continue
        if not is_secret_key(f[ks : m.start("kq")]):
            continue
        vm = VALUE_RX.match(f, m.end())
        if vm is None:
            continue
        pos = last = vm.end()
        yield ks, vm


def _pair(m: re.Match[str], _f: str, kind: str) -> Edit | None:
    v = m.group("v")
    if not is_secret_key(m.group("k")) or not v[1:-1].strip() or v[1:].startswith(REDACTED):
        return None
    return m.start("v"), m.end("v"), (v[0], REDACTED, v[0]), kind, v[1:-1]


# --------------------------------------------------------------------------------------------
# Values after a cue word: "the secret key is <token>", "password was hunter22"
# --------------------------------------------------------------------------------------------

# (stem in the lower-cased text, password cue, must start a word). A password cue also takes
# a value that is password_like() right after a connector ("is", ":", "="); the others need
# high_entropy(). Plural "tokens" is no cue (LLM usage counters), "keys"/"secrets" are.
_CUES: tuple[tuple[str, bool, bool], ...] = (
    *((w, True, False) for w in _words_of("password passwd passwort passphrase passcode")),
    *((w, False, False) for w in _words_of("secret key token credential")),
    ("pwd", False, True),
    *((w, True, False) for w in _words_of("пароль 密码 口令")),
    *((w, False, False) for w in _words_of("密钥 令牌 凭证 токен ключ секрет")),
)
_ASCII_CUES = tuple(c for c in _CUES if c[0].isascii())
_PLURAL_OK = frozenset(_words_of("password passwd passphrase passcode secret key credential"))
_CONNECTORS = frozenset(
    _words_of("is was are were be equals to as это равен 是 为 為 : = := => -> — – -")
)
_LEAD = ":=>-–—([{<*|→是为為：＝\\"
_TRAIL = "'\"`)]}>,.;:!?*|\\"
_TRAIL_STRONG = "'\"`)]}>,.;:|\\"  # a password may end in "!", "?" or "*"
_QUOTES = "'\"`"
_KEYISH = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-'\"]")
_CUE_START_RX = re.compile("|".join(re.escape(c[0]) for c in _CUES))
_ASSIGNED_RX = re.compile(r"[\"'\\]{0,3}+\s{0,4}+[:=]")
_BETWEEN_CUES = " \t\r\n_-.:=\"'"
_CUE_GAP = 96  # a value starts at most this far after its cue word ...
_CUE_PIECES = 6  # ... and within this many whitespace-separated pieces
_WS_RX = re.compile(r"\s")
_SPACE_RX = re.compile(r"\s{0,64}+")


class _Runs:
    """End of the whitespace-free run starting at a position (capped at TOKEN_MAX + 1), memoised
    so that cue windows, which mostly move forward, scan each stretch of text about once."""

    __slots__ = ("done", "f", "hi", "lo", "n")

    def __init__(self, f: str) -> None:
        self.f, self.n = f, len(f)
        self.lo = self.hi = 0
        self.done = False  # f[hi] is whitespace or the end: the run ends at hi

    def end(self, pos: int) -> int:
        cap = min(self.n, pos + TOKEN_MAX + 1)
        if not self.lo <= pos <= self.hi:
            self.lo = self.hi = pos
            self.done = False
        if not self.done and self.hi < cap:
            m = _WS_RX.search(self.f, self.hi, cap)
            self.hi = m.start() if m is not None else cap
            self.done = m is not None or cap == self.n
        return min(self.hi, cap)


def _cue_positions(
    f: str, lower: str, cues: tuple[tuple[str, bool, bool], ...]
) -> list[tuple[int, int, bool]]:
    """(start, end, password cue) of each cue word in ``lower`` (substring finds, C speed)."""
    out: list[tuple[int, int, bool]] = []
    n = len(lower)
    for stem, strong, word_start in cues:
        i = lower.find(stem)
        while i != -1:
            e = i + len(stem)
            ok = not (word_start and i > 0 and lower[i - 1].isalpha())
            if ok and stem.isascii() and e < n and "a" <= f[e] <= "z":
                # glued to more lower-case letters: "keyboard", "tokens", "secretary" are not
                # cues; a plural is ("passwords:", "keys are")
                ok = stem in _PLURAL_OK and f[e] == "s" and not (e + 1 < n and f[e + 1].isalpha())
                e += 1
            elif not stem.isascii():
                while e < n and e - i < 16 and "\u0430" <= lower[e] <= "\u044f":
                    e += 1  # inflections: пароля, паролем
            if ok:
                out.append((i, e, strong))
            i = lower.find(stem, i + 1)
    out.sort()
    return out


def _cue_edits(
    f: str,
    lower: str,
    cues: tuple[tuple[str, bool, bool], ...],
    orig: str | None = None,
    offs: list[int] | None = None,
) -> list[Edit]:
    """Edits for the values after the cue words of ``f``. With ``orig`` and ``offs`` (``f`` is
    then the skeleton of ``orig``), values are judged and replaced in ``orig``."""
    positions = _cue_positions(f, lower, cues)
    if not positions:
        return []
    runs = _Runs(f)
    edits: list[Edit] = []
    done_until = -1
    n = len(f)
    nxt = [(p[0], p[1]) for p in positions[1:]] + [(n + _CUE_GAP + 1, n)]
    for (cs, ce, strong), (next_cs, next_ce) in zip(positions, nxt, strict=True):
        if cs < done_until:
            continue  # inside a piece already judged ("key=key=...", a token holding "key")
        if next_cs - ce <= 16 and (next_ce >= n or not f[next_ce].isalnum()):
            between = f[ce:next_cs].strip(_BETWEEN_CUES)
            if not between or between.lower() in _CONNECTORS:
                continue  # the next cue word follows ("secret key", "key is key"): its turn
        if strong and _ASSIGNED_RX.match(f, ce) is not None:
            continue  # "password: v", "passwd=v": a secret key's assignment, done already
        edit, done = _cue_window(f, lower, ce, strong, runs, orig, offs)
        done_until = max(done_until, done)
        if edit is not None and (not edits or edit[0] >= edits[-1][1]):
            edits.append(edit)
    return edits


def _connectors(f: str, lower: str, a: int, glued: bool) -> tuple[int, bool, bool]:
    """Skip what connects a cue word to its value from ``a`` (``:``, ``=``, quotes, ``%3D``,
    ``是``...; at most 16 characters): (where the value may start, whether a connector was
    seen, whether a ``[REDACTED]`` stands there already)."""
    n, lead, conn = len(f), a, False
    while a < n and a - lead < 16:
        if lower.startswith("[redacted]", a):
            return a, conn, True
        if lower.startswith(("%3d", "%3a"), a):  # URL-encoded "=" / ":"
            conn = True
            a += 3
            continue
        if not (f[a] in _LEAD or (glued and f[a] in _QUOTES)):
            break
        if f[a] in ":=：＝是为為" or (glued and f[a] == ">"):  # ">": <password>v</password>
            conn = True
        a += 1
    return a, conn, False


def _cue_window(
    f: str,
    lower: str,
    ce: int,
    strong: bool,
    runs: _Runs,
    orig: str | None,
    offs: list[int] | None,
) -> tuple[Edit | None, int]:
    """The value after one cue word ending at ``ce``, and how far the pieces judged reach."""
    n = len(f)
    pos = ce
    after_conn = False
    done = ce
    for _ in range(_CUE_PIECES):
        sm = _SPACE_RX.match(f, pos)
        a = sm.end() if sm is not None else pos
        if a >= n or a > ce + _CUE_GAP or (a > pos and "\n\n" in f[pos:a]):
            break
        glued = a == ce
        lead = a
        a, conn, gone = _connectors(f, lower, a, glued)
        if gone:
            return None, a  # this window's value went already
        after_conn = after_conn or conn
        if a < n and a > lead and f[a].isspace():
            pos = a
            continue  # a lone ":" or "=" between spaces
        if lower.startswith("[redacted]", a) or lower.startswith("redacted]", a):
            return None, a
        cm = _CUE_START_RX.match(lower, a)
        if cm is not None and (cm.end() >= n or not f[cm.end()].isalnum()):
            return None, a  # another cue word: its own window takes over
        b = runs.end(a)
        done = max(done, b)
        if b <= a:
            pos = b
            continue
        # "_KEY=value", "\":\"value": a key-ish rest glued to the cue, then the value
        k = a
        while k < b and k - a < 64 and f[k] in _KEYISH:
            k += 1
        if k < b - 1 and f[k] in ":=" and (glued or k > a):
            after_conn = True
            a = k + 1
            while a < b and f[a] in _LEAD:
                a += 1
        quoted = a < b and f[a] in _QUOTES
        if quoted:
            eol = f.find("\n", a + 1, a + 1 + 512)
            close = f.find(f[a], a + 1, eol if eol != -1 else min(n, a + 1 + 512))
            if close == -1:
                quoted = False
            else:
                a, b = a + 1, close - (f[close - 1] == "\\")  # an escaped quote: \"value\"
                done = max(done, close + 1)
        ends_conn = not quoted and b > a and f[b - 1] in ":=："
        if not quoted:
            tag = f.find("</", a, b)  # <password>v</password>
            if tag != -1:
                b = tag
            trail = _TRAIL_STRONG if strong else _TRAIL
            while b > a and f[b - 1] in trail:
                b -= 1
        if b <= a:
            pos = max(pos + 1, runs.end(a) if a < n else n)
            continue
        if orig is not None:
            oa, ob = (offs[a], offs[b - 1] + 1) if offs is not None else (a, b)
            value = orig[oa:ob]
        else:
            oa, ob = a, b
            value = f[a:b]
        if "redacted" in value.lower():
            return None, done  # this window's value went already
        word = value.lower()
        if word in _CONNECTORS:
            after_conn = True
        elif high_entropy(value) or (
            strong
            and after_conn
            and (password_like(value) or (quoted and len(value) >= 6 and " " not in value))
        ):
            return (oa, ob, (REDACTED,), _SECRET, value), done
        else:
            after_conn = ends_conn  # "for the mail account:", then the value
            if (
                not quoted
                and f[b : b + 1] in (".", "!", "?", ";")
                and (b + 1 >= n or f[b + 1].isspace())
            ):
                break  # end of the sentence
        pos = max(pos + 1, done if not quoted else b + 1)
    return None, done


@functools.lru_cache(maxsize=4096)
def is_cue_key(key: str) -> bool:
    """A mapping key that is not a secret key but names one loosely (``cloudant_key``,
    ``AWS_KEY``, ``iam_token_value``): its string value is redacted when it is high-entropy
    (see :func:`cue_value_secret`)."""
    norm = unicodedata.normalize("NFKC", key) if not key.isascii() else key
    if not _NOT_SECRET_KEY_WORDS.isdisjoint(w.lower() for w in _KEY_WORD_RX.findall(norm)):
        return False  # primary_key, cache_key, idempotency_key, trace_token_id: ids, not secrets
    lower = norm.lower()
    return bool(_cue_positions(lower, lower, _CUES))


_KEY_WORD_RX = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+|[^\W\d_A-Za-z]+")
#: Words that make a "...key"/"...token" mapping key an identifier rather than a secret.
_NOT_SECRET_KEY_WORDS = frozenset(
    _words_of(
        "primary foreign partition sort cache idempotency dedup dedupe routing shard lookup "
        "public object row hash id ids uuid etag checksum digest index unique composite "
        "surrogate natural group message trace span request correlation page cursor bucket "
        "file blob path map join hotkey keyboard keyword keywords monkey turkey hockey"
    )
)


def cue_value_secret(value: str) -> bool:
    """Whether a string under an :func:`is_cue_key` key is a secret: a high-entropy token."""
    v = value.strip()
    return 16 <= len(v) <= TOKEN_MAX and high_entropy(v)


def _cues(st: _Text, lower: str, hits: Hits) -> None:
    """Redact the values after cue words (see :func:`_cue_window`)."""
    st.commit(_cue_edits(st.fold, lower, _CUES), hits)


# --------------------------------------------------------------------------------------------
# Look-alike cue words: matched on the confusable skeleton (context_core.gateway.skeleton)
# --------------------------------------------------------------------------------------------

# Text made only of ASCII and of scripts without Latin look-alikes (CJK, kana, hangul) has
# nothing the skeleton would turn into a cue word (full-width forms are folded already).
_SKELETON_GATE = re.compile(
    "[^\x00-\x7f\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
    "\uff01-\uff60\ufffd]"
)
_SKELETON_STEMS = tuple(
    sorted({c[0] for c in _ASCII_CUES} | {s for g, _rx in ASSIGN_RXS for s in g if s.isascii()})
)


_NON_ASCII_RX = re.compile(r"[^\x00-\x7f]++")


class _DeconfuseTable(dict[int, str]):
    """code point -> its skeleton if that is ASCII, else itself (filled on first sight)."""

    def __missing__(self, cp: int) -> str:
        from context_core.gateway.skeleton import skeleton_char

        if len(self) > 65536:
            self.clear()
        ch = chr(cp)
        sk = ch if cp < 128 else skeleton_char(ch)
        out = sk if sk.isascii() else ch
        self[cp] = out
        return out


_DECONFUSE = _DeconfuseTable()


def _deconfused(f: str) -> tuple[str, list[int] | None]:
    """``f`` with each non-ASCII character replaced by its skeleton when that is ASCII (a
    Cyrillic ``а`` by ``a``, a zero-width space by nothing), ASCII kept as is (the skeleton
    would also turn ``"`` into ``''`` and ``0`` into ``o``, which values and separators must
    not suffer); and for each character of the result, its index in ``f`` (None when the
    lengths are equal: then positions are the same)."""
    view = f.translate(_DECONFUSE)
    if len(view) == len(f):
        return view, None  # one character for one: positions are unchanged
    from context_core.gateway.skeleton import skeleton_char

    out: list[str] = []
    offs: list[int] = []
    last = 0
    for m in _NON_ASCII_RX.finditer(f):
        out.append(f[last : m.start()])
        offs.extend(range(last, m.start()))
        for i in range(m.start(), m.end()):
            ch = f[i]
            sk = skeleton_char(ch)
            rep = sk if sk.isascii() else ch
            out.append(rep)
            offs.extend([i] * len(rep))
        last = m.end()
    out.append(f[last:])
    offs.extend(range(last, len(f)))
    return "".join(out), offs


def _lookalikes(st: _Text, hits: Hits) -> None:
    """Cue words and secret keys written with look-alikes (``pаsswоrd`` with Cyrillic а/о,
    ``pass\u200bword``): found on the skeleton, redacted in the original text. Runs only
    when the skeleton holds more cue stems than the folded text itself (linear; skipped for
    ASCII and CJK text by the gate)."""
    f = st.fold
    if f.isascii() or _SKELETON_GATE.search(f) is None:
        return
    sk, offs = _deconfused(f)
    lower = f.lower()
    stems = [s for s in _SKELETON_STEMS if sk.count(s) > lower.count(s)]
    if not stems:
        return
    edits = _cue_edits(sk, sk.lower(), _ASCII_CUES, f, offs)
    for rx in _families_by_stem(sk.lower()):
        for ks, vm in _assignments(sk, rx):
            span = _assign_span(sk, ks, vm)
            if span is None:
                continue
            _se, _qo, a, b, _qc = span
            oa, ob = (offs[a], offs[b - 1] + 1) if offs is not None else (a, b)
            if "REDACTED" not in f[max(0, oa - 1) : ob + 1]:  # not the placeholder again
                edits.append((oa, ob, (REDACTED,), _SECRET, f[oa:ob]))
    edits.sort(key=lambda e: (e[0], -e[1]))
    kept: list[Edit] = []
    for e in edits:
        if not kept or e[0] >= kept[-1][1]:
            kept.append(e)
    st.commit(kept, hits)


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def _digit_rule(st: _Text, rule: Rule, hits: Hits) -> None:
    """A number rule behind its digit-run pre-check, scanning only the stretch from the first
    digit to the last (plus context): a body with one block of digits pays for that block,
    not for the whole text. The end keeps one character after the last digit, so the "not
    glued on the right" lookahead sees the real neighbour, never an artificial end."""
    f = st.fold
    cls = digit_class(f)
    if b"d" * rule.digits in cls:
        first, last = cls.find(b"d"), cls.rfind(b"d")
        _apply(st, rule, hits, max(0, first - 8), min(len(f), last + 2))


# Decoded base64 text goes through the rules only if it has something a rule could match: a
# separator, digit, non-ASCII character or marker (plain words are the common, cheap case).
# A nested base64 secret has digits or "+/" (encodings of "password=", "api_key", "token=").
_DECODED_GATE = re.compile(r"[=:\-_@/\[(+0-9\x80-\U0010ffff]")
_DECODED_MARKERS = ("earer", "Basic", "eyJ", "AKIA", "ASIA", "AIza")


def _base64(st: _Text, hits: Hits, nest: int) -> None:
    """Decode base64 tokens of B64_MIN..B64_MAX characters (padding included); redact a token
    whose text has a finding. Runs are found with bytes.translate + find (C speed, no regex
    entry per character); only bounded candidates are decoded, each distinct one once."""
    f = st.fold
    raw = f.encode("ascii", "replace") if not f.isascii() else f.encode("ascii")
    cls = raw.translate(B64_CLASS)
    needle = b"a" * (B64_MIN - 4)
    n = len(f)
    edits: list[Edit] = []
    verdicts: dict[str, str | None] = {}  # token -> finding kind, or None
    find = cls.find
    i = find(needle)
    while i != -1:
        j = find(b" ", i)
        if j == -1:
            j = n
        end = j
        if end < n and f[end] == "=":
            end += 2 if f.startswith("==", end) else 1
        if end - i >= B64_MIN and j - i <= B64_MAX and (end == n or f[end] != "="):
            token = f[i:end]
            kind = verdicts.get(token, "")
            if kind == "":
                kind = verdicts[token] = _b64_verdict(token, nest)
            if kind is not None:
                edits.append((i, end, (REDACTED,), kind, token))
        i = find(needle, j)
    st.commit(edits, hits)


def _b64_verdict(token: str, nest: int) -> str | None:
    """The kind of the first finding in what ``token`` decodes to, or None."""
    decoded = b64_text(token)
    if decoded is None or len(decoded) < 6:
        return None
    if _DECODED_GATE.search(decoded) is None and not any(m in decoded for m in _DECODED_MARKERS):
        return None
    inner: Hits = []
    _pipeline(_Text(decoded), inner, nest + 1)
    return inner[0][0] if inner else None


# The table's pre-checks as plain tuples, for the hot loop (same tests as Rule.precheck): a
# one-character test (memchr speed) before the multi-character one (a scan).
_CREDENTIAL_GATES = tuple(
    (r.quick, r.quick.upper() if r.ignore_case else r.quick, r.needle, r.ignore_case, r)
    for r in RULES
    if r.stage == "credential"
)
_PII_RULES = tuple(r for r in RULES if r.stage == "pii")
_MOBILE = next(r for r in RULES if r.name == "mobile_number")
_ASCII_GROUPS = tuple((g, rx) for g, rx in ASSIGN_RXS if g[0].isascii())
_PAIR_GATES = ('["', "['", '("', "('")
_CUE_GATES = (
    "key",
    "passw",
    "passphrase",
    "passcode",
    "secret",
    "token",
    "credential",
    "pwd",
    "пароль",
    "密码",
    "口令",
    "密钥",
    "令牌",
    "凭证",
    "токен",
    "ключ",
    "секрет",
)


# Any stem of any group, as one alternation: a text in which it finds nothing has no family,
# and most texts with a ':' or '=' (key names, JSON, URLs) have none. A search reports a stem
# wherever one starts (it tries each alternative at each position), so it answers "is there
# any stem" exactly; which groups, overlaps included, is still the per-stem loop's job.
_ANY_STEM = re.compile(
    "|".join(re.escape(s) for s in sorted({s for g, _rx in ASSIGN_RXS for s in g}, key=len))
)
#: Longest text the gate is asked about. Beyond it the alternation's scan (every alternative
#: tried at every position) costs more than the loop's substring tests: at 4 KB about 3x
#: the loop, and a 120 KB body with its only stem at the end paid 6.6 ms against 0.7 ms.
_ANY_STEM_MAX_LEN = 128


def _families(lower: str) -> list[re.Pattern[str]]:
    """The key-word groups with a stem in the text: none for a short text without any stem,
    else :func:`_families_by_stem`."""
    if len(lower) <= _ANY_STEM_MAX_LEN and _ANY_STEM.search(lower) is None:
        return []
    return _families_by_stem(lower)


def _families_by_stem(lower: str) -> list[re.Pattern[str]]:
    """The key-word groups with a stem in the text (substring tests: a stem may overlap
    another, "passecret", which a single alternation pass would miss)."""
    groups = _ASCII_GROUPS if lower.isascii() else ASSIGN_RXS
    keyed = "key" in lower
    return [
        rx
        for stems, rx in groups
        if any((keyed or s not in KEYED_STEMS) and s in lower for s in stems)
    ]


def _pipeline(st: _Text, hits: Hits, nest: int = 0) -> None:
    """One pass of every rule, in order: whole credentials first (a PEM block or JWT may hold
    ``key=`` text), then key=value assignments, base64-wrapped secrets, then PII (an ID number
    is checked before it can look like a card). Each rule runs behind its pre-check."""
    lower = ""
    lower_of: str | None = None
    for quick, quick_alt, needle, ignore_case, rule in _CREDENTIAL_GATES:
        f = st.fold
        if quick not in f and (not ignore_case or quick_alt not in f):
            continue
        if ignore_case:
            if lower_of is not f:
                lower, lower_of = f.lower(), f
            if needle in lower:
                _apply(st, rule, hits)
        elif needle in f:
            _apply(st, rule, hits)
    assign = "=" in st.fold or ":" in st.fold
    pairs = "," in st.fold and any(g in st.fold for g in _PAIR_GATES)
    if assign or pairs:
        lower = lower or st.fold.lower()
        families = _families(lower)
        if assign:
            for rx in families:
                _assign_family(st, rx, hits)
        if pairs and families:
            st.commit(_collect(st.fold, PAIR_RX, _pair, _SECRET), hits)
    if len(st.fold) >= 8:
        lower = st.fold.lower()
        if any(stem in lower for stem in _CUE_GATES):
            _cues(st, lower, hits)
        _lookalikes(st, hits)
    if nest < 2 and len(st.fold) >= B64_MIN:
        _base64(st, hits, nest)
    # the number rules share one more gate: 11+ digits, single separators allowed
    numbers: bool | None = None
    for rule in _PII_RULES:
        f = st.fold
        if rule.digits:
            if numbers is None:
                numbers = any(d in f for d in "0123456789") and LONG_DIGITS_RX.search(f) is not None
            if numbers:
                _digit_rule(st, rule, hits)
        elif rule.quick in f and rule.needle in f:
            _apply(st, rule, hits)


# Short strings seen clean before (keys, enum values, status words) skip the rules entirely.
# Only strings with no finding are remembered, so no secret is ever kept here.
KNOWN_CLEAN: dict[str, None] = {}
_KNOWN_CLEAN_MAX_LEN = 64
_KNOWN_CLEAN_MAX_ITEMS = 8192
_MAX_PASSES = 3


def redact_text(text: str) -> tuple[str, Hits]:
    """Apply every value rule to one string; return the cleaned text and (kind, original) hits.

    The result is a fixed point: when a pass removed something, the rules run again on its
    output (at most three passes), so ``redact_text(redact_text(x)[0])`` finds nothing new.
    """
    hits: Hits = []
    text = fix_surrogates(text)
    if len(text) < 6:
        return text, hits
    short = len(text) <= _KNOWN_CLEAN_MAX_LEN
    if short and text in KNOWN_CLEAN:
        return text, hits
    st = _Text(text)
    for _ in range(_MAX_PASSES):
        before = len(hits)
        _pipeline(st, hits)
        if len(hits) == before:
            break
    if short and not hits:
        remember_clean(text)
    return st.src, hits


#: Longest free text (a trace payload, a user query) the gateway remembers as clean: the same
#: signed L1 state comes back with every request of a session and is cleaned again each time.
KNOWN_CLEAN_TEXT_MAX_LEN = 2048


def remember_clean(text: str) -> None:
    """Remember ``text`` as having no finding (callers only pass such text; bounded)."""
    if len(KNOWN_CLEAN) >= _KNOWN_CLEAN_MAX_ITEMS:
        KNOWN_CLEAN.clear()
    KNOWN_CLEAN[text] = None


def mask_mobile(text: str) -> str:
    """Mask mainland mobile numbers only: ``13812341234`` -> ``138****1234`` (no audit)."""
    text = fix_surrogates(text)
    if not any(d in text for d in "0123456789"):
        return text
    st = _Text(text)
    _apply(st, _MOBILE, [])
    return st.src


#: Texts whose secret the engine must remove, checked once at import against the compiled
#: patterns (:func:`context_core.gateway.patterns.check_engine` checks the constructs they
#: use; these check the assembled rules on this interpreter). Each holds the marker below.
_CANARY_SECRET = "s3cr3tCanary9"
_CANARIES = (
    f'esc {{\\"password\\": \\"{_CANARY_SECRET}\\"}}',  # the escaped value 3.11.2 once kept
    f'{{"api_key": "{_CANARY_SECRET}"}}',
    f"login password={_CANARY_SECRET} ok",
    f"Authorization: Bearer {_CANARY_SECRET}xyz",
)


def _self_test() -> None:
    for text in _CANARIES:
        cleaned, hits = redact_text(text)
        if _CANARY_SECRET in cleaned or not hits:
            raise EngineSelfTestError(
                f"the redaction rules fail on this Python ({sys.version.split()[0]}): "
                f"{text!r} came out as {cleaned!r}, its secret kept; run the platform on "
                "another CPython build"
            )


_self_test()
