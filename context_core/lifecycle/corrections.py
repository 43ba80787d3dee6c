"""Is this user message a correction of the task contract? The design's ``user_correction`` rule.

Rule: a message corrects the contract when it carries a **negation or correction cue**, a
**value that contradicts the contract**, and the evidence adds up to a **confidence above
the threshold** (``CTX_CORRECTION_MIN_CONFIDENCE``, 0.6). All three, or it is not one.

How a message is read (English and Chinese; full-width punctuation normalised, dashes read
as commas, matching on a lower-cased copy):

1. Phrases that look negative but correct nothing are blanked out first: "not sure",
   "no problem", "don't forget", "not bad", 没问题, 不客气, 不确定, 别忘了, ...
2. Cue words are found in one pass; each cue is read in a bounded window around it and
   gives *claims*: a new value, and where the message states it, the old value and the
   field. Replacement cues name both sides ("not X but Y", "not X, use Y", "Y, not X",
   "Y instead of X", "X is wrong, Y", "don't use X, use Y", "X -> Y", 不是X，是Y,
   X不对，应该是Y; the looser ones, "Y not X", "Fahrenheit. Not celsius." and "not 5 bar,
   7 bar", only when X is the contract's value);
   correction cues give the new value ("<field> should be Y", "set <field> to Y",
   "I meant Y", 应该是Y, 改成Y, 我是说Y); a field named after a negation ("No. Unit:
   fahrenheit", "wrong unit, it's fahrenheit", "no: unit fahrenheit and pressure 7 bar") is
   a claim about that field; a bare negation ("no, Y", 不对，Y) and "actually Y" are weak.
3. Each claim is tied to one contract field, strongest evidence first: the field named in
   the claim or its sentence (``max_pages`` also as "max pages"; ``pressure_bar`` as
   "pressure"; 单位 for ``unit``), the stated old value equal to the field's current value,
   a unit naming the field ("3 pages" -> ``max_pages``), or the only field of the value's
   kind (the one numeric field for a number; for ``PUMP-0043`` the field of the same
   letters-digits shape; for "fahrenheit" the field holding "celsius": see
   :data:`~context_core.lifecycle.correction_cues.FAMILIES`). Free-text fields (``goal``) are only
   taken when named or quoted as the old value, and not on a bare "no".
4. The new value is typed like the field's old value: a number for a number field (units
   dropped, ``int`` when the old value is an ``int``), else text (a lower-case word stays
   lower case). It is never a negation, affirmation, filler, article, pronoun or field name
   ("No", "the", "it", "unit", 不是: :data:`~context_core.lifecycle.correction_cues.NON_VALUES`);
   read
   forward it stops where the message turns ("fahrenheit not celsius"), and a negated or
   questioned one ("don't use Y", "Y is not enough", "Y or Z") is none. A word field takes
   one word: when several are left and neither kind, shape nor the place next to a negated
   old value ("Paris, not Berlin") decides, the message names no value. A value equal to
   the current one *agrees*: not a correction.

Confidence = the cue's base (replacement 0.45, correction 0.45, weak 0.35) + the field
evidence (stated old value 0.35, named field 0.3, unit 0.25, shape or kind 0.2) + 0.1 when a
negation comes with it (its sentence or the one before), minus 0.5 for a question and 0.2
when hedged ("maybe", 可能). "not X but Y" with X the contract's value scores 0.9; "I meant
PUMP-0043" 0.65; "maybe the device should be PUMP-0043?" 0.05. When claims set one field
differently, the one naming the field or both sides wins over a correction verb alone, that
over a bare "no, Y"; then the higher score, then the later claim. If the winner agrees with
the contract ("No, fahrenheit... wait, no: the unit is celsius"), the field is kept.

Linear in the message: every cue is read within a bounded window, and a message with more
than :data:`_MAX_CUES` cues has only its first and last ones read. Pure functions, no I/O:
the lifecycle's ``user_message`` event calls :func:`detect_correction`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from typing import Any

from context_core import defaults
from context_core.lifecycle import correction_cues as cues

__all__ = ["DEFAULT_MIN_CONFIDENCE", "Correction", "detect_correction"]

#: ``Settings.correction_min_confidence``: a claim must score *above* this.
DEFAULT_MIN_CONFIDENCE = defaults.CORRECTION_MIN_CONFIDENCE

# --- weights and limits ---------------------------------------------------------------
_REPLACE = 0.45  # states the old value and the new one
_CORRECT = 0.45  # explicit correction verb: should be / change to / I meant / 改成
_WEAK = 0.35  # bare negation + value, "actually", a field named after a negation
_NEG_BONUS = 0.1
_QUESTION = 0.5
_HEDGE = 0.2
_EVIDENCE = {"old": 0.35, "named": 0.3, "unit": 0.25, "shape": 0.2, "family": 0.2}
_SPAN = cues.SPAN  # longest value read, in characters
_HINT = 48  # longest field phrase read before a cue
_WINDOW = 400  # how far a cue's pattern may reach
_MAX_CUES = 64  # cues read per message (the first and last halves)
_MAX_NAMED = 32  # negated field mentions read per message


@dataclass(frozen=True, slots=True)
class Correction:
    """The verdict on one message.

    ``fields``: what to write into the contract (field -> new value typed like the old one),
    empty unless ``detected``. ``confidence``: the best score of a claim that contradicts the
    contract (0 when none does). ``reasons``: how the verdict was reached, for the effects.
    """

    detected: bool
    confidence: float
    fields: dict[str, Any] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "detected": self.detected,
            "confidence": self.confidence,
            "fields": dict(self.fields),
            "reasons": list(self.reasons),
        }


# --------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------

_CJK = cues.CJK
_NOT_A_CUE = re.compile(cues.NOT_A_CUE)
_QUESTION_START = re.compile(cues.QUESTION_START)
_QUESTION_END = re.compile(cues.QUESTION_END)
_HEDGES = re.compile(cues.HEDGES)
_NEGATION = re.compile(cues.NEGATION)
# straight quotes, one kind of space, dashes as commas
_REPLACE_CHARS = (("\u2019", "'"), ("\u2018", "'"), *((c, " ") for c in "\t\r\f\v"))
_REPLACE_CHARS += tuple((c, ",") for c in "\u2012\u2013\u2014\u2015")
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)|[。！？；\n]")
_CLAUSE_END = re.compile(r"[.,;!?](?=\s|$)|[。，；！？、\n]")
_IS_CJK = re.compile(f"[{_CJK}]")


def _normalise(text: str) -> str:
    """NFKC (full-width punctuation and digits to ASCII), straight quotes, dashes as commas
    ("nope — fahrenheit", "not celsius - fahrenheit"), one space (str methods: C speed)."""
    t = unicodedata.normalize("NFKC", text)
    for a, b in _REPLACE_CHARS:
        t = t.replace(a, b)
    t = t.replace(" - ", " , ").replace(" -- ", " , ")
    while "  " in t:
        t = t.replace("    ", " ").replace("  ", " ")
    return t.strip()


def _lower(t: str) -> str:
    """``t`` lower-cased, the same length (positions carry over): "İ" is the one character
    whose lower case is two."""
    return t.replace("\u0130", "i").lower()


class _Doc:
    """One message: ``raw`` (normalised) and ``said`` (its lower case), ``t`` (non-cues
    blanked) and ``low`` (its lower case), all the same length; sentences; the field
    mentions and negations, found when first needed."""

    def __init__(self, text: str, lex: _Lexicon) -> None:
        self.raw = _normalise(text)
        self.said = _lower(self.raw)
        blanks = [m.span() for m in _NOT_A_CUE.finditer(self.said)]
        self.t, self.low = _blank(self.raw, blanks), _blank(self.said, blanks)
        self.sent = [0, *(m.end() for m in _SENTENCE_END.finditer(self.low))]
        self.lex = lex
        self._mentions: list[tuple[int, int, str]] | None = None
        self._mpos: list[int] = []
        self._neg: list[int] | None = None
        self._flags: dict[int, tuple[bool, bool, bool]] = {}

    @property
    def mentions(self) -> list[tuple[int, int, str]]:
        if self._mentions is None:
            self._mentions = self.lex.scan(self.low)
            self._mpos = [m[0] for m in self._mentions]
        return self._mentions

    @property
    def mpos(self) -> list[int]:
        return self._mpos if self.mentions else []

    def negation_before(self, lo: int, hi: int) -> bool:
        """A negation starting in ``[lo, hi)``."""
        if self._neg is None:
            self._neg = [m.start() for m in _NEGATION.finditer(self.low)]
        i = bisect_left(self._neg, lo)
        return i < len(self._neg) and self._neg[i] < hi

    def sentence(self, pos: int) -> int:
        return bisect_right(self.sent, pos) - 1

    def span(self, i: int) -> tuple[int, int]:
        return self.sent[i], self.sent[i + 1] if i + 1 < len(self.sent) else len(self.t)

    def clause_start(self, pos: int) -> int:
        """Where the clause holding ``pos`` starts, looking back at most :data:`_SPAN`."""
        start = max(0, pos - _SPAN)
        for m in _CLAUSE_END.finditer(self.low, start, min(len(self.low), pos + 1)):
            if m.end() <= pos:
                start = m.end()
        return start

    def flags(self, i: int) -> tuple[bool, bool, bool]:
        """(negated, a question, hedged) for sentence ``i``; questions and hedges are read
        on the unblanked text ("not sure" hedges)."""
        if i not in self._flags:
            lo, hi = self.span(i)
            s = self.said[lo:hi]
            question = bool(_QUESTION_END.search(s[-16:]) or _QUESTION_START.match(s))
            negated = _NEGATION.search(self.low, lo, hi) is not None
            self._flags[i] = (negated, question, _HEDGES.search(s) is not None)
        return self._flags[i]


def _blank(s: str, spans: list[tuple[int, int]]) -> str:
    if not spans:
        return s
    out, at = [], 0
    for a, b in spans:
        out += [s[at:a], " " * (b - a)]
        at = b
    return "".join([*out, s[at:]])


# --------------------------------------------------------------------------------------
# fields
# --------------------------------------------------------------------------------------


def _name_words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return [p for p in re.split(r"[_\-\s]+", spaced.lower()) if p]


def _name_variants(name: str) -> list[str]:
    base = " ".join(_name_words(name))
    if not base:
        return []
    return sorted({base, base.replace(" ", "_"), base.replace(" ", "-"), base.replace(" ", "")})


def _name_parts(name: str) -> set[str]:
    return {_stem(p) for p in _name_words(name) if p not in cues.GENERIC_NAME_PARTS}


@dataclass(frozen=True, slots=True)
class _Lexicon:
    """How the contract's fields are named in a message."""

    forms: dict[str, str]  # lower-case surface form -> field
    rx: re.Pattern[str] | None
    words: frozenset[str]  # words naming a field: never a value
    cjk_split: re.Pattern[str]

    def scan(self, low: str) -> list[tuple[int, int, str]]:
        if self.rx is None:
            return []
        return [(m.start(), m.end(), self.forms[m.group(0)]) for m in self.rx.finditer(low)]

    def named(self, text: str) -> list[str]:
        return sorted({f for _, _, f in self.scan(_lower(text))})


@lru_cache(maxsize=256)
def _lexicon(names: tuple[str, ...]) -> _Lexicon:
    full: dict[str, set[str]] = {}
    part: dict[str, set[str]] = {}
    words: set[str] = set()
    for name in names:
        for v in {*_name_variants(name), name.lower().strip()} - {""}:
            full.setdefault(v, set()).add(name)
        for p in _name_words(name):
            st = _stem(p)
            words.update((p, st))
            if {p, st} & (cues.GENERIC_NAME_PARTS | cues.UNIT_WORDS):
                continue
            for form in (*((p, st) if len(st) >= 4 else ()), *cues.CJK_FIELD_NAMES.get(st, ())):
                part.setdefault(form, set()).add(name)
    forms = {f: next(iter(o)) for f, o in full.items() if len(o) == 1}
    for f, o in part.items():
        if len(o) == 1 and f not in full:
            forms[f] = next(iter(o))
    words.update(forms)
    by_len = sorted(forms, key=lambda f: (-len(f), f))
    en = "|".join(re.escape(f) for f in by_len if not _IS_CJK.search(f))
    zh = "|".join(re.escape(f) for f in by_len if _IS_CJK.search(f))
    alts = ([rf"(?<![a-z0-9_])(?:{en})(?![a-z0-9_])"] if en else []) + ([zh] if zh else [])
    rx = re.compile("|".join(alts)) if alts else None
    splitters = sorted({*cues.CJK_NON_VALUES, *(f for f in forms if _IS_CJK.search(f))}, key=len)
    cjk_split = re.compile("|".join(re.escape(w) for w in reversed(splitters)))
    return _Lexicon(forms, rx, frozenset(w.lower() for w in words), cjk_split)


# --------------------------------------------------------------------------------------
# claims: cue patterns
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Pattern:
    cue: str
    base: float
    tier: int  # 2: names both sides; 1: a correction verb; 0: a bare negation
    rx: re.Pattern[str]  # matched at the cue; groups old, new, field
    before: str = ""  # what the text before the cue is (see cues.CUE_PATTERNS)


_WEIGHT = {"replace": _REPLACE, "correct": _CORRECT, "weak": _WEAK}
_PATTERNS = tuple(
    _Pattern(cue, _WEIGHT[w], tier, re.compile(rx), before)
    for cue, w, tier, rx, before in cues.CUE_PATTERNS
)
_ANCHOR = re.compile(cues.ANCHOR)
_NAMED = re.compile(cues.NAMED)
_TRAILING_AND = re.compile(cues.TRAILING_AND)


@dataclass(frozen=True, slots=True)
class _Claim:
    new: str
    old: str | None
    hint: str | None  # words naming the field in the claim's own slot
    named: str | None  # the field, when the claim is a field named after a negation
    cue: str
    base: float
    tier: int
    pos: int  # where the new value starts
    start: int  # the claim's span, for questions and hedges
    end: int
    backward: bool = False  # the value sits at the end of ``new`` ("Y, not X")
    needs_old: bool = False  # the negated value must be the contract's own


def _before(doc: _Doc, a: int) -> tuple[int, int, str]:
    """The clause just before position ``a`` (across one separator) and that separator:
    " " (same clause), "," / "and", or "." (the sentence before)."""
    t, e, sep = doc.t, a, " "
    while e > 0 and t[e - 1] == " ":
        e -= 1
    if doc.low[max(0, e - 4) : e] in (" and", "and") and (e < 4 or t[e - 4] == " "):
        sep, e = "and", e - 3
    elif e > 0 and t[e - 1] in ",，、:：":
        sep, e = ",", e - 1
    elif e > 0 and t[e - 1] in ".。!！;；\n":
        sep, e = ".", e - 1
    while e > 0 and t[e - 1] == " ":
        e -= 1
    return max(doc.clause_start(e), e - _SPAN), e, sep


def _anchors(low: str) -> list[int]:
    """Where the cues start: all of them, or the first and last ``_MAX_CUES // 2`` (the
    tail found by searching back from the end in growing steps, so never the whole text)."""
    head = [m.start() for m in islice(_ANCHOR.finditer(low), _MAX_CUES + 1)]
    if len(head) <= _MAX_CUES:
        return head
    half = _MAX_CUES // 2
    lo, size = head[half - 1] + 1, 1024
    while True:
        s = max(lo, len(low) - size)
        tail = [m.start() for m in _ANCHOR.finditer(low, s)]
        if len(tail) >= half or s == lo:
            return head[:half] + tail[-half:]
        size *= 4


def _spread(items: list[Any], n: int) -> list[Any]:
    return items if len(items) <= n else items[: n // 2] + items[len(items) - n // 2 :]


def _claims(doc: _Doc, lex: _Lexicon) -> tuple[list[_Claim], list[str]]:
    t, low, n = doc.t, doc.low, len(doc.t)
    out: list[_Claim] = []
    notes: list[str] = []
    anchors = _anchors(low)
    if len(anchors) == _MAX_CUES:
        notes.append(f"{_MAX_CUES}+ cues: only the first and last {_MAX_CUES // 2} were read")
    for a in anchors:
        for p in _PATTERNS:
            m = p.rx.match(low, a, min(n, a + _WINDOW))
            if m is None:
                continue
            gd = {k: (t[slice(*m.span(k))].strip() or None) for k, v in m.groupdict().items() if v}
            new, old, hint = gd.get("new"), gd.get("old"), gd.get("field")
            start, backward, needs_old = a, False, False
            if p.before:
                s, e, sep = _before(doc, a)
                text = t[s:e].strip() or None
                if p.before == "new":
                    new, backward, start, needs_old = text, True, s, sep in (" ", ".")
                elif p.before in ("old", "current"):
                    if sep != " " or text is None:
                        continue
                    old, start, needs_old = text, s, p.before == "current"
                elif p.before == "hint":
                    cs = max(doc.clause_start(a), a - _HINT)
                    hint = t[cs:a].strip() or None
                elif text and _content(text, lex):  # "alone": nothing before "not X, Y"
                    continue
                else:
                    needs_old = True
            if new:
                pos = m.start("new") if not backward else start
                out.append(
                    _Claim(new, old, hint, None, p.cue, p.base, p.tier, pos, start, m.end(),
                           backward, needs_old)
                )  # fmt: skip
    named = []
    for ms, me, name in doc.mentions if _NEGATION.search(low) else ():
        if doc.negation_before(doc.span(max(0, doc.sentence(ms) - 1))[0], ms):
            named.append((ms, me, name))
    if len(named) > _MAX_NAMED:
        notes.append(f"{len(named)} negated field mentions: {_MAX_NAMED} were read")
    for ms, me, name in _spread(named, _MAX_NAMED):
        m = _NAMED.match(low, me, min(n, me + _WINDOW))
        if m is None:
            continue
        vs, ve = m.span("new")
        j = bisect_left(doc.mpos, vs)
        while j < len(doc.mentions) and doc.mpos[j] < ve:
            if doc.mentions[j][2] != name:
                ve = doc.mpos[j]
                break
            j += 1
        new = _TRAILING_AND.sub("", t[vs:ve]).strip()
        if new:
            out.append(
                _Claim(new, None, None, name, "<field> after a negation", _WEAK, 2, vs, ms, ve)
            )
    return out, notes


# --------------------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------------------

_NUM = re.compile(
    r"(?<![\w.\-])(?<!\d,)(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(?![\w\-]*\d)\s*"
    rf"(?P<unit>%|[A-Za-z]+|[{_CJK}]{{1,2}})?"
)
_CN_NUM = re.compile(rf"(?P<num>[零一二两三四五六七八九十])(?P<unit>[{_CJK}]{{1,2}})")
_CN_UNIT_KEYS = sorted(cues.CN_UNITS, key=len, reverse=True)
_TOKEN = re.compile(rf"[^\W_{_CJK}](?:[^\W{_CJK}]|[\-./:+#@'](?=[^\W_{_CJK}]))*|[{_CJK}]+")
_CN_PARTICLES = "吧了啊呀呢的哦嘛"
_CJK_NON_VALUES = frozenset(cues.CJK_NON_VALUES)
_FILLER = re.compile(cues.FILLER, re.IGNORECASE)
_CUT = re.compile(cues.CUT)
_TEXT_CUT = re.compile(r"\s*\b(?:instead\s+of|rather\s+than)\b|而不是", re.IGNORECASE)
_FAMILY = {w: i for i, fam in enumerate(cues.FAMILIES) for w in fam}


def _stem(word: str) -> str:
    w = word.lower()
    w = cues.CN_UNITS.get(w, w)
    w = cues.UNIT_ALIASES.get(w, w)
    if len(w) > 3 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    return w


def _cn_unit(unit: str) -> str | None:
    return next((u for u in _CN_UNIT_KEYS if unit.startswith(u)), None)


def _numbers(text: str) -> list[tuple[float, str]]:
    """``(value, unit stem)`` of each number in ``text``, in order."""
    found: list[tuple[int, float, str]] = []
    for m in _NUM.finditer(text):
        unit = m.group("unit") or ""
        if unit and _IS_CJK.match(unit):
            unit = _cn_unit(unit) or ""
        found.append(
            (m.start(), float(m.group("num").replace(",", "")), _stem(unit) if unit else "")
        )
    for m in _CN_NUM.finditer(text):
        stem = _cn_unit(m.group("unit"))
        if stem is not None:
            value = float(cues.CN_DIGITS[m.group("num")])
            found.append((m.start(), value, _stem(stem) if stem else ""))
    return [(v, u) for _, v, u in sorted(found)]


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _shape(s: str) -> str:
    """Letters -> A, digits -> 9, runs collapsed: ``PUMP-0042`` -> ``A-9``."""
    return re.sub(r"([A9])\1+", r"\1", re.sub(r"[0-9]", "9", re.sub(r"[A-Za-z]", "A", s)))


def _is_token_like(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 64 and not re.search(r"\s", v.strip())


def _distinctive(value: str) -> bool:
    """An id-like value whose shape says what it is (``PUMP-0042``, ``v2``), unlike a bare
    word (``pdf``, ``thanks``) that any answer could contain."""
    return bool(re.search(r"\d", value)) and bool(re.search(r"[A-Za-z]", value))


def _clean_text_value(s: str) -> str:
    s = _FILLER.sub("", s.strip()).strip().strip("\"'`“”‘’「」『』")
    return s.rstrip(_CN_PARTICLES + " ").strip()


def _content(s: str, lex: _Lexicon) -> list[str]:
    """The words of ``s`` that may be a value: no cue word, filler or field name."""
    out: list[str] = []
    for tok in _TOKEN.findall(s):
        if _IS_CJK.match(tok):
            pieces = [p.strip(_CN_PARTICLES) for p in lex.cjk_split.split(tok)]
            out += [p for p in pieces if p and p not in _CJK_NON_VALUES and p not in lex.words]
        elif tok.lower() not in cues.NON_VALUES and tok.lower() not in lex.words:
            out.append(tok)
    return out


def _cut(text: str) -> str | None:
    """A forward value up to where the message turns ("not", "instead of", "but"); None
    when the value is the subject of a negative predicate."""
    m = _CUT.search(_lower(text))
    if m is None:
        return text
    return None if m.group("pred") else text[: m.start()]


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    return bool(a == b)


def _pick(cands: list[str], *, backward: bool, adjacent: bool) -> str | None:
    if len({c.casefold() for c in cands}) == 1:
        return cands[0]
    if cands and adjacent:
        return cands[-1] if backward else cands[0]
    return None


def _fit(raw: str, old: Any, lex: _Lexicon, *, backward: bool, adjacent: bool) -> Any | None:
    """The new value in ``raw`` typed like ``old``, or None when it has none of that type.
    ``adjacent``: the value ends right where the old one is negated, so of several words the
    one next to it is taken."""
    if _is_number(old) or _is_token_like(old):
        cut = raw if backward else _cut(raw)
        if cut is None:
            return None
        raw = cut
    if _is_number(old):
        nums = _numbers(raw)
        if not nums:
            return None
        number = nums[-1][0] if backward else nums[0][0]
        return int(number) if isinstance(old, int) and number.is_integer() else number
    if isinstance(old, bool) or not isinstance(old, str):
        return None
    if not _is_token_like(old):  # free text: up to "instead of" / "rather than"
        text_value = _clean_text_value(_TEXT_CUT.split(raw, maxsplit=1)[0])
        return text_value if _content(text_value, lex) else None
    toks = _content(raw, lex)
    if not toks:
        return None
    alike = [t for t in toks if _shape(t) == _shape(old)] if _distinctive(old) else []
    kin = [t for t in toks if _FAMILY.get(t.lower(), -1) == _FAMILY.get(old.lower(), -2)]
    if alike or kin:
        value: str | None = (alike or kin)[-1 if backward else 0]
    else:
        value = _pick(toks, backward=backward, adjacent=adjacent)
    if value and old != old.upper() and old == old.lower():
        return value.lower()  # "Fahrenheit." at a sentence start; the field holds "celsius"
    if value and old != old.lower() and old == old.upper():
        return value.upper()  # "pump-0043" for a field holding "PUMP-0042"
    return value


def _old_matches(stated: str, current: Any) -> bool:
    """Does the stated old value name the field's current value?"""
    if _is_number(current):
        nums = _numbers(stated)
        return len(nums) == 1 and _same(nums[0][0], current)
    if isinstance(current, str) and current.strip():
        if _same(_clean_text_value(stated), current):
            return True
        if _is_token_like(current):
            cf = current.strip().casefold()
            return any(t.casefold() == cf for t in _TOKEN.findall(stated))
    return False


# --------------------------------------------------------------------------------------
# which field
# --------------------------------------------------------------------------------------

_PRONOUNS = frozenset({"it", "that", "this", "they", "these", "those", "which", "the value"})
_NUM_ONLY = re.compile(
    rf"^[-+]?[\d,]+(?:\.\d+)?\s*(?:%|[A-Za-z]+|[{_CJK}]{{1,2}})?$|^[零一二两三四五六七八九十][{_CJK}]{{1,2}}$"
)


@dataclass(frozen=True, slots=True)
class _Candidate:
    field: str
    value: Any
    evidence: str
    agrees: bool
    tier: int


def _placed(claim: _Claim, lex: _Lexicon) -> bool:
    """May the value be guessed from its unit, shape or kind alone? Only when it *is* the
    claim (a weak cue: "no, PUMP-0043") or leads it (a correction cue: "should be 3 pages
    long"). "No, 2 of them failed" names no value of the contract."""
    body = _clean_text_value(claim.new if claim.backward else _cut(claim.new) or "")
    toks = _content(body, lex)
    if not toks:
        return False
    if len(toks) == 1 or _NUM_ONLY.match(body):
        return True
    if claim.base <= _WEAK:
        return False
    if claim.backward:
        return bool(re.search(rf"\d\s*(?:%|[A-Za-z]+|[{_CJK}]{{1,2}})?$", body)) or _distinctive(
            toks[-1]
        )
    return bool(_NUM.match(body) or _CN_NUM.match(body)) or _distinctive(toks[0])


def _resolve(
    claim: _Claim, doc: _Doc, fields: Mapping[str, Any], lex: _Lexicon
) -> _Candidate | None:
    """The contract field ``claim`` is about, with the new value typed for it."""
    usable = {
        k: v
        for k, v in fields.items()
        if isinstance(k, str) and (_is_number(v) or (isinstance(v, str) and v.strip()))
    }

    def make(name: str, evidence: str, tier: int = claim.tier) -> _Candidate | None:
        old = usable[name]
        if claim.base <= _WEAK and not (_is_number(old) or _is_token_like(old)):
            return None  # free text ("No, the goal is clear") needs more than a bare "no"
        # "fly to Paris, not Berlin": the word just before ", not <the old value>"
        adjacent = claim.backward and claim.old is not None and _old_matches(claim.old, old)
        value = _fit(claim.new, old, lex, backward=claim.backward, adjacent=adjacent)
        if value is None:
            return None
        if isinstance(value, str) and (
            (evidence == "shape" and _shape(value) != _shape(old))
            or (evidence == "family" and _FAMILY.get(value.lower()) != _FAMILY.get(old.lower()))
        ):
            return None  # guessed from a value of that kind: the value must be of it
        return _Candidate(name, value, evidence, _same(value, old), tier)

    if claim.named is not None:
        return make(claim.named, "named", 2) if claim.named in usable else None
    # 1. named in the claim's own slot ("the unit should be"), else in its sentence (the
    #    nearest mention before the new value wins, then the first after it).
    hint = re.sub(
        r"^(?:(?:the|a|an|and|but|so|then|also|now|no|yes)\b\W*)+", "", (claim.hint or "").lower()
    )
    if hint:
        named = [k for k in lex.named(hint) if k in usable]
        if not named:  # "the distance" for distance_km: a distinctive part of the name
            words = {_stem(w) for w in re.findall(r"[a-z]+", hint)} - {"it", "that", "this"}
            named = [k for k in usable if words & _name_parts(k)]
        if len(named) == 1 and (c := make(named[0], "named", 2)):
            return c
        if _IS_CJK.search(hint) and not named:
            hint = ""  # 我觉得应该是…: a Chinese lead-in names no field
    lo, hi = doc.span(doc.sentence(claim.pos))
    i, j = bisect_left(doc.mpos, lo), bisect_left(doc.mpos, claim.pos)
    k = bisect_left(doc.mpos, hi)
    near = [doc.mentions[x][2] for x in range(j - 1, max(i, j - 8) - 1, -1)]
    near += [doc.mentions[x][2] for x in range(j, min(k, j + 8))]
    for name in dict.fromkeys(near):
        if name in usable and (c := make(name, "named")):
            return c
    # 2. the stated old value is the field's current value
    if claim.old:
        matching = [k for k, v in usable.items() if _old_matches(claim.old, v)]
        if len(matching) == 1 and (c := make(matching[0], "old")):
            return c
    if not _placed(claim, lex):
        return None
    # 3. a unit naming the field (numbers only): "3 pages" -> max_pages
    numeric = [k for k, v in usable.items() if _is_number(v)]
    body = claim.new if claim.backward else _cut(claim.new) or ""
    nums = _numbers(body)
    unit = (nums[-1] if claim.backward else nums[0])[1] if nums else ""
    by_unit = [k for k in numeric if unit and unit in _name_parts(k)]
    if len(by_unit) == 1 and (c := make(by_unit[0], "unit")):
        return c
    # A subject that is not a pronoun and names no field ("the summary should be ...")
    # says the claim is about something else: no guessing from the value's shape.
    if hint and hint not in _PRONOUNS and not hint.endswith(" it"):
        return None
    # 4a. shape: the only numeric field
    if nums and len(numeric) == 1 and (c := make(numeric[0], "shape")):
        return c
    # 4b. shape: the only id-like field of the same letters-digits shape
    toks = _content(body, lex)
    ids = [k for k, v in usable.items() if _is_token_like(v) and _distinctive(v) and k != "goal"]
    shaped = [
        k for k in ids if any(_distinctive(t) and _shape(t) == _shape(usable[k]) for t in toks)
    ]
    if len(shaped) > 1:
        # several fields of that shape: the one sharing the new value's leading letters
        shaped = [k for k in shaped if any(_prefix(t) == _prefix(usable[k]) for t in toks)]
    if len(shaped) == 1 and (c := make(shaped[0], "shape")):
        return c
    # 4c. kind: the only word field whose value is of the same kind ("fahrenheit", "celsius")
    kinds = {_FAMILY[t.lower()] for t in toks if t.lower() in _FAMILY}
    kin = [k for k, v in usable.items() if _is_token_like(v) and _FAMILY.get(v.lower()) in kinds]
    if len(kin) == 1 and (c := make(kin[0], "family")):
        return c
    return None


def _prefix(s: str) -> str:
    m = re.match(r"[A-Za-z]+", s)
    return m.group(0).lower() if m else ""


# --------------------------------------------------------------------------------------
# the rule
# --------------------------------------------------------------------------------------


def detect_correction(
    text: str,
    contract_fields: Mapping[str, Any],
    *,
    min_confidence: float = DEFAULT_MIN_CONFIDENCE,
) -> Correction:
    """Apply the correction rule to one user message against the contract's current fields.

    Returns a :class:`Correction`; ``detected`` only when a cue, a value contradicting the
    contract and a confidence above ``min_confidence`` all hold.
    """
    if not isinstance(text, str) or not text.strip() or not contract_fields:
        return Correction(False, 0.0, {}, ("no text, or no contract to correct",))
    lex = _lexicon(tuple(k for k in contract_fields if isinstance(k, str)))
    doc = _Doc(text, lex)
    claims, reasons = _claims(doc, lex)
    if not claims:
        return Correction(False, 0.0, {}, ("no negation or correction cue",))
    # field -> (tier, score, position, value, agrees)
    votes: dict[str, list[tuple[int, float, int, Any, bool]]] = {}
    for claim in claims:
        cand = _resolve(claim, doc, contract_fields, lex)
        if cand is None:
            reasons.append(f"{claim.cue}: {claim.new[:60]!r} fits no contract field")
            continue
        current = contract_fields[cand.field]
        score = claim.base + _EVIDENCE[cand.evidence]
        notes = [claim.cue, f"field {cand.field} by {cand.evidence}"]
        first, last = doc.sentence(claim.start), doc.sentence(max(claim.start, claim.end - 1))
        flags = [doc.flags(i) for i in range(first, last + 1)]
        if any(f[0] for f in flags) or (first > 0 and doc.flags(first - 1)[0]):
            score += _NEG_BONUS
            notes.append("negation")
        if claim.old is not None:
            stated = _fit(claim.old, current, lex, backward=False, adjacent=False)
            if stated is None or (claim.needs_old and not _same(stated, current)):
                # "the budget is 1,500, not enough": what is negated is no value of the field
                reasons.append(f"{claim.cue}: {claim.old[:60]!r} is not a {cand.field} value")
                continue
            if not _same(stated, current):
                score -= _NEG_BONUS
                notes.append(f"stated old value {stated!r} is not the contract's")
        if any(f[1] for f in flags):
            score -= _QUESTION
            notes.append("question")
        if any(f[2] for f in flags):
            score -= _HEDGE
            notes.append("hedged")
        score = round(min(1.0, max(0.0, score)), 3)
        verdict = "agrees with the contract" if cand.agrees else f"{current!r} -> {cand.value!r}"
        reasons.append(f"{'; '.join(notes)}: {verdict} ({score})")
        votes.setdefault(cand.field, []).append(
            (cand.tier, score, claim.pos, cand.value, cand.agrees)
        )
    chosen: dict[str, Any] = {}
    confidence = 0.0
    for name, ballots in votes.items():
        # the claim naming the field or both sides, then the higher score, then the later
        eligible = [b for b in ballots if b[1] > min_confidence]
        top = max(eligible, key=lambda b: b[:3]) if eligible else None
        if top is not None and top[4]:
            reasons.append(f"{name}: the strongest claim agrees with the contract")
            continue
        confidence = max([confidence, *(b[1] for b in ballots if not b[4])])
        if top is not None:
            chosen[name] = top[3]
    if not chosen:
        if votes and confidence:
            reasons.append(f"confidence {confidence} is not above {min_confidence}")
        return Correction(False, confidence, {}, tuple(reasons))
    return Correction(True, confidence, chosen, tuple(reasons))
