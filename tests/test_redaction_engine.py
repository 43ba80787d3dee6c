"""The redaction patterns check this interpreter's ``re`` engine at import, not its version.

CPython 3.11.0-3.11.4 lose a group's backreference state under a possessive repeat; on Debian
12's 3.11.2 that let the escaped value of ``esc {\\"password\\": \\"...\\"}`` through the
gateway. The patterns now use an atomic group there, and the import refuses an interpreter
whose engine answers any probe or canary wrongly, naming which.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from context_core.gateway import patterns as redaction_patterns
from context_core.gateway import redaction
from context_core.gateway.patterns import EngineSelfTestError, check_engine
from context_core.gateway.sanitize import REDACTED, Gateway

ROOT = Path(__file__).resolve().parents[1]
_PATTERNS = "context_core/gateway/patterns.py"


def test_this_interpreter_passes_every_probe() -> None:
    check_engine()  # the import did too; this names the probe if it ever stops passing
    redaction._self_test()


def test_a_wrong_answer_is_refused_naming_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    # an expectation no correct engine meets stands in for an engine that answers wrongly
    wrong = (("a probe that cannot hold", r"ab", "xaby", "zz"),)
    monkeypatch.setattr(redaction_patterns, "_ENGINE_PROBES", wrong)
    with pytest.raises(EngineSelfTestError, match=r"a probe that cannot hold.*another CPython"):
        check_engine()


def test_a_rule_that_keeps_a_canary_secret_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "redact_text", lambda text: (text, []))
    with pytest.raises(EngineSelfTestError, match="secret kept"):
        redaction._self_test()


def test_the_escaped_value_uses_an_atomic_group_and_is_redacted() -> None:
    """The construct 3.11.2 got wrong is gone from VALUE_RX, and the case it broke passes."""
    assert r"){0,4096}+(?P=eq)" not in redaction_patterns.VALUE_RX.pattern
    assert "(?>" in redaction_patterns.VALUE_RX.pattern
    secret = "s3cr3t" + "Xy9"
    text = 'esc {\\"password\\": \\"' + secret + '\\"}'
    out = Gateway().clean_text(text, where="t")
    assert secret not in out
    assert out == 'esc {\\"password\\": \\"' + REDACTED + '\\"}'


def test_probes_are_what_the_patterns_use() -> None:
    """Every probe compiles and gives its expected answer on the interpreter running CI."""
    for what, pattern, text, expected in redaction_patterns._ENGINE_PROBES:
        assert what
        m = re.compile(pattern).search(text)
        assert (m.group(0) if m else None) == expected, what


def test_make_accepts_an_interpreter_by_the_probe() -> None:
    """The Makefile's interpreter check runs the patterns module: it passes here, and the
    module it runs is the one with the probes (a missing file would fail the check)."""
    res = subprocess.run(
        [sys.executable, "-c", f"import runpy; runpy.run_path({_PATTERNS!r})"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert 'runpy.run_path("context_core/gateway/patterns.py")' in makefile
