"""The user_correction detection rule (context_core.lifecycle.corrections): a table of messages.

Rule: negation/correction cue + a value contradicting the contract + confidence > 0.6.
Pure functions, no servers.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest

from context_core.lifecycle.correction_cues import CJK_NON_VALUES, NON_VALUES
from context_core.lifecycle.corrections import DEFAULT_MIN_CONFIDENCE, Correction, detect_correction

CONTRACT: dict[str, Any] = {
    "goal": "Why is PUMP-0042 vibrating? Keep the report under 1 page.",
    "device": "PUMP-0042",
    "max_pages": 1,
    "format": "pdf",
    "budget_eur": 1200,
    "distance_km": 2.0,
    "limit": 3,
}

# message -> the fields the rule must detect
POSITIVE: list[tuple[str, dict[str, Any]]] = [
    ("Not PUMP-0042 but PUMP-0043", {"device": "PUMP-0043"}),
    ("no no, it is not PUMP-0042, it's PUMP-0043!", {"device": "PUMP-0043"}),
    ("No, use PUMP-0043", {"device": "PUMP-0043"}),
    ("Nope — PUMP-0043.", {"device": "PUMP-0043"}),
    ("PUMP-0042 is wrong, it should be PUMP-0043", {"device": "PUMP-0043"}),
    ("max pages should be 2", {"max_pages": 2}),
    ("The max_pages should be 2 pages.", {"max_pages": 2}),
    ("the max-pages must be 3", {"max_pages": 3}),
    ("I meant PUMP-0043", {"device": "PUMP-0043"}),
    ("I meant 3 pages", {"max_pages": 3}),
    ("Use 2 pages instead of 1", {"max_pages": 2}),
    ("The report should be 3 pages long", {"max_pages": 3}),
    ("Actually, the device is PUMP-0043", {"device": "PUMP-0043"}),
    ("the format should be docx", {"format": "docx"}),
    ("not pdf but docx", {"format": "docx"}),
    ("device: PUMP-0043, not PUMP-0042", {"device": "PUMP-0043"}),
    ("don't use PUMP-0042, use PUMP-0043", {"device": "PUMP-0043"}),
    ("change the device to PUMP-0043 please", {"device": "PUMP-0043"}),
    ("The limit is 5, not 3", {"limit": 5}),
    ("limit: 5 not 3", {"limit": 5}),
    ("set limit to 4", {"limit": 4}),
    ("the budget should be 1,500 EUR", {"budget_eur": 1500}),
    ("the budget is 1,500 EUR, not 1,200", {"budget_eur": 1500}),
    ("the distance should be 2.5 km", {"distance_km": 2.5}),
    ("不是PUMP-0042，是PUMP-0043", {"device": "PUMP-0043"}),
    ("不是1页是2页", {"max_pages": 2}),
    ("应该是PUMP-0043", {"device": "PUMP-0043"}),
    ("改成2页", {"max_pages": 2}),
    ("max_pages改成3", {"max_pages": 3}),
    ("不对，应该是三页", {"max_pages": 3}),
    ("不用PUMP-0042，用PUMP-0043吧", {"device": "PUMP-0043"}),
    ("PUMP-0042不对，应该是PUMP-0043", {"device": "PUMP-0043"}),
    ("我是说PUMP-0043", {"device": "PUMP-0043"}),
]

NEGATIVE: list[str] = [
    "not sure which pump it is",
    "no problem, thanks!",
    "don't forget the limit is 5",
    "Is the device PUMP-0043?",
    "Not PUMP-0042 but PUMP-0043?",  # a question, not a correction
    "Shouldn't the limit be 5?",
    "Maybe the device should be PUMP-0043",  # hedged
    "I'm not sure the device should be PUMP-0043",
    "It should be PUMP-0042",  # agrees with the contract
    "No, PUMP-0042 is right",
    "not 1 page but 1 page",
    "No, 2 of them failed",  # a number, but no value of the contract
    "No, thanks",
    "the device is PUMP-0043",  # no negation or correction cue
    "I can't find PUMP-0043",
    "The pump is not vibrating anymore",
    "limit 5 is not enough",
    "the budget is 1,500, not enough",
    "update the summary to mention PUMP-0043",
    "That's not what I asked",  # a negation, but no value
    "Why not use PUMP-0043?",
    "Not bad, PUMP-0043 looks fine",
    "the deadline should be friday",  # not a field of the contract: nothing to contradict
    "不是很确定是哪个泵",
    "没问题，谢谢",
    "别忘了上限是5页",
    "应该是PUMP-0042吧",  # agrees
    "可能应该是PUMP-0043",  # hedged
    "",
]

# Contracts whose fields are plain words, numbers with units, and Chinese.
UNIT: dict[str, Any] = {"unit": "celsius", "goal": "check pump vibration"}
PRESSURE: dict[str, Any] = {**UNIT, "pressure_bar": 5}
ZH: dict[str, Any] = {"unit": "摄氏度", "goal": "检查泵振动"}
F = {"unit": "fahrenheit"}

# (contract, message, the exact fields written)
MORE_POSITIVE: list[tuple[dict[str, Any], str, dict[str, Any]]] = [
    # the new value is never the negation or filler before it ("No", "Unit", "the")
    (UNIT, "No, not celsius - the unit should be fahrenheit.", F),
    (UNIT, "No, not celsius, use fahrenheit", F),
    (UNIT, "No. Unit: fahrenheit", F),
    (UNIT, "No, the unit is fahrenheit not celsius", F),
    (UNIT, "No. Unit = fahrenheit", F),
    (UNIT, "No, I want fahrenheit", F),
    (UNIT, "No no no, fahrenheit!", F),  # a word of the same kind as "celsius"
    (UNIT, "nope — fahrenheit", F),
    (UNIT, "wrong unit, it's fahrenheit", F),
    (UNIT, "I said fahrenheit, not celsius", F),
    (UNIT, "Fahrenheit. Not Celsius.", F),  # case follows the contract's value
    (UNIT, "NOT CELSIUS, FAHRENHEIT!", F),
    (UNIT, "Celsius is wrong, use Fahrenheit", F),
    (UNIT, "not Celsius but Fahrenheit", F),
    (UNIT, "use fahrenheit instead of celsius", F),
    (UNIT, "set the unit to fahrenheit please", F),
    (UNIT, "don't use celsius, use fahrenheit", F),
    (UNIT, "unit: fahrenheit, not celsius", F),
    (UNIT, "fahrenheit, not celsius, for the report", F),
    (UNIT, "the goal should be check the fan, not the pump", {"goal": "check the fan"}),
    (UNIT, "Not celsius. Fahrenheit.", F),
    (UNIT, "unit: celsius -> fahrenheit", F),
    (UNIT, "Change unit from celsius to fahrenheit", F),
    (UNIT, "not in celsius, in fahrenheit", F),
    (UNIT, "No, use fahrenheit and don't use celsius", F),
    (CONTRACT, "No, use pump-0043", {"device": "PUMP-0043"}),  # case follows the contract
    # conflicting claims on one field: naming the field or both sides beats a bare "no, Y"
    (UNIT, "No, kelvin. Actually the unit should be fahrenheit", F),
    (UNIT, "the unit should be fahrenheit, no, kelvin", F),
    (UNIT, "not celsius but fahrenheit, not celsius but kelvin", {"unit": "kelvin"}),  # later
    # numbers with units, several fields
    (PRESSURE, "not 5 bar, 7 bar", {"pressure_bar": 7}),
    (PRESSURE, "pressure 7 bar, not 5 bar", {"pressure_bar": 7}),
    (PRESSURE, "No, the pressure should be 7 bar, not 5", {"pressure_bar": 7}),
    (PRESSURE, "no, 7 bar", {"pressure_bar": 7}),
    (PRESSURE, "pressure: 7 (not 5)", {"pressure_bar": 7}),
    (PRESSURE, "The pressure is 7 bar, not 5 bar.", {"pressure_bar": 7}),
    (PRESSURE, "no: unit fahrenheit and pressure 7 bar", {**F, "pressure_bar": 7}),
    # Chinese: the field named in Chinese (单位 -> unit), or by the old value, or by kind
    (UNIT, "不是摄氏度，单位应该是华氏度", {"unit": "华氏度"}),
    (ZH, "不是摄氏度，单位应该是华氏度", {"unit": "华氏度"}),
    (ZH, "单位改成华氏度", {"unit": "华氏度"}),
    (ZH, "改成华氏度", {"unit": "华氏度"}),
    (ZH, "不是摄氏度，是华氏度", {"unit": "华氏度"}),
    (ZH, "摄氏度不对，应该是华氏度", {"unit": "华氏度"}),
    (ZH, "不对，用华氏度", {"unit": "华氏度"}),
]

# (contract, message) that must not be detected
MORE_NEGATIVE: list[tuple[dict[str, Any], str]] = [
    (UNIT, "no problem, celsius is fine"),
    (UNIT, "not sure if celsius is right?"),
    (UNIT, "don't forget: unit is celsius"),
    (UNIT, "No, thanks"),
    (UNIT, "that's not bad"),
    (UNIT, "No, the"),
    (UNIT, "no, it is"),
    (UNIT, "No, unit"),  # a field name is no value
    (UNIT, "nope, nope, nope"),
    (UNIT, "No! Stop!"),
    (UNIT, "No, celsius is right"),  # agrees
    (UNIT, "Celsius, not fahrenheit"),  # agrees
    (UNIT, "the unit is not fahrenheit"),
    (UNIT, "Is the unit fahrenheit?"),
    (UNIT, "Not celsius?"),
    (UNIT, "not celsius, that's too cold"),  # two words, neither a unit
    (UNIT, "not celsius but it's too cold"),
    (UNIT, "No, fahrenheit or kelvin"),
    (UNIT, "not only celsius but also fahrenheit"),
    (UNIT, "maybe fahrenheit instead of celsius"),  # hedged
    (UNIT, "I don't know. The unit is fahrenheit"),
    (UNIT, "no, no, the unit is fine"),
    (UNIT, "No, unit tests fail"),
    (UNIT, "No, the unit conversion is wrong"),
    (UNIT, "No, the goal is clear"),  # free text needs more than a bare "no"
    (UNIT, "no worries, use fahrenheit if you like"),
    (UNIT, "No, fahrenheit... wait, no: the unit is celsius"),  # the named claim agrees
    (UNIT, "不对"),
    (UNIT, "No, don't use fahrenheit"),  # the value is the negated one
    (UNIT, "Please do not use fahrenheit"),
    (UNIT, "No, never fahrenheit"),
    (UNIT, "kelvin -> fahrenheit"),  # "X -> Y" needs X to be the contract's value
    (UNIT, "Not now. Later maybe"),
    (ZH, "不要用华氏度"),
    (PRESSURE, "not 2.5 bar. 3 bar"),
    (PRESSURE, "No, the pressure 7 bar is not enough"),
    (PRESSURE, "not 5 bar, it's 5 bar"),
    (PRESSURE, "no, 5 or 7 bar"),
    (ZH, "没问题，摄氏度就好"),
    (ZH, "不是很确定单位是不是摄氏度"),
    (ZH, "别忘了单位是摄氏度"),
    (ZH, "不是，谢谢"),
]


@pytest.mark.parametrize(("text", "fields"), POSITIVE)
def test_corrections_are_detected_with_typed_values(text: str, fields: dict[str, Any]) -> None:
    c = detect_correction(text, CONTRACT)
    assert c.detected, c.reasons
    assert c.fields == fields, c.reasons
    for k, v in fields.items():
        assert type(c.fields[k]) is type(v)  # typed like the old value (int stays int)
    assert DEFAULT_MIN_CONFIDENCE < c.confidence <= 1.0
    assert c.reasons


@pytest.mark.parametrize("text", NEGATIVE)
def test_non_corrections_are_not_detected(text: str) -> None:
    c = detect_correction(text, CONTRACT)
    assert not c.detected, c.reasons
    assert c.fields == {}
    assert 0.0 <= c.confidence <= DEFAULT_MIN_CONFIDENCE


@pytest.mark.parametrize(("contract", "text", "fields"), MORE_POSITIVE)
def test_more_corrections_write_exactly_these_fields(
    contract: dict[str, Any], text: str, fields: dict[str, Any]
) -> None:
    c = detect_correction(text, contract)
    assert c.detected, c.reasons
    assert c.fields == fields, c.reasons
    for k, v in fields.items():
        assert type(c.fields[k]) is type(v)
    assert DEFAULT_MIN_CONFIDENCE < c.confidence <= 1.0


@pytest.mark.parametrize(("contract", "text"), MORE_NEGATIVE)
def test_more_non_corrections_are_not_detected(contract: dict[str, Any], text: str) -> None:
    c = detect_correction(text, contract)
    assert not c.detected, c.reasons
    assert c.fields == {}


_CANDIDATE = re.compile(r" -> ('.*'|\".*\"|-?[\d.]+) \([\d.]+\)$")  # "... -> 'value' (0.9)"


def test_no_candidate_is_a_cue_word_filler_or_field_name() -> None:
    """Every value the rule weighed, on every message of the tables, is a value: never
    "No", "the", "it", 不是, ..., nor a field's name."""
    rows = [(CONTRACT, t) for t, _ in POSITIVE] + [(CONTRACT, t) for t in NEGATIVE]
    rows += [(c, t) for c, t, _ in MORE_POSITIVE] + list(MORE_NEGATIVE)
    seen = 0
    for contract, text in rows:
        for reason in detect_correction(text, contract).reasons:
            if m := _CANDIDATE.search(reason):
                value = ast.literal_eval(m.group(1))
                seen += 1
                if isinstance(value, str):
                    assert value.strip(), (text, reason)
                    assert value.lower() not in NON_VALUES, (text, reason)
                    assert value not in CJK_NON_VALUES, (text, reason)
                    assert value.lower() not in {k.lower() for k in contract}, (text, reason)
    assert seen >= len(POSITIVE) + len(MORE_POSITIVE)


def test_table_is_large_enough() -> None:
    assert len(POSITIVE) >= 25 and len(NEGATIVE) >= 25
    assert len(MORE_POSITIVE) >= 30 and len(MORE_NEGATIVE) >= 30


def test_weak_evidence_by_kind_sits_just_above_the_threshold() -> None:
    # "no, Y" (0.35) + a value of the same kind as the field's (0.2) + negation (0.1)
    c = detect_correction("No no no, fahrenheit!", UNIT)
    assert c.fields == F and c.confidence == pytest.approx(0.65)
    assert not detect_correction("No no no, fahrenheit!", UNIT, min_confidence=0.7).detected
    # two fields of that kind: no guess
    two = {"unit_in": "celsius", "unit_out": "kelvin"}
    assert not detect_correction("no, fahrenheit", two).detected
    assert detect_correction("not kelvin but fahrenheit", two).fields == {"unit_out": "fahrenheit"}


def test_a_64_kb_message_is_read_without_blowing_up() -> None:
    """Long inputs are read in linear time (cue windows are bounded and only the first and
    last cues of a message full of them are read); this asserts the results only."""
    size = 64 * 1024
    noise = ("no, " * (size // 4))[:size]
    assert not detect_correction(noise, PRESSURE).detected
    assert not detect_correction(("not " * (size // 4))[:size], PRESSURE).detected
    assert not detect_correction("不是" * (size // 2), ZH).detected
    assert not detect_correction("no " + "unit " * (size // 5), PRESSURE).detected
    assert not detect_correction("a" * size, PRESSURE).detected
    tail = "not celsius but fahrenheit"
    late = noise[: size - len(tail) - 2] + ". " + tail
    assert len(late) == size
    assert detect_correction(late, PRESSURE).fields == F
    words = ("the pump vibrates at 5 bar and " * (size // 31 + 1))[: size - 40]
    assert detect_correction(words + ". No, the unit should be fahrenheit", UNIT).fields == F


def test_threshold_decides_weakly_supported_claims() -> None:
    # "I meant PUMP-0043": correction cue + the value's shape only -> 0.65
    c = detect_correction("I meant PUMP-0043", CONTRACT)
    assert c.detected and c.confidence == pytest.approx(0.65)
    strict = detect_correction("I meant PUMP-0043", CONTRACT, min_confidence=0.8)
    assert not strict.detected and strict.fields == {}
    assert strict.confidence == pytest.approx(0.65)
    assert any("not above 0.8" in r for r in strict.reasons)
    # stating the old value is strong evidence
    assert detect_correction("not PUMP-0042 but PUMP-0043", CONTRACT).confidence >= 0.85


def test_ambiguous_shape_is_not_guessed() -> None:
    two_pumps = {"device": "PUMP-0042", "spare": "PUMP-0099"}
    assert not detect_correction("I meant PUMP-0043", two_pumps).detected
    named = detect_correction("the spare should be PUMP-0043", two_pumps)
    assert named.fields == {"spare": "PUMP-0043"}
    old = detect_correction("not PUMP-0099 but PUMP-0043", two_pumps)
    assert old.fields == {"spare": "PUMP-0043"}
    two_numbers = {"max_pages": 1, "limit": 3}
    assert not detect_correction("no, 5", two_numbers).detected
    assert detect_correction("no, 5", {"limit": 3}).fields == {"limit": 5}


def test_field_names_with_spaces_underscores_and_camel_case() -> None:
    contract = {"maxPages": 1, "report language": "en", "due_date": "friday"}
    assert detect_correction("max pages should be 4", contract).fields == {"maxPages": 4}
    assert detect_correction("report_language should be zh", contract).fields == {
        "report language": "zh"
    }
    assert detect_correction("the due date should be monday", contract).fields == {
        "due_date": "monday"
    }


def test_float_fields_stay_float_and_free_text_needs_a_name() -> None:
    contract = {"threshold": 4.5, "goal": "check the pump"}
    assert detect_correction("threshold should be 5", contract).fields == {"threshold": 5.0}
    assert isinstance(
        detect_correction("threshold should be 5", contract).fields["threshold"], float
    )
    goal = detect_correction("the goal should be check the fan", contract)
    assert goal.fields == {"goal": "check the fan"}
    assert not detect_correction("no, check the fan", contract).detected  # not named


def test_several_fields_in_one_message() -> None:
    c = detect_correction("not PUMP-0042 but PUMP-0043, and max pages should be 2", CONTRACT)
    assert c.fields == {"device": "PUMP-0043", "max_pages": 2}


def test_no_contract_or_no_text() -> None:
    assert detect_correction("not 1 but 2", {}) == Correction(
        False, 0.0, {}, ("no text, or no contract to correct",)
    )
    c = detect_correction("   ", CONTRACT)
    assert not c.detected and c.to_dict()["detected"] is False
    assert detect_correction("hello", CONTRACT).reasons == ("no negation or correction cue",)


def test_to_dict_is_plain_json() -> None:
    import json

    d = detect_correction("Not PUMP-0042 but PUMP-0043", CONTRACT).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) == {"detected", "confidence", "fields", "reasons"}
