"""The rendered prompts shown in docs/prompts.md, produced from the shipped templates.

``python -m context_app.prompt_docs`` prints the section; ``--write`` replaces it in
docs/prompts.md (between the two marker comments); ``--check`` exits 1 when the page differs
from what the templates render now (tests/test_prompts.py runs the same check).

Each default intent is rendered from one fixed sample bundle (the scripted session's pump:
a vibration series, the previous step's findings, a task contract, a preference, two L3 hits of
which one is low confidence), so the output is the same on every machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from context_core.gateway.sanitize import Gateway
from context_core.routing.bundle import LOW_CONFIDENCE_NOTE, Fragment
from context_core.routing.intents import IntentRegistry
from context_core.routing.prompts import PromptLibrary, RenderedPrompt
from context_core.session.state import SessionState

__all__ = ["BEGIN", "END", "render_section", "sample_fragments", "sample_state"]

BEGIN = "<!-- rendered-prompts:begin (python -m context_app.prompt_docs --write) -->"
END = "<!-- rendered-prompts:end -->"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "prompts.md"
_SID = "demo-7f3a"
_T0 = 1_764_900_000.0  # fixed: the sample renders the same everywhere


def sample_state() -> SessionState:
    state = SessionState.start(
        _SID,
        "u-1042",
        "Pump P-0042 vibrates more than usual since this morning: check it and write the "
        "maintenance report",
        gateway=Gateway(),
        start_time=_T0,
    )
    return state.advance(current_step=3, last_device_id="pump-0042")


def _exact(key: str, content: Any) -> Fragment:
    return Fragment("L2", f"L2:{key}", content, 1.0, 0.1, 1.0, "exact")


def _hit(point: str, title: str, heading: list[str], text: str, score: float) -> Fragment:
    confident = score >= 0.487  # the sample calibration's accept threshold
    return Fragment(
        "L3",
        f"L3:knowledge_main:{point}",
        {"text": text, "title": title, "heading_path": heading, "page": "EQM-" + point[:4]},
        score,
        30.0,
        score,
        "confident" if confident else "low_confidence",
        "" if confident else LOW_CONFIDENCE_NOTE,
        None,
        "cosine",
    )


def sample_fragments(intent: str) -> list[Fragment]:
    """The delivered fragments of a bundle of ``intent`` in the sample session."""
    series = _exact(
        f"wm:{{{_SID}}}:series:pump-0042.vibration",
        {
            "points": 3,
            "newest": [_T0 + 7200, 7.9],
            "series": [[_T0 + 3600, 6.8], [_T0 + 5400, 7.4], [_T0 + 7200, 7.9]],
        },
    )
    step = _exact(
        f"wm:{{{_SID}}}:step:2",
        {"finding": "RMS velocity 7.9 mm/s, above the 7.1 mm/s alarm limit", "bearing": "DE"},
    )
    contract = _exact(
        f"wm:{{{_SID}}}:contract:current",
        {"goal": "maintenance report for P-0042", "constraints": ["metric units"]},
    )
    pref = Fragment(
        "L2",
        "L2:pref:{acme:u-1042}:report_language",
        {"value": "en", "confidence": 0.9, "last_updated": "2026-12-01"},
        0.9,
        96.0,
        0.9,
        "preference",
    )
    limits = _hit(
        "7c1e2f40",
        "Pump vibration limits",
        ["PUMP", "Vibration limits"],
        "ISO 10816-3 zone C starts at 7.1 mm/s RMS: plan maintenance within 30 days.",
        0.71,
    )
    report = _hit(
        "a93d5e11",
        "Maintenance work report template",
        ["Report Templates", "Work report"],
        "Sections: asset, finding, measured values, action, next inspection date.",
        0.44,
    )
    api = _exact(
        f"wm:{{{_SID}}}:api:pump_status.3f9c",
        {"status": "running", "hours": 17400},
    )
    return {
        "fetch_sensor_data": [series, contract],
        "call_api": [api, contract],
        "compare_vibration": [series, step, limits],
        "generate_report": [step, contract, pref, report],
        "preferences": [pref],
        "default": [limits],
    }.get(intent, [])


def _rendered(lib: PromptLibrary, intent: str) -> RenderedPrompt:
    state = sample_state()
    prompt = lib.render(intent, state, sample_fragments(intent))
    if prompt is None:  # pragma: no cover - every default intent ships a template
        raise SystemExit(f"no template for {intent!r}")
    return prompt


def render_section() -> str:
    """The page's generated section: each default intent's prompt and its bindings."""
    lib = PromptLibrary.load()
    out = [BEGIN, ""]
    for intent in IntentRegistry.builtin().names():
        if lib.get(intent) is None:
            continue
        p = _rendered(lib, intent)
        out += [f"### `{intent}`", "", f"Template `{p.template}`:", "", "```text"]
        out += [p.text.rstrip("\n"), "```", ""]
        out += ["| field | layer | key | status | confidence |", "|---|---|---|---|---|"]
        for b in p.bindings:
            conf = "null" if b.confidence is None else f"{b.confidence:g}"
            out.append(f"| `{b.field}` | {b.layer} | `{b.key}` | {b.status} | {conf} |")
        out += ["", f"`context_used`: {', '.join(f'`{s}`' for s in p.context_used)}", ""]
    out.append(END)
    return "\n".join(out)


def _replace(page: str, section: str) -> str:
    head, sep, rest = page.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{PAGE}: the markers {BEGIN!r} ... {END!r} are missing")
    return head + section + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m context_app.prompt_docs", description=__doc__)
    ap.add_argument("--write", action="store_true", help="replace the section in the page")
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    args = ap.parse_args(argv)
    section = render_section()
    if not (args.write or args.check):
        print(section)
        return 0
    page = PAGE.read_text(encoding="utf-8")
    new = _replace(page, section)
    if args.check:
        if new != page:
            print(f"{PAGE} is out of date: run python -m context_app.prompt_docs --write")
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
