"""find_date / explain_no_date: the dates Confluence prints in ``div.page-metadata`` in the
exporting user's locale, both as bare shapes and inside the localized metadata sentence."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from context_core.ingest.dates import explain_no_date, find_date


def _d(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, tzinfo=UTC)


# --- each locale shape, bare ----------------------------------------------------------------

SHAPES = [
    # English
    ("Jun 29, 2019", _d(2019, 6, 29)),
    ("Sept 08, 2021 14:03", _d(2021, 9, 8, 14, 3)),
    ("June 29, 2019 at 2:03 PM", _d(2019, 6, 29, 14, 3)),
    ("June 29, 2019 at 12:15 AM", _d(2019, 6, 29, 0, 15)),
    ("Dec 12, 2024 10:01 PM", _d(2024, 12, 12, 22, 1)),
    # German
    ("11. Januar 2018", _d(2018, 1, 11)),
    ("11.01.2018", _d(2018, 1, 11)),
    ("11.01.2018 14:03", _d(2018, 1, 11, 14, 3)),
    ("3. Dez. 2019 um 16:45", _d(2019, 12, 3, 16, 45)),
    # Czech
    ("23.02.2015", _d(2015, 2, 23)),
    ("23. února 2015", _d(2015, 2, 23)),
    ("23. 2. 2015", _d(2015, 2, 23)),
    ("23. 2. 2015 14:03", _d(2015, 2, 23, 14, 3)),
    # Chinese
    ("一月 11, 2018", _d(2018, 1, 11)),
    ("十二月 3, 2019 14:03", _d(2019, 12, 3, 14, 3)),
    ("十一月 30, 2020", _d(2020, 11, 30)),
    ("2018年1月11日", _d(2018, 1, 11)),
    ("2018-01-11", _d(2018, 1, 11)),
    ("2018年1月11日 下午2:03", _d(2018, 1, 11, 14, 3)),
    # Japanese
    ("1月 11, 2018", _d(2018, 1, 11)),
    ("2018/01/11", _d(2018, 1, 11)),
    ("2018/1/11 14:03", _d(2018, 1, 11, 14, 3)),
    ("2018年1月11日 14:03", _d(2018, 1, 11, 14, 3)),
    ("2018年1月11日 午後 2:03", _d(2018, 1, 11, 14, 3)),
    # Korean
    ("1월 11, 2018", _d(2018, 1, 11)),
    ("2018. 1. 11.", _d(2018, 1, 11)),
    ("2018년 1월 11일", _d(2018, 1, 11)),
    ("2018. 01. 11 오후 2:03", _d(2018, 1, 11, 14, 3)),
    ("2018. 01. 11 오전 9:30", _d(2018, 1, 11, 9, 30)),
    ("2018. 01. 11 오전 12:10", _d(2018, 1, 11, 0, 10)),
    ("2018. 01. 11 오후 12:30", _d(2018, 1, 11, 12, 30)),
    # Russian
    ("11 января 2018 г.", _d(2018, 1, 11)),
    ("11 января 2018 г., 14:03", _d(2018, 1, 11, 14, 3)),
    ("11 янв. 2018", _d(2018, 1, 11)),
    # French / Spanish
    ("3 déc. 2019", _d(2019, 12, 3)),
    ("29 juin 2019 à 14:03", _d(2019, 6, 29, 14, 3)),
    ("29 de junio de 2019", _d(2019, 6, 29)),
    # ISO with time and zone
    ("2019-06-29T14:03:00Z", _d(2019, 6, 29, 14, 3)),
    (
        "2019-06-29 14:03+08:00",
        datetime(2019, 6, 29, 14, 3, tzinfo=timezone(timedelta(hours=8))),
    ),
]


@pytest.mark.parametrize(("text", "expected"), SHAPES, ids=[s for s, _ in SHAPES])
def test_locale_shapes(text: str, expected: datetime) -> None:
    got = find_date(text)
    assert got == expected
    assert got is not None and got.tzinfo is not None


# --- the full metadata sentence, as each locale prints it ------------------------------------

SENTENCES = [
    # English
    (
        "Created by Alice Smith, last modified by Bob Jones on Jun 29, 2019",
        _d(2019, 6, 29),
    ),
    ("Created by Alice Smith, last modified on Sept 08, 2021 14:03", _d(2021, 9, 8, 14, 3)),
    (
        "Created by Alice Smith, last modified by Bob Jones on June 29, 2019 at 2:03 PM",
        _d(2019, 6, 29, 14, 3),
    ),
    # German
    ("Erstellt von A, zuletzt geändert von B am 11. Januar 2018", _d(2018, 1, 11)),
    (
        "Erstellt von Anna Schmidt, zuletzt geändert von Bernd Müller am 11.01.2018",
        _d(2018, 1, 11),
    ),
    # Czech
    ("Vytvořil A, naposledy upravil B dne 23.02.2015", _d(2015, 2, 23)),
    ("Vytvořil Jan Novák, naposledy upravil Petr Svoboda dne 23. února 2015", _d(2015, 2, 23)),
    ("Vytvořil Jan Novák, naposledy upravil Petr Svoboda dne 23. 2. 2015", _d(2015, 2, 23)),
    # Chinese
    ("由 张三创建, 最后修改于 一月 11, 2018", _d(2018, 1, 11)),
    ("由 张三创建, 最后修改于 十二月 3, 2019 14:03", _d(2019, 12, 3, 14, 3)),
    ("由 张三创建，最后由 李四修改于 2018年1月11日", _d(2018, 1, 11)),
    ("由 张三创建, 最后修改于 2018-01-11", _d(2018, 1, 11)),
    # Japanese
    ("作成者 山田, 最終更新日 1月 11, 2018", _d(2018, 1, 11)),
    ("作成者 山田 太郎, 最終更新者 佐藤 花子 最終更新日 2018/01/11", _d(2018, 1, 11)),
    ("作成者 山田, 最終更新日 2018年1月11日 14:03", _d(2018, 1, 11, 14, 3)),
    # Korean
    ("작성자: 김철수, 최종 변경일: 1월 11, 2018", _d(2018, 1, 11)),
    ("작성자: 김철수, 최종 변경자: 이영희, 최종 변경일: 2018. 1. 11.", _d(2018, 1, 11)),
    ("작성자: 김철수, 최종 변경일: 2018년 1월 11일", _d(2018, 1, 11)),
    ("작성자: 김철수, 최종 변경일: 2018. 01. 11 오후 2:03", _d(2018, 1, 11, 14, 3)),
    # Russian
    (
        "Создал(а) Иван Петров, последнее изменение Анна Смирнова 11 января 2018 г.",
        _d(2018, 1, 11),
    ),
    # French / Spanish
    ("Créé par A, dernière modification par B le 3 déc. 2019", _d(2019, 12, 3)),
    ("Creado por A, modificado por última vez por B el 29 de junio de 2019", _d(2019, 6, 29)),
]


@pytest.mark.parametrize(("text", "expected"), SENTENCES, ids=[s for s, _ in SENTENCES])
def test_metadata_sentences(text: str, expected: datetime) -> None:
    assert find_date(text) == expected


# --- month words ------------------------------------------------------------------------------

CZECH_GENITIVE = (
    "ledna února března dubna května června července srpna září října listopadu prosince"
)
CZECH_NOMINATIVE = (
    "leden únor březen duben květen červen červenec srpen září říjen listopad prosinec"
)
RUSSIAN_GENITIVE = (
    "января февраля марта апреля мая июня июля августа сентября октября ноября декабря"
)
CN_MONTHS = "一 二 三 四 五 六 七 八 九 十 十一 十二"


@pytest.mark.parametrize(
    "words", [CZECH_GENITIVE, CZECH_NOMINATIVE], ids=["genitive", "nominative"]
)
@pytest.mark.parametrize("month", range(1, 13))
def test_czech_month_names(words: str, month: int) -> None:
    name = words.split()[month - 1]
    text = f"Vytvořil A, naposledy upravil B dne 5. {name} 2015"
    assert find_date(text) == _d(2015, month, 5)


@pytest.mark.parametrize("month", range(1, 13))
def test_russian_month_names(month: int) -> None:
    name = RUSSIAN_GENITIVE.split()[month - 1]
    assert find_date(f"изменено 7 {name} 2018 г.") == _d(2018, month, 7)


@pytest.mark.parametrize("month", range(1, 13))
def test_chinese_and_korean_months(month: int) -> None:
    cn = CN_MONTHS.split()[month - 1]
    assert find_date(f"最后修改于 {cn}月 9, 2019") == _d(2019, month, 9)
    assert find_date(f"최종 변경일: {month}월 9, 2019") == _d(2019, month, 9)


# --- the contract: last date wins, invalid dates are not dates, None when nothing parses -----


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Erstellt von A am 1. Januar 2017, zuletzt geändert von B am 11.01.2018", _d(2018, 1, 11)),
        ("2018/01/11 … Jun 29, 2019", _d(2019, 6, 29)),
        ("Jun 29, 2019 … 2018/01/11", _d(2018, 1, 11)),
        ("Created by A on Jun 29, 2019, last modified by B on 31.02.2015", _d(2019, 6, 29)),
        ("Jun 29, 2019 25:70", _d(2019, 6, 29)),  # nonsense time: keep the day
        ("Jun  29,\n 2019", _d(2019, 6, 29)),  # whitespace runs and line breaks
    ],
)
def test_last_valid_date_wins(text: str, expected: datetime) -> None:
    assert find_date(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "31.02.2015",
        "30. února 2015",
        "2018年2月30日",
        "2019-02-29",
        "二月 30, 2018",
        "十三月 1, 2018",
        "13월 1, 2018",
        "2018. 2. 30.",
        "Feb 30, 2018",
        "32 января 2018 г.",
        "2018/13/01",
        "on 06/29/2019",  # ambiguous M/D vs D/M: refuse rather than guess
        "no date here",
        "Created by A",
        "",
        "12345-01-11",
        "2018年",
    ],
)
def test_not_a_date(text: str) -> None:
    assert find_date(text) is None


def test_default_tz() -> None:
    tz = timezone(timedelta(hours=9))
    assert find_date("2018年1月11日 14:03", default_tz=tz) == datetime(
        2018, 1, 11, 14, 3, tzinfo=tz
    )


# --- explain_no_date --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "metadata has no text"),
        ("   \n ", "metadata has no text"),
        ("Created by A", "no date in metadata 'Created by A'"),
        ("Build 12, 2019", "no date in metadata 'Build 12, 2019'"),
        ("Version 3 Beta 2019", "no date in metadata 'Version 3 Beta 2019'"),
        (
            "Created by A, last modified by B on 31.02.2015",
            "invalid date '31.02.2015' "
            "in metadata 'Created by A, last modified by B on 31.02.2015'",
        ),
        (
            "Created by A on 06/29/2019",
            "ambiguous date '06/29/2019' (day/month order unknown) "
            "in metadata 'Created by A on 06/29/2019'",
        ),
    ],
)
def test_explain_no_date(text: str, expected: str) -> None:
    assert explain_no_date(text) == expected


def test_explain_no_date_when_there_is_one_and_long_text() -> None:
    assert explain_no_date("on Jun 29, 2019") == (
        "metadata has a date (2019-06-29T00:00:00+00:00) in 'on Jun 29, 2019'"
    )
    reason = explain_no_date("x" * 500)
    assert reason.startswith("no date in metadata 'xxx") and len(reason) < 160


# --- no catastrophic backtracking -------------------------------------------------------------


def _fill(unit: str, size: int = 200_000) -> str:
    return unit * (size // len(unit) + 1)


ADVERSARIAL = [
    _fill("1. "),
    _fill("2018年"),
    _fill("一月 "),
    _fill("1월 11, "),
    _fill("11.01."),
    _fill("2018. 1. "),
    _fill("1."),
    _fill("1"),
    "1" + " " * 200_000 + "x",
    _fill("Jun 29, "),
    _fill("12:"),
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=[repr(t[:9]) for t in ADVERSARIAL])
def test_adversarial_input_is_linear(text: str) -> None:
    """~200 KB strings built to make a backtracking pattern go quadratic or worse. Each must
    come back with the right answer (the date at the very end: the whole text was scanned)
    well inside the generous bound; a catastrophic pattern would take minutes."""
    assert len(text) >= 200_000
    start = time.perf_counter()
    assert find_date(text + " zuletzt geändert am 23.02.2015") == _d(2015, 2, 23)
    assert time.perf_counter() - start < 2.0
