"""Locale-tolerant parsing of the dates Confluence prints in page metadata.

An export's ``div.page-metadata`` is rendered in the exporting user's locale, so the same
instance can produce "Jun 29, 2019 14:03", "Sept 08, 2021", "23.02.2015", "2018-01-11",
"一月 11, 2018", "2018年1月11日" or "11. Januar 2018". :func:`find_date` searches a free-text
string for every format it knows and returns the *last* date in it (the metadata line reads
"Created by A, last modified by B on <date>", so the last date is the last modification).
Unknown formats return ``None``; the caller decides the fallback.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = ["find_date"]

_MONTHS: dict[str, int] = {}
for _num, _names in enumerate(
    [
        # English (incl. Confluence's four-letter "Sept"), German, French, Spanish short forms
        "january jan janv januar janvier enero ene jänner",
        "february feb febr februar février fevrier févr fevr febrero",
        "march mar mär märz maerz mars marzo",
        "april apr avr avril abril abr",
        "may mai mayo",
        "june jun juni juin junio",
        "july jul juli juil juillet julio",
        "august aug août aout agosto ago",
        "september sep sept septembre septiembre",
        "october oct okt oktober octobre octubre",
        "november nov novembre noviembre",
        "december dec dez dezember décembre decembre déc diciembre dic",
    ],
    start=1,
):
    for _n in _names.split():
        _MONTHS[_n] = _num

_CN_DIGITS = {ch: i for i, ch in enumerate("一二三四五六七八九十", start=1)}
_CN_MONTH = "(?:十[一二]|[一二三四五六七八九十])"

_MONTH_ALT = "|".join(sorted((re.escape(m) for m in _MONTHS), key=len, reverse=True))
_TIME = (
    r"(?:[,\s]+(?:at\s+|um\s+|à\s+)?(?P<H>\d{1,2}):(?P<M>\d{2})(?::(?P<S>\d{2}))?"
    r"\s*(?P<ampm>[AaPp]\.?[Mm]\.?)?)?"
)

_PATTERNS: tuple[re.Pattern[str], ...] = (
    # 2019-06-29, 2019-06-29T14:03:00Z, 2019-06-29 14:03+08:00
    re.compile(
        r"(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})"
        r"(?:[T\s](?P<H>\d{1,2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:\.\d+)?)?"
        r"(?P<tz>Z|[+-]\d{2}:?\d{2})?)?"
    ),
    # 2018年1月11日 (optionally 14:03)
    re.compile(
        r"(?P<y>\d{4})\s*年\s*(?P<m>\d{1,2})\s*月\s*(?P<d>\d{1,2})\s*日?"
        r"(?:\s*(?P<H>\d{1,2})[:：](?P<M>\d{2}))?"
    ),
    # 一月 11, 2018 / 十二月 3, 2019 14:03 / 1月 11, 2018
    re.compile(
        rf"(?P<cnm>{_CN_MONTH}|\d{{1,2}})\s*月\s*(?P<d>\d{{1,2}})\s*[,，]?\s*(?P<y>\d{{4}}){_TIME}"
    ),
    # 23.02.2015 / 23.02.2015 14:03 (day first: the German/Russian convention)
    re.compile(r"(?<![\d.])(?P<d>\d{1,2})\.(?P<m>\d{1,2})\.(?P<y>\d{4})" + _TIME),
    # Jun 29, 2019 / Sept 08, 2021 14:03 / June 29 2019 at 2:03 PM
    re.compile(
        rf"(?<![^\W\d_])(?P<mon>{_MONTH_ALT})\.?\s+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?,?\s+(?P<y>\d{{4}})"
        + _TIME,
        re.IGNORECASE,
    ),
    # 26 Jul 2024 / 11. Januar 2018 / 3 déc. 2019
    re.compile(
        rf"(?<!\d)(?P<d>\d{{1,2}})\.?\s+(?P<mon>{_MONTH_ALT})\.?,?\s+(?P<y>\d{{4}})" + _TIME,
        re.IGNORECASE,
    ),
)


def _cn_month(token: str) -> int:
    if token.isdigit():
        return int(token)
    if len(token) == 2:  # 十一, 十二
        return 10 + _CN_DIGITS[token[1]]
    return _CN_DIGITS[token]


def _build(m: re.Match[str], default_tz: timezone) -> datetime | None:
    g = m.groupdict()
    try:
        if g.get("mon"):
            month = _MONTHS[g["mon"].lower()]
        elif g.get("cnm"):
            month = _cn_month(g["cnm"])
        else:
            month = int(g["m"])
        hour = int(g["H"]) if g.get("H") else 0
        minute = int(g["M"]) if g.get("M") else 0
        second = int(g["S"]) if g.get("S") else 0
        ampm = (g.get("ampm") or "").lower().replace(".", "")
        if ampm == "pm" and hour < 12:
            hour += 12
        elif ampm == "am" and hour == 12:
            hour = 0
        tz: timezone = default_tz
        raw_tz = g.get("tz")
        if raw_tz:
            if raw_tz == "Z":
                tz = UTC
            else:
                sign = 1 if raw_tz[0] == "+" else -1
                digits = raw_tz[1:].replace(":", "")
                tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
        return datetime(int(g["y"]), month, int(g["d"]), hour, minute, second, tzinfo=tz)
    except (KeyError, ValueError):
        return None  # e.g. 31.02.2015 or an unknown month word: not a date after all


def find_date(text: str, *, default_tz: timezone = UTC) -> datetime | None:
    """The last parseable date in ``text`` (tz-aware; ``default_tz`` when none is given)."""
    best: tuple[int, int, datetime] | None = None
    for pat in _PATTERNS:
        for m in pat.finditer(text):
            dt = _build(m, default_tz)
            if dt is None:
                continue
            key = (m.end(), m.end() - m.start())
            if best is None or key > best[:2]:
                best = (key[0], key[1], dt)
    return best[2] if best else None
