"""The redaction rule table: every rule's pre-check accepts whatever its pattern matches.

A pre-check is the cheap test that decides whether a pattern runs at all; one that rejects
some of its own pattern's matches switches the rule off for those texts, silently. Here each
rule's pattern generates its own matches (``from_regex``), embedded in random text, and the
rule's pre-check must accept the folded text wherever the pattern finds a match in it; when
the rule's handler takes the match (a card passing Luhn, a bearer token that looks random),
the gateway must remove the value. The key=value families get the same treatment with their
stems as the pre-check.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_core.gateway.patterns import (
    ASSIGN_RXS,
    REDACTED,
    fix_surrogates,
    fold_text,
    is_secret_key,
)
from context_core.gateway.redaction import _families, _key_start
from context_core.gateway.rules import RULES, Rule, RuleTableError, build_rules
from context_core.gateway.sanitize import Gateway

# These patterns look behind their anchor ("://" needs a scheme character before it, "@" a
# local-part character), which a generated full match cannot have: they generate text that
# *contains* a match instead.
_SEARCH_ONLY = {"url_credentials", "email"}
# These are anchored on an inner literal with a lookbehind for what precedes it (the handler
# extends the span back): hypothesis cannot generate their matches; tests/test_secret_kinds.py
# checks them on built samples instead.
_INNER_ANCHORED = {"openai_key", "mailchimp_key", "telegram_bot_token", "discord_token"}
_GW = Gateway()
_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
_around = st.text(max_size=24)
_sep = st.sampled_from(["", " ", "\n", ", ", "; "])


def _embedded(rx: re.Pattern[str], fullmatch: bool) -> st.SearchStrategy[tuple[str, int, str]]:
    """(text, where the generated piece starts, the piece): a match with random text around."""

    def build(parts: tuple[str, str, str, str, str]) -> tuple[str, int, str]:
        before, sep1, piece, sep2, after = parts
        head = before + sep1
        return head + piece + sep2 + after, len(head), piece

    return st.tuples(_around, _sep, st.from_regex(rx, fullmatch=fullmatch), _sep, _around).map(
        build
    )


def _check_rule(rule: Rule, text: str, *, gateway: bool = True) -> None:
    """The property for one text: pre-check accepts every match; the gateway removes what the
    rule's handler would remove (``gateway``: for a rule of the gateway's own table)."""
    fold = fold_text(fix_surrogates(text))
    for rx in (rule.rx, rule.dense_rx):
        if rx is not None and rx.search(fold) is not None:
            assert rule.precheck(fold), (
                f"rule {rule.name!r}: its pre-check rejects text its pattern matches: {fold!r}"
            )
    m = rule.rx.search(fold)
    if m is None or not gateway:
        return  # the surrounding text broke the match (a glued letter, a lookbehind)
    edit = rule.handle(m, fold, rule.kind)
    if edit is None:
        return  # a lookalike the rule leaves alone by design (Luhn, checksum, prose)
    assert edit[3] == rule.kind
    found = fold[edit[0] : edit[1]]  # what the rule replaces (a mask keeps some of it)
    # the placeholder's own letters are not a leak ("A" of a "user:A@" password); it becomes
    # a control character the found value does not hold (hypothesis found a NUL password)
    mark = next(c for c in "\0\1\2\3" if c not in found)
    cleaned = fold_text(_GW.clean_text(text, where="test_redaction_rules")).replace(REDACTED, mark)
    assert cleaned.count(found) < fold.count(found), (
        f"rule {rule.name!r}: the gateway left {found!r} in {cleaned!r}"
    )


def _holds(rule: Rule, *, gateway: bool = True) -> None:
    """Run the property for ``rule`` (raises the falsifying AssertionError)."""

    @_SETTINGS
    @given(case=_embedded(rule.rx, fullmatch=rule.name not in _SEARCH_ONLY))
    def prop(case: tuple[str, int, str]) -> None:
        _check_rule(rule, case[0], gateway=gateway)

    prop()


@pytest.mark.parametrize(
    "rule",
    [r for r in RULES if r.name not in _INNER_ANCHORED],
    ids=[r.name for r in RULES if r.name not in _INNER_ANCHORED],
)
def test_every_rule_precheck_accepts_its_matches_and_the_gateway_redacts(rule: Rule) -> None:
    _holds(rule)


def test_a_control_character_password_is_redacted_and_not_mistaken_for_the_placeholder() -> None:
    """A case hypothesis found: the password is one NUL, the character the check used to put
    where the placeholder was; the gateway had redacted it, the check counted its own mark."""
    (rule,) = [r for r in RULES if r.name == "url_credentials"]
    _check_rule(rule, "://0://:\x00@")
    assert "\x00" not in _GW.clean_text("://0://:\x00@", where="test_redaction_rules")


@pytest.mark.parametrize(
    ("stems", "rx"), ASSIGN_RXS, ids=["/".join(stems) for stems, _rx in ASSIGN_RXS]
)
def test_every_key_family_is_selected_by_its_stems_and_its_values_redacted(
    stems: tuple[str, ...], rx: re.Pattern[str]
) -> None:
    value = "Vq7x3Kp9Zt"

    @_SETTINGS
    @given(case=_embedded(rx, fullmatch=True))
    def prop(case: tuple[str, int, str]) -> None:
        text, at, piece = case
        text = text[: at + len(piece)] + value + text[at + len(piece) :]
        fold = fold_text(fix_surrogates(text))
        m = rx.search(fold)
        if m is None:
            return
        assert rx in _families(fold.lower()), f"stems {stems} reject a match of their family"
        if m.span() != (at, at + len(piece)):
            return  # an earlier match in the random text: the family ran, that is the point
        ks = _key_start(fold, m.start())
        if ks is None or not is_secret_key(fold[ks : m.start("kq")]):
            return  # the anchor is a prefilter; is_secret_key decides
        cleaned = fold_text(_GW.clean_text(text, where="test_redaction_rules"))
        assert value not in cleaned, f"secret key {fold[ks : m.end()]!r}: value kept"

    prop()


# --- the table refuses rules that could never run -------------------------------------------


def _handler(m: re.Match[str], _f: str, kind: str):
    return m.start(), m.end(), (REDACTED,), kind, m.group(0)


def test_a_rule_without_a_precheck_is_refused_when_the_table_is_built() -> None:
    rx = re.compile(r"zq_[0-9]{8}")
    with pytest.raises(RuleTableError, match="pre-check"):
        Rule("no_precheck", rx, _handler, "secret_value", "credential")
    with pytest.raises(RuleTableError, match="pre-check"):
        Rule("two_prechecks", rx, _handler, "secret_value", "credential", needle="zq_", digits=8)
    with pytest.raises(RuleTableError, match="one character"):
        Rule("bad_quick", rx, _handler, "secret_value", "credential", needle="zq_", quick="zq")
    ok = Rule("zq_token", rx, _handler, "secret_value", "credential", needle="zq_")
    assert ok.quick == "_" and ok.precheck("x zq_12345678") and not ok.precheck("zq 12345678")
    with pytest.raises(RuleTableError, match="named twice"):
        build_rules([ok, ok])


def test_a_precheck_that_rejects_its_own_matches_is_caught_by_the_property() -> None:
    # The needle is a typo of the pattern's literal: the rule would never run.
    typo = Rule(
        "typo_needle",
        re.compile(r"zq_[0-9]{8}"),
        _handler,
        "secret_value",
        "credential",
        needle="qz_",
    )
    with pytest.raises(AssertionError, match="pre-check rejects"):
        _holds(typo, gateway=False)
    # Case-insensitive pattern, case-sensitive needle: misses "ZQ_...".
    cased = Rule(
        "cased_needle",
        re.compile(r"[zZ][qQ]_[0-9]{8}"),
        _handler,
        "secret_value",
        "credential",
        needle="zq_",
    )
    with pytest.raises(AssertionError, match="pre-check rejects"):
        _holds(cased, gateway=False)


def test_the_table_names_each_rule_once_and_reports_known_kinds() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert {r.kind for r in RULES} == {
        "secret_value",
        "pii_id",
        "pii_card",
        "pii_phone",
        "pii_email",
    }
    # pipeline order the behaviour depends on: PEM first, ID before card
    assert names[0] == "pem_private_key"
    assert names.index("id_number") < names.index("card_number") < names.index("mobile_number")


@_SETTINGS
@given(
    parts=st.lists(
        st.sampled_from(
            [
                *sorted({s for stems, _rx in ASSIGN_RXS for s in stems}),
                *("key", "pass", "ecret", "wm:{s-1}:", "=", ":", "_", "密", "x"),
            ]
        ),
        max_size=6,
    )
)
def test_the_any_stem_gate_selects_the_same_families_as_the_per_stem_loop(
    parts: list[str],
) -> None:
    """``_families`` first asks one alternation of every stem whether any stem is there; the
    answer must equal the per-stem loop's (overlapping stems such as "passecret" included)."""
    from context_core.gateway.redaction import _families_by_stem

    lower = "".join(parts).lower()
    assert _families(lower) == _families_by_stem(lower)


@pytest.mark.parametrize("stem", sorted({s for stems, _rx in ASSIGN_RXS for s in stems}))
def test_the_any_stem_gate_passes_every_stem_alone(stem: str) -> None:
    """Each stem on its own, and beside "key" (the keyed stems count only then), reaches the
    per-stem loop: a gate missing one stem would switch its family off."""
    from context_core.gateway.redaction import _families_by_stem

    keyed = f"{stem}_key: 1"
    assert _families_by_stem(keyed), f"no family for {keyed!r}"
    for lower in (f"x {stem}=1", keyed, "a:" * 2048 + keyed):  # the last one past the gate
        assert _families(lower) == _families_by_stem(lower), lower
