"""Look-alike-proof matching (issue 32 item 4): the confusable skeleton and its users.

Blocked keywords must not slip past with invisible characters (U+034F, U+2063, U+200B, U+00AD
and every other Default_Ignorable_Code_Point) or with letters of other scripts that look the
same (Cyrillic, Greek, Armenian, Cherokee, full-width, mathematical alphanumerics), neither in
hot-answer confirmations nor in uploads; ordinary words must not be refused on that account.
"""

from __future__ import annotations

import time
import unicodedata
from pathlib import Path
from typing import Any, cast

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_core.access.compliance import (
    ComplianceProfile,
    EffectiveProfile,
    check_text,
    find_blocked,
)
from context_core.config import get_settings
from context_core.errors import BlockedKeywordError, UploadBlockedError
from context_core.gateway.sanitize import Gateway
from context_core.gateway.skeleton import (
    CONFUSABLES_VERSION,
    contains_term,
    is_default_ignorable,
    skeleton,
    skeleton_char,
    skeleton_with_offsets,
    term_pattern,
)
from context_core.ingest.clamd import ScanVerdict
from context_core.ingest.upload import parse_keywords, scan_and_ingest

# Every Default_Ignorable_Code_Point, from the regex package's Unicode data (an independent
# check of the set the skeleton drops).
_DI = regex.compile(r"\p{Default_Ignorable_Code_Point}")
DEFAULT_IGNORABLES = [chr(cp) for cp in range(0x110000) if _DI.fullmatch(chr(cp))]

# (description, text) pairs that all spell "secret" to the eye.
DISGUISED_SECRET = [
    ("combining grapheme joiner U+034F", "se\u034fcret"),
    ("invisible separator U+2063", "sec\u2063ret"),
    ("zero-width space U+200B", "s\u200becret"),
    ("soft hyphen U+00AD", "secr\u00adet"),
    ("word joiner U+2060", "secre\u2060t"),
    ("zero-width joiner / non-joiner", "s\u200de\u200ccret"),
    ("bidi controls", "\u202asec\u202eret\u202c\u2066\u2069"),
    ("variation selectors", "s\ufe0fecret\U000e0100"),
    ("Mongolian free variation selector", "se\u180bcret"),
    ("tag characters", "\U000e0001se\U000e0063\U000e0072cret\U000e007f"),
    ("Hangul filler", "secr\u3164et"),
    ("Cyrillic ѕ е с р-free mix", "ѕесrеt"),
    ("Cyrillic capitals", "ЅЕСRЕТ"),
    ("Greek capitals", "SΕCRΕΤ"),
    ("Armenian / Cherokee capitals", "ՏᎬᏟᏒᎬᎢ"),
    ("full-width", "ｓｅｃｒｅｔ"),
    ("full-width capitals", "ＳＥＣＲＥＴ"),
    ("mathematical bold", "𝐬𝐞𝐜𝐫𝐞𝐭"),
    ("mathematical fraktur", "𝔰𝔢𝔠𝔯𝔢𝔱"),
    ("mathematical sans-serif bold italic capitals", "𝙎𝙀𝘾𝙍𝙀𝙏"),
    ("mathematical monospace", "𝚜𝚎𝚌𝚛𝚎𝚝"),
    ("combining acute accent", "se\u0301cret"),
    ("precomposed accents", "sécrèt"),
    ("combining strike-through overlay", "s\u0336e\u0336c\u0336r\u0336e\u0336t\u0336"),
    ("mixed case and scripts", "SеCrЕt"),
    ("several tricks at once", "\u200b𝐒е\u00adс\u034fＲ\u2063ｅ\U000e0041т\ufe0e"),
]


def test_the_data_sources_are_real_unicode_data() -> None:
    assert CONFUSABLES_VERSION.split(".")[0].isdigit() and int(CONFUSABLES_VERSION[:2]) >= 13
    assert len(DEFAULT_IGNORABLES) > 4000  # E0000-E0FFF alone are 4096
    for ch in "\u034f\u2063\u200b\u00ad\u2060\ufe0f\u202e\u2066\u180b\u3164\U000e0001":
        assert is_default_ignorable(ch), hex(ord(ch))
    for ch in "a \t\n\u00a0\u0301-":
        assert not is_default_ignorable(ch)


@pytest.mark.parametrize(("what", "text"), DISGUISED_SECRET)
def test_skeleton_unmasks_every_disguise(what: str, text: str) -> None:
    assert skeleton(text) == skeleton("secret") == "secret", what
    assert contains_term(skeleton(f"the {text} plan"), "SECRET"), what


@pytest.mark.parametrize(
    ("look_alike", "plain"),
    [
        ("раураl", "paypal"),  # Cyrillic р а у
        ("ΑΡΙ kеу", "api key"),  # Greek capitals, Cyrillic е
        ("αdmin", "admin"),  # Greek alpha
        ("ꓑꓳꓪꓰꓣ", "power"),  # Lisu
        ("ⅿⅰⅽ", "mic"),  # Roman numeral small letters
        ("ⓟⓐⓢⓢ", "pass"),  # circled
        ("ℎ𝑒𝓁𝓁ℴ", "hello"),  # letterlike symbols and mathematical script
        ("ﬁle", "file"),  # ligature
        ("ɡoogle", "google"),  # Latin script g
        ("ϳoin", "join"),  # Greek yot
        ("ԁоⅽ", "doc"),  # Cyrillic komi de, o; Roman numeral c
        ("ᏴꮃᏚ", "bws"),  # Cherokee capitals and small letters
        ("ǃnet", "!net"),  # click letter for "!"
    ],
)
def test_skeleton_maps_look_alikes_of_other_scripts(look_alike: str, plain: str) -> None:
    assert skeleton(look_alike) == skeleton(plain)


def test_skeleton_keeps_what_really_differs() -> None:
    # different letters, script-specific marks (kana voicing, Hebrew points) stay distinct
    assert skeleton("secret") != skeleton("secrat")
    assert skeleton("ガス") != skeleton("カス")
    assert skeleton("שָׁלוֹם") != skeleton("שלום")
    # Hangul syllables and their conjoining jamo are the same text
    assert skeleton("한국") == skeleton("\u1112\u1161\u11ab\u1100\u116e\u11a8")
    assert skeleton("Straße") == skeleton("STRASSE")
    assert skeleton("") == "" and skeleton("\u200b\u00ad") == ""


def test_offsets_point_back_into_the_original() -> None:
    text = "top 𝐒е\u00adс\u034fＲ\u2063ｅт plan, ﬁle"
    skel, offsets = skeleton_with_offsets(text)
    assert skel == skeleton(text) and len(offsets) == len(skel)
    m = term_pattern("secret")
    assert m is not None
    hit = m.search(skel)
    assert hit is not None
    start, end = offsets[hit.start()], offsets[hit.end() - 1] + 1
    assert text[start:end] == "𝐒е\u00adс\u034fＲ\u2063ｅт"
    fi = skel.index("file")
    assert text[offsets[fi]] == "ﬁ" and offsets[fi] == offsets[fi + 1]  # one char, two letters
    # marks put in canonical order keep their origins
    text2 = "a\u05b0\u0591b"  # Hebrew point (ccc 10) before accent (ccc 220): already ordered
    text3 = "a\u0591\u05b0b"  # out of order
    s3, o3 = skeleton_with_offsets(text3)
    assert s3 == skeleton(text3) == skeleton(text2)
    assert [text3[i] for i in o3] == list(s3)


def test_a_megabyte_is_skeletonised_in_well_under_a_second() -> None:
    unit = "The 𝐒е\u00adс\u034fＲ\u2063ｅт report, ſtraße ｃｏｄｅ 机密 ΑΡΙ. " * 10
    text = (unit * (1_000_000 // len(unit) + 1))[:1_000_000]
    skeleton(text[:1000])  # warm the per-character cache
    t0 = time.perf_counter()
    s = skeleton(text)
    t1 = time.perf_counter()
    s2, offsets = skeleton_with_offsets(text)
    t2 = time.perf_counter()
    assert s == s2 and len(offsets) == len(s)
    assert t1 - t0 < 0.5, f"skeleton: {t1 - t0:.2f}s per MB"
    assert t2 - t1 < 0.9, f"skeleton_with_offsets: {t2 - t1:.2f}s per MB"
    t0 = time.perf_counter()
    assert find_blocked(text, ["secret", "confidential"]) == ("secret",)
    assert time.perf_counter() - t0 < 1.5


# --- properties -------------------------------------------------------------------------------

KEYWORDS = st.sampled_from(["secret", "confidential", "project nightjar", "api key", "机密"])
IGNORABLE = st.sampled_from(DEFAULT_IGNORABLES)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keyword=KEYWORDS,
    inserts=st.lists(st.tuples(st.integers(min_value=0), IGNORABLE), min_size=1, max_size=6),
)
def test_default_ignorables_anywhere_never_evade(
    keyword: str, inserts: list[tuple[int, str]]
) -> None:
    disguised = keyword
    for pos, ch in inserts:
        i = pos % (len(disguised) + 1)
        disguised = disguised[:i] + ch + disguised[i:]
    assert find_blocked(f"see the {disguised} now", [keyword]) == (keyword,)
    # the operator's keyword may hold them too
    assert find_blocked(f"see the {keyword} now", [disguised]) == (disguised,)


@settings(max_examples=300, deadline=None)
@given(keyword=KEYWORDS, data=st.data())
def test_look_alike_letters_never_evade(keyword: str, data: st.DataObject) -> None:
    """Replace letters of the keyword by any character whose skeleton is that letter."""
    disguised = "".join(
        data.draw(st.sampled_from(LOOK_ALIKES.get(c, [c])), label=c) for c in keyword
    )
    assert find_blocked(f"({disguised})", [keyword]) == (keyword,)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40))
def test_skeleton_is_idempotent_and_offsets_agree(text: str) -> None:
    skel, offsets = skeleton_with_offsets(text)
    assert skel == skeleton(text)
    assert skeleton(skel) == skel
    assert len(offsets) == len(skel) and all(0 <= i < len(text) for i in offsets)
    assert not any(is_default_ignorable(c) for c in skel)
    assert unicodedata.is_normalized("NFD", skel)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=20))
def test_skeleton_ignores_case(text: str) -> None:
    skel = skeleton(text)
    assert skeleton(text.upper()) == skel
    assert skeleton(text.lower()) == skel
    assert skeleton(text.casefold()) == skel


def test_capital_and_small_look_alikes_agree() -> None:
    # Cyrillic capital Н looks like H; its small letter does not, yet case must not matter
    assert skeleton("НЕLLO") == skeleton("нello") == skeleton("hello")
    assert skeleton("WІKІ") == skeleton("wiki")  # Ukrainian І, not l
    assert skeleton("ΑΘΗΝΑ") == skeleton("Αθήνα") == skeleton("αθηνα")


def _look_alikes() -> dict[str, list[str]]:
    """For each ASCII letter, the BMP and SMP characters other than itself whose skeleton
    is exactly that letter (Cyrillic, Greek, Armenian, Cherokee, Lisu, full-width, math...)."""
    out: dict[str, list[str]] = {}
    for cp in range(0x80, 0x20000):
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cn", "Cs", "Co"):
            continue
        s = skeleton_char(ch)
        if len(s) == 1 and s.isascii() and s.isalpha():
            out.setdefault(s, [s]).append(ch)
    return out


LOOK_ALIKES = _look_alikes()


def test_every_latin_letter_has_look_alikes_from_several_scripts() -> None:
    for letter in "aceopsxy":
        names = {unicodedata.name(c, "?").split()[0] for c in LOOK_ALIKES[letter]}
        assert {"CYRILLIC", "FULLWIDTH", "MATHEMATICAL"} <= names, letter
    assert [skeleton_char(c) for c in "οαρτΟΑΡΤ"] == list("oapToapt".lower())


# --- keywords: look-alikes caught, ordinary words not refused ---------------------------------


@pytest.mark.parametrize(("what", "text"), DISGUISED_SECRET)
def test_find_blocked_catches_disguised_keywords(what: str, text: str) -> None:
    assert find_blocked(f"The {text} file.", ["secret"]) == ("secret",), what
    assert find_blocked(f"Das ist {text}!", ["Top", "SECRET"]) == ("SECRET",), what


def test_keywords_written_with_look_alikes_still_match() -> None:
    assert find_blocked("a secret plan", ["ѕесrеt"]) == ("ѕесrеt",)  # Cyrillic keyword
    assert find_blocked("a secret plan", ["se\u200bcret"]) == ("se\u200bcret",)
    assert find_blocked("the Project  Nightjar memo", ["𝐏𝐫𝐨𝐣𝐞𝐜𝐭 nightjar"]) == ("𝐏𝐫𝐨𝐣𝐞𝐜𝐭 nightjar",)
    # multi-word and CJK keywords, disguised in the text
    assert find_blocked("Project\u00a0Ｎｉｇｈｔｊａｒ", ["project nightjar"]) == (
        "project nightjar",
    )
    assert find_blocked("这是机\u200b密文件", ["机密"]) == ("机密",)
    assert find_blocked("这是secr\u00adet文件", ["secret"]) == ("secret",)


@pytest.mark.parametrize(
    ("text", "keyword"),
    [
        ("the secretary called", "secret"),  # whole words, as before
        ("the ѕесrеtary called", "secret"),  # ... with look-alikes too
        ("secretive secrets", "secret"),
        ("bum", "burn"),  # skeletons: m -> rn; plain ASCII keeps its exact meaning
        ("com", "corn"),
        ("101 ways", "lol"),  # 1 -> l, 0 -> o
        ("c0de", "code"),
        ("mall", "mail"),
        ("the Project Nightjars", "project nightjar"),
        ("an open secret-ary", "secretary"),
        ("sacred", "secret"),
        ("sécurité", "secret"),
    ],
)
def test_ordinary_words_are_not_refused(text: str, keyword: str) -> None:
    assert find_blocked(text, [keyword]) == ()


def test_accents_and_ascii_folds_count_only_with_a_look_alike_in_the_span() -> None:
    # a keyword with non-ASCII letters matches its unaccented spelling
    assert find_blocked("grosse", ["größe"]) == ("größe",)
    # ASCII folds (m/rn) count inside a span that holds a non-ASCII character
    assert find_blocked("b\u200bum", ["burn"]) == ("burn",)
    assert find_blocked("ｂｕｍ", ["burn"]) == ("burn",)


# --- confirmations: the check confirm_answers makes ---------------------------------------------


def _profile(*keywords: str) -> EffectiveProfile:
    return EffectiveProfile(
        "org-x", 1, 0, ComplianceProfile.parse({"blocked_keywords": list(keywords)})
    )


@pytest.mark.parametrize(("what", "text"), DISGUISED_SECRET)
def test_confirmation_check_refuses_disguised_keywords(what: str, text: str) -> None:
    eff = _profile("confidential", "secret")
    with pytest.raises(BlockedKeywordError) as err:
        check_text(eff, f"The pump list is {text}.", ("answers", 0, "text"))
    assert err.value.keyword == "secret" and err.value.loc == ("answers", 0, "text"), what
    check_text(eff, "The secretary confirmed it.", ("answers", 0, "text"))  # no error


# --- uploads ------------------------------------------------------------------------------------


class _CleanScanner:
    def scan(self, data: bytes) -> ScanVerdict:
        return ScanVerdict(None)


class _NoKnowledge:
    """A refused upload must not touch the knowledge memory at all."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused upload touched knowledge.{name}")


@pytest.mark.parametrize(("what", "text"), DISGUISED_SECRET)
def test_uploads_refuse_disguised_keywords(tmp_path: Path, what: str, text: str) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")
    kws = parse_keywords("Project Nightjar, secret")
    for name, body, ctype in [
        ("memo.txt", f"Status: {text} plan.\n", "text/plain"),
        ("memo.md", f"# Notes\n\nThe {text} list\n", "text/markdown"),
        ("page.html", f"<html><body><p>A <b>{text}</b> page</p></body></html>", "text/html"),
    ]:
        with pytest.raises(UploadBlockedError) as err:
            scan_and_ingest(
                body.encode(),
                name,
                ctype,
                scanner=_CleanScanner(),
                gateway=Gateway(audit_path=tmp_path / "audit.jsonl"),
                knowledge=cast(Any, _NoKnowledge()),
                blocked_keywords=kws,
                settings=settings,
                quarantine_to=tmp_path / "q",
            )
        assert err.value.keyword == "secret", (what, name)


def test_upload_file_names_are_checked_for_disguised_keywords(tmp_path: Path) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")
    with pytest.raises(UploadBlockedError) as err:
        scan_and_ingest(
            b"nothing to see",
            "Ｎｉｇｈｔ\u200bjar notes.txt",
            "text/plain",
            scanner=_CleanScanner(),
            gateway=Gateway(audit_path=tmp_path / "audit.jsonl"),
            knowledge=cast(Any, _NoKnowledge()),
            blocked_keywords=("nightjar",),
            settings=settings,
            quarantine_to=tmp_path / "q",
        )
    assert err.value.keyword == "nightjar"
