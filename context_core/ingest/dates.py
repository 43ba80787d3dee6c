"""Locale-tolerant parsing of the dates Confluence prints in page metadata.

An export's ``div.page-metadata`` is rendered in the exporting user's locale, so the same
instance can produce "Jun 29, 2019 14:03", "Sept 08, 2021", "23.02.2015", "23. 2. 2015",
"2018-01-11", "2018/01/11", "一月 11, 2018", "2018年1月11日", "1월 11, 2018",
"2018. 1. 11.", "11. Januar 2018", "23. února 2015" or "11 января 2018 г.".
:func:`find_date` searches a free-text string for every format it knows and returns the
*last* date in it (the metadata line reads "Created by A, last modified by B on <date>", so
the last date is the last modification). Unknown formats return ``None``; the caller decides
the fallback, and :func:`explain_no_date` says why in a form worth logging.

Every pattern below uses bounded quantifiers only (``\\s{1,3}``, ``\\d{1,2}``, a month word
of 3-10 letters), so a match attempt at any position costs a constant amount of work and a
scan of the whole text is linear in its length, whatever the text contains (tests/test_dates.py
feeds it 200 000-character adversarial strings).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

__all__ = ["explain_no_date", "find_date"]

_MONTHS: dict[str, int] = {}
for _num, _names in enumerate(
    [
        # English (incl. Confluence's four-letter "Sept"), German, French, Spanish forms;
        # Czech genitive + nominative; Russian genitive, nominative and short forms.
        "january jan janv januar janvier enero ene jänner ledna leden января январь янв",
        "february feb febr februar février fevrier févr fevr febrero"
        " února únor февраля февраль фев февр",
        "march mar mär märz maerz mars marzo března březen марта март мар",
        "april apr avr avril abril abr dubna duben апреля апрель апр",
        "may mai mayo května květen мая май",
        "june jun juni juin junio června červen июня июнь июн",
        "july jul juli juil juillet julio července červenec июля июль июл",
        "august aug août aout agosto ago srpna srpen августа август авг",
        "september sep sept septembre septiembre září сентября сентябрь сен сент",
        "october oct okt oktober octobre octubre října říjen октября октябрь окт",
        "november nov novembre noviembre listopadu listopad ноября ноябрь ноя нояб",
        "december dec dez dezember décembre decembre déc diciembre dic"
        " prosince prosinec декабря декабрь дек",
    ],
    start=1,
):
    for _n in _names.split():
        _MONTHS[_n] = _num

_CN = "一二三四五六七八九十"
_CN_DIGITS = {ch: i for i, ch in enumerate(_CN, start=1)}

# A month word is matched as any 3-10 letter word and looked up in _MONTHS afterwards: a
# regex alternation of ~150 words would be tried word by word at every position of the text.
_MONTH_WORD = r"(?P<mon>[^\W\d_]{3,10})(?![^\W\d_])"

# Separators. Each is a choice between disjoint shapes (with / without a comma, with / without
# a dot) and every whitespace run is bounded, so no two quantifiers compete for the same text.
_SEP = r"(?:\s?[,，]\s?|\s{1,3})"  # "11, 2018" / "11 2018" / "11，2018"
_SEP0 = r"(?:\s?[,，]\s?|\s{0,3})"  # as _SEP, or nothing at all ("2018年1月11日14:03")
_AM = ("오전", "上午", "午前")
_PM = ("오후", "下午", "午後")


def _time(sep: str) -> str:
    """An optional time after a date: ", 14:03", " at 2:03 PM", " um 14:03", " 오후 2:03"."""
    pre = "|".join(_AM + _PM)
    return (
        rf"(?:{sep}(?:(?:at|um|à|v|в)\s)?(?:(?P<pre>{pre})\s?)?"
        r"(?P<H>\d{1,2})[:：](?P<M>\d{2})(?::(?P<S>\d{2}))?(?!\d)"
        r"(?:\s?(?P<ampm>[AaPp]\.?[Mm]\.?)(?![^\W\d_]))?)?"
    )


_PATTERNS: tuple[re.Pattern[str], ...] = (
    # 2019-06-29, 2019-06-29T14:03:00Z, 2019-06-29 14:03+08:00
    re.compile(
        r"(?<!\d)(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})(?!\d)"
        r"(?:[T\s](?P<H>\d{1,2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:\.\d{1,9})?)?"
        r"(?P<tz>Z|[+-]\d{2}:?\d{2})?(?!\d))?"
    ),
    # 2018/01/11 (year first, so never ambiguous; 06/29/2019 is refused on purpose)
    re.compile(r"(?<![\d/])(?P<y>\d{4})/(?P<m>\d{1,2})/(?P<d>\d{1,2})(?![\d/])" + _time(_SEP)),
    # 2018年1月11日 / 2018年1月11日 14:03 / 2018년 1월 11일 / 2018年1月11日 下午2:03
    re.compile(
        r"(?<!\d)(?P<y>\d{4})\s?[年년]\s?(?P<m>\d{1,2})\s?[月월]\s?(?P<d>\d{1,2})(?!\d)"
        r"(?:\s?[日일])?" + _time(_SEP0)
    ),
    # 一月 11, 2018 / 十二月 3, 2019 14:03 / 1月 11, 2018 / 1월 11, 2018
    re.compile(
        rf"(?<![\d{_CN}])(?P<cnm>[\d{_CN}]{{1,2}})\s?[月월]\s?(?P<d>\d{{1,2}})(?!\d)"
        rf"{_SEP}(?P<y>\d{{4}})(?!\d)" + _time(_SEP)
    ),
    # 2018. 1. 11. / 2018. 01. 11 오후 2:03 / 2018.01.11 (Korean: year first, dot-separated)
    re.compile(
        r"(?<![\d.])(?P<y>\d{4})\.\s?(?P<m>\d{1,2})\.\s?(?P<d>\d{1,2})(?!\d)\.?" + _time(_SEP)
    ),
    # 23.02.2015 / 11.01.2018 14:03 / 23. 2. 2015 (day first: German, Czech, Russian)
    re.compile(r"(?<![\d.])(?P<d>\d{1,2})\.\s?(?P<m>\d{1,2})\.\s?(?P<y>\d{4})(?!\d)" + _time(_SEP)),
    # Jun 29, 2019 / Sept 08, 2021 14:03 / June 29, 2019 at 2:03 PM
    re.compile(
        rf"(?<![^\W\d_]){_MONTH_WORD}(?:\.\s{{0,3}}|\s{{1,3}})(?P<d>\d{{1,2}})(?!\d)"
        rf"(?:st|nd|rd|th)?{_SEP}(?P<y>\d{{4}})(?!\d)" + _time(_SEP),
        re.IGNORECASE,
    ),
    # 26 Jul 2024 / 11. Januar 2018 / 3 déc. 2019 / 23. února 2015 / 11 января 2018 г.
    # / 29 de junio de 2019
    re.compile(
        rf"(?<!\d)(?P<d>\d{{1,2}})(?:\.\s{{0,3}}|\s{{1,3}})(?:de\s)?{_MONTH_WORD}"
        r"\.?,?\s{1,3}(?:de\s)?(?P<y>\d{4})(?!\d)(?:\s?г\.?)?" + _time(_SEP),
        re.IGNORECASE,
    ),
)

# Shapes that look like a date but are refused; only used to explain a miss.
_AMBIGUOUS = re.compile(r"(?<![\d/])\d{1,2}/\d{1,2}/(?:\d{4}|\d{2})(?![\d/])")


def _cn_month(token: str) -> int:
    """Month number of "1", "12", "一" or "十二"; anything else (e.g. "1二", "十三") raises."""
    if token.isdecimal():
        return int(token)
    if len(token) == 2 and token[0] == "十":  # 十一, 十二
        return 10 + _CN_DIGITS[token[1]]
    return _CN_DIGITS[token]


def _tz(raw: str | None, default_tz: timezone) -> timezone:
    if not raw:
        return default_tz
    if raw == "Z":
        return UTC
    sign = 1 if raw[0] == "+" else -1
    digits = raw[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def _build(m: re.Match[str], default_tz: timezone) -> datetime | None:
    g = m.groupdict()
    try:
        if g.get("mon"):
            month = _MONTHS[g["mon"].lower()]
        elif g.get("cnm"):
            month = _cn_month(g["cnm"])
        else:
            month = int(g["m"])
        tz = _tz(g.get("tz"), default_tz)
        day = datetime(int(g["y"]), month, int(g["d"]), tzinfo=tz)
    except (KeyError, ValueError):
        return None  # e.g. 31.02.2015 or an unknown month word: not a date after all
    if not g.get("H"):
        return day
    hour, minute = int(g["H"]), int(g["M"])
    second = int(g["S"]) if g.get("S") else 0
    marker = g.get("pre") or (g.get("ampm") or "").lower().replace(".", "")
    is_pm = marker in _PM or marker == "pm"
    is_am = marker in _AM or marker == "am"
    if is_pm and hour < 12:
        hour += 12
    elif is_am and hour == 12:
        hour = 0
    try:
        return day.replace(hour=hour, minute=minute, second=second)
    except ValueError:
        return day  # "29.06.2019 25:70": keep the (valid) day, drop the nonsense time


def _scan(text: str, default_tz: timezone) -> Iterator[tuple[re.Match[str], datetime | None]]:
    """Every pattern match in ``text`` (whitespace runs collapsed to one space first, so
    "Jun  29,\n2019" reads like "Jun 29, 2019") with its datetime, or ``None`` if invalid."""
    flat = " ".join(text.split())
    for pat in _PATTERNS:
        for m in pat.finditer(flat):
            yield m, _build(m, default_tz)


def find_date(text: str, *, default_tz: timezone = UTC) -> datetime | None:
    """The last parseable date in ``text`` (tz-aware; ``default_tz`` when none is given).

    "Last" is by match end; of two dates ending at the same place the longer match wins (so
    "Jun 29, 2019 14:03" beats a shorter reading of its tail).
    """
    best: tuple[int, int, datetime] | None = None
    for m, dt in _scan(text, default_tz):
        if dt is None:
            continue
        key = (m.end(), m.end() - m.start())
        if best is None or key > best[:2]:
            best = (key[0], key[1], dt)
    return best[2] if best else None


def _quote(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def explain_no_date(text: str) -> str:
    """A short, human-readable reason why :func:`find_date` finds nothing in ``text``.

    Meant for logs and quarantine records: "metadata has no text", "invalid date
    '31.02.2015' in metadata '…'", "ambiguous date '06/29/2019' …" or "no date in metadata
    '…'". When ``text`` does hold a date the answer says so instead.
    """
    flat = " ".join(text.split())
    if not flat:
        return "metadata has no text"
    invalid: str | None = None
    for m, dt in _scan(text, UTC):
        if dt is not None:
            return f"metadata has a date ({dt.isoformat()}) in {_quote(flat)}"
        mon = m.groupdict().get("mon")
        if mon is None or mon.lower() in _MONTHS:  # "Build 12, 2019" is no date at all
            invalid = invalid or m.group()
    if invalid:
        return f"invalid date {invalid!r} in metadata {_quote(flat)}"
    amb = _AMBIGUOUS.search(flat)
    if amb:
        return (
            f"ambiguous date {amb.group()!r} (day/month order unknown) in metadata {_quote(flat)}"
        )
    return f"no date in metadata {_quote(flat)}"
