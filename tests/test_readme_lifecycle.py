"""The README's lifecycle table is the code's: one row per event, rendered from EFFECTS."""

from __future__ import annotations

from pathlib import Path

from context_core.lifecycle.manager import EFFECTS, LifecycleEvent

README = Path(__file__).resolve().parents[1] / "README.md"


def _table_rows() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    start = text.index("<!-- lifecycle-table")
    end = text.index("<!-- /lifecycle-table -->")
    lines = [ln for ln in text[start:end].splitlines() if ln.startswith("| `")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines]


def test_readme_lifecycle_table_matches_the_effects_table() -> None:
    rows = _table_rows()
    expected = [[f"`{e.event.value}`", e.l1, e.l2, e.l3] for e in EFFECTS.values()]
    assert rows == expected, (
        "re-render the README table from context_core.lifecycle.manager.EFFECTS"
    )
    assert {r[0].strip("`") for r in rows} == {e.value for e in LifecycleEvent}
