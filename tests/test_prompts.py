"""Prompt binding (context_core.routing.prompts): templates per intent, fields bound to their
layer and key, policies for missing and low-confidence values, load-time errors with file and
line, no template injection; the bundle (library and HTTP) and the trace carry the prompt, and
CER's "used" check reads the same bindings."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import cleanup_keys, redis_client
from test_service import cleanup_service_keys, running_service, service_settings

from context_app import prompt_docs
from context_app.service.deps import build_services
from context_core.config import get_settings
from context_core.errors import PromptBindingError, PromptTemplateError
from context_core.gateway.sanitize import Gateway
from context_core.platform import build_platform
from context_core.routing.bundle import Fragment
from context_core.routing.confidence import ConfidencePolicy
from context_core.routing.intents import IntentRegistry
from context_core.routing.prompts import NOTICE, PromptLibrary, compile_template
from context_core.routing.router import ContextRouter
from context_core.session.state import SessionState
from context_core.session.wire import BundleWire
from context_core.traces import TraceWriter, read_traces, validate_record
from context_core.working_memory import WorkingMemory
from evaluation.cer import judge_steps

SID = "t-prompt"


def _state(query: str = "check pump P-0042", device: str | None = "pump-0042") -> SessionState:
    s = SessionState.start(SID, "u-1", query, gateway=Gateway(), start_time=1_764_900_000.0)
    return s.advance(current_step=2, last_device_id=device)


def _l2(kind: str, ident: str, content: Any) -> Fragment:
    return Fragment("L2", f"L2:wm:{{{SID}}}:{kind}:{ident}", content, 1.0, 0.1, 1.0, "exact")


def _l3(point: str, title: str, text: str, label: str, score: float) -> Fragment:
    content = {"text": text, "title": title, "heading_path": [title], "page": "p1"}
    return Fragment("L3", f"L3:knowledge_main:{point}", content, score, 1.0, score, label)


def _tpl(source: str, intent: str = "generate_report") -> Any:
    return compile_template(source, name=f"operator/{intent}.j2", intent=intent)


# --- the shipped templates --------------------------------------------------------------------


def test_every_builtin_intent_ships_a_template_whose_fields_come_from_the_template() -> None:
    lib = PromptLibrary.load(intents=IntentRegistry.builtin().specs)
    assert set(lib.templates) == set(IntentRegistry.builtin().names())
    report = lib.templates["generate_report"]
    assert [(f.field, f.layer, f.key, f.missing, f.low) for f in report.fields] == [
        ("user_query", "l1", "user_query", "fail", "notice"),
        ("device", "l1", "last_device_id", "notice", "notice"),
        ("findings", "l2", "step", "fail", "notice"),
        ("task_contract", "l2", "contract", "omit", "notice"),
        ("preferences", "l2", "pref", "omit", "notice"),
        ("report_template", "l3", "report", "notice", "notice"),
    ]
    assert report.fields[2].line == 6  # the line of its call in shipped/generate_report.j2


def test_docs_show_what_the_shipped_templates_render() -> None:
    assert prompt_docs.main(["--check"]) == 0, "run: python -m context_app.prompt_docs --write"
    page = prompt_docs.PAGE.read_text(encoding="utf-8")
    for intent in IntentRegistry.builtin().names():
        assert f"### `{intent}`" in page
    assert f"[{NOTICE}] Sections: asset" in page  # the low-confidence report template


# --- binding and policies ---------------------------------------------------------------------


def test_bound_notice_and_omitted_fields_and_context_used() -> None:
    tpl = _tpl(
        'Q: {{ l1("user_query") }}\n'
        'F: {{ l2("step", field="findings") }}\n'
        'C: {{ l2("contract", field="contract") }}|\n'
        'R: {{ l3("report", field="report") }}\n'
        'L: {{ l3("limits", low="omit") }}|\n'
    )
    frags = [
        _l2("step", "1", {"rms": 7.9}),
        _l3("p-r", "Report template", "asset, finding, action", "low_confidence", 0.41),
        _l3("p-l", "Vibration limits", "alarm 7.1 mm/s", "low_confidence", 0.40),
    ]
    p = tpl.render(_state(), frags, step=2)
    assert p.text == (
        "Q: check pump P-0042\n"
        'F: {"rms": 7.9}\n'
        "C: |\n"
        f"R: [{NOTICE}] asset, finding, action\n"
        "L: |\n"
    )
    got = {b.field: (b.layer, b.key, b.status, b.confidence) for b in p.bindings}
    assert got == {
        "user_query": ("l1", "user_query", "bound", 1.0),
        "findings": ("l2", "step", "bound", 1.0),
        "contract": ("l2", "contract", "omitted", None),
        "report": ("l3", "report", "notice", 0.41),
        "limits": ("l3", "limits", "omitted", None),
    }
    assert p.context_used == (
        "L1:session.user_query",
        f"L2:wm:{{{SID}}}:step:1",
        "L3:knowledge_main:p-r",
    )
    assert {b.field: b.fragments for b in p.bindings}["report"] == (1,)


def test_confident_hits_are_bound_plainly_and_low_ones_marked() -> None:
    tpl = _tpl('{{ l3("*", field="kb") }}')
    frags = [
        _l3("a", "Limits", "alarm 7.1", "confident", 0.7),
        _l3("b", "Old limits", "alarm 6.0", "low_confidence", 0.42),
    ]
    p = tpl.render(_state(), frags)
    assert p.text == f"alarm 7.1\n[{NOTICE}] alarm 6.0"
    (b,) = p.bindings
    assert (b.status, b.confidence, b.fragments) == ("notice", 0.7, (0, 1))
    only_sure = tpl.render(_state(), frags[:1])
    assert only_sure.text == "alarm 7.1" and only_sure.bindings[0].status == "bound"


def test_missing_notice_and_fail_policies() -> None:
    tpl = _tpl('A: {{ l2("series", missing="notice") }}\n')
    p = tpl.render(_state(), [])
    assert p.text == "A: (not available)\n" and p.bindings[0].status == "notice"
    strict = _tpl('A: {{ l2("series", field="vibration", missing="fail") }}')
    with pytest.raises(PromptBindingError) as e:
        strict.render(_state(), [])
    assert "'vibration'" in str(e.value) and "policy is fail" in str(e.value)
    assert e.value.details() == {"field": "vibration", "layer": "l2", "key": "series"}
    low_fails = _tpl('{{ l3("*", low="fail") }}')
    with pytest.raises(PromptBindingError, match="only low-confidence"):
        low_fails.render(_state(), [_l3("x", "T", "t", "low_confidence", 0.3)])
    l1_fails = _tpl('{{ l1("last_device_id", missing="fail") }}')
    with pytest.raises(PromptBindingError, match="session state"):
        l1_fails.render(_state(device=None), [])


def test_long_values_are_cut() -> None:
    tpl = _tpl('{{ l2("step") }}')
    p = tpl.render(_state(), [_l2("step", "1", "x" * 10_000)])
    assert len(p.text) == 4000 and p.text.endswith(" [truncated]")


# --- injection --------------------------------------------------------------------------------

PAYLOADS = [
    "{{ 7*7 }}",
    "{% for i in range(3) %}X{% endfor %}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ l1('user_id') }}",
    "{# hidden #}{%raw%}",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_user_values_are_data_never_template_syntax(payload: str) -> None:
    tpl = PromptLibrary.load().templates["generate_report"]
    state = _state(query=f"check {payload} now", device=f"dev{payload}")
    step = _l2("step", "1", {"note": payload})
    p = tpl.render(state, [step])
    assert f"check {payload} now" in p.text
    assert json.dumps({"note": payload}, ensure_ascii=False) in p.text
    assert "49" not in p.text and "XXX" not in p.text and "u-1" not in p.text
    assert "subclasses" not in payload or "<class" not in p.text


def test_the_sandbox_refuses_escapes_in_templates_at_load(tmp_path: Path) -> None:
    (tmp_path / "default.j2").write_text(
        "Q: {{ l1('user_query') }}\n\n{{ ''.__class__.__mro__[1].__subclasses__() }}\n"
    )
    with pytest.raises(PromptTemplateError) as e:
        PromptLibrary.load(tmp_path)
    assert "operator/default.j2:3" in str(e.value)
    assert "unsafe" in str(e.value) or "__class__" in str(e.value)


# --- load-time errors -------------------------------------------------------------------------

BAD = [
    ("ok\n{% if x %}\nno end", 3, "Unexpected end of template"),
    ("a\n{{ l1(name) }}", 2, "string constant"),
    ('{{ l1("password") }}', 1, "no such session field"),
    ('{{ l2("cache") }}', 1, "unknown key kind"),
    ('{{ l3("x", missing="drop") }}', 1, "not a policy"),
    ('{{ l3("x", limit="3") }}', 1, "no argument 'limit'"),
    ('{{ l1("user_query") }}\n{{ l1("user_query") }}', 2, "bound twice"),
    ("\n\n{{ secrets }}", 3, "'secrets' is undefined"),
    ("{{ l2 }}", 1, "call it"),
    ('{% include "other.j2" %}', 1, "self-contained"),
    ("{{ 1 // 0 }}", 1, "ZeroDivisionError"),
]


@pytest.mark.parametrize(("source", "line", "message"), BAD)
def test_template_errors_name_file_and_line(
    tmp_path: Path, source: str, line: int, message: str
) -> None:
    (tmp_path / "call_api.j2").write_text(source)
    with pytest.raises(PromptTemplateError) as e:
        PromptLibrary.load(tmp_path)
    assert f"operator/call_api.j2:{line}" in str(e.value)
    assert message in str(e.value)


def test_operator_templates_replace_shipped_ones_and_must_name_an_intent(tmp_path: Path) -> None:
    (tmp_path / "call_api.j2").write_text('Ops says: {{ l1("user_query") }}')
    lib = PromptLibrary.load(tmp_path, intents=IntentRegistry.builtin().specs)
    p = lib.render("call_api", _state(), [])
    assert p is not None and p.text == "Ops says: check pump P-0042"
    assert p.template == "operator/call_api.j2"
    assert lib.templates["generate_report"].name == "shipped/generate_report.j2"
    (tmp_path / "call_apii.j2").write_text("x")
    with pytest.raises(PromptTemplateError, match="names no registered intent 'call_apii'"):
        PromptLibrary.load(tmp_path, intents=IntentRegistry.builtin().specs)
    with pytest.raises(PromptTemplateError, match="not a directory"):
        PromptLibrary.load(tmp_path / "nope")


def test_the_service_refuses_to_start_on_a_bad_template(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "default.j2").write_text('line one\n{{ l1("user_query") }\n')
    settings = get_settings(
        data_dir=tmp_path / "ctx", redis_url=redis_url, prompt_templates_dir=tmp_path / "tpl"
    )
    with pytest.raises(PromptTemplateError, match=r"operator/default\.j2:2"):
        build_services(settings, echo_dev_key=False)


# --- on a real route, in the trace, and in CER ------------------------------------------------


@pytest.fixture
def routed(tmp_path: Path, redis_url: str, session_id: str) -> Iterator[dict[str, Any]]:
    gw = Gateway()
    client = redis_client(redis_url, decode_responses=True)
    tracer = TraceWriter(tmp_path / "traces", gateway=gw)
    yield {"gw": gw, "client": client, "tracer": tracer, "dir": tmp_path / "traces"}
    cleanup_keys(redis_url, f"wm:{{{session_id}}}:*")
    client.zrem("ctx:activity", session_id)
    client.close()


def _router(env: dict[str, Any], lib: PromptLibrary) -> ContextRouter:
    return ContextRouter(
        wm=WorkingMemory(env["client"], env["gw"]),
        knowledge=None,
        policy=ConfidencePolicy(),
        tracer=env["tracer"],
        prompts=lib,
        max_fragments=2,
    )


def test_route_returns_the_prompt_and_traces_its_bindings(
    routed: dict[str, Any], session_id: str
) -> None:
    sm = WorkingMemory(routed["client"], routed["gw"]).session(session_id)
    sm.add_series_point("pump-0042.vibration", time.time() - 60, 7.9)
    state = SessionState.start(session_id, "u-1", "check {{7*7}} pump", gateway=routed["gw"])
    state = state.advance(current_step=1, last_device_id="pump-0042")
    with _router(routed, PromptLibrary.load()) as router:
        bundle = router.route(state, "fetch_sensor_data")
    p = bundle.prompt
    assert p is not None and p.template == "shipped/fetch_sensor_data.j2"
    assert "The user's initial request (L1): check {{7*7}} pump" in p.text
    assert '"newest": [' in p.text and "7.9]" in p.text
    wire = BundleWire.model_validate(bundle.to_dict())  # the HTTP/library wire form
    assert wire.prompt is not None and wire.prompt.text == p.text
    assert [b.status for b in wire.prompt.bindings] == ["bound", "bound", "bound", "omitted"]
    (rec,) = list(read_traces(routed["dir"]))
    validate_record(rec)
    series_idx = [f["source"] for f in rec["fragments"]].index(
        f"L2:wm:{{{session_id}}}:series:pump-0042.vibration"
    )
    by_field = {b["field"]: b for b in rec["prompt"]["bindings"]}
    assert by_field["vibration_series"]["fragments"] == [series_idx]
    assert "text" not in rec["prompt"]  # the trace keeps where values came from, not values

    # CER reads the same bindings: the series was bound, so citing it counts as used
    out = {"kind": "step_output", "trace_id": rec["trace_id"], "output": "latest RMS 7.9"}
    (v,) = judge_steps([rec, out], accept=0.5)
    assert v.used
    unbound = {**rec, "prompt": {**rec["prompt"], "bindings": []}}
    (v,) = judge_steps([unbound, out], accept=0.5)
    assert not v.used  # the same record without the binding: the 7.9 is no evidence of use


def test_a_fail_field_raises_after_the_trace_is_written(
    routed: dict[str, Any], session_id: str, tmp_path: Path
) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "fetch_sensor_data.j2").write_text(
        '{{ l2("contract", field="contract", missing="fail") }}'
    )
    state = SessionState.start(session_id, "u-1", "check pump", gateway=routed["gw"])
    with (
        _router(routed, PromptLibrary.load(tmp_path / "tpl")) as router,
        pytest.raises(PromptBindingError, match="'contract'"),
    ):
        router.route(state, "fetch_sensor_data")
    (rec,) = list(read_traces(routed["dir"]))
    assert rec["intent"] == "fetch_sensor_data" and "prompt" not in rec


def test_prompts_off_leaves_the_field_null(tmp_path: Path, redis_url: str) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", redis_url=redis_url, prompts=False)
    with build_platform(settings, with_knowledge=False) as p:
        assert p.prompts is None and p.router.prompts is None


def test_http_context_answers_with_the_prompt(tmp_path: Path, redis_url: str) -> None:
    settings, raw = service_settings(tmp_path, redis_url)
    sid = f"t-{time.time_ns() % 10**12}"  # and its own user: no preferences yet
    try:
        with (
            running_service(settings) as url,
            httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-a"]}, timeout=60) as c,
        ):
            r = c.post(
                "/v1/sessions",
                json={"session_id": sid, "user_id": f"u-{sid}", "user_query": "report {% raw %}"},
            )
            assert r.status_code == 201, r.text
            r = c.post(
                "/v1/context",
                json={"session_id": sid, "step_intent": "preferences", "state": r.json()["state"]},
            )
            assert r.status_code == 200, r.text
            prompt = r.json()["prompt"]
    finally:
        cleanup_service_keys(redis_url)
        cleanup_keys(redis_url, f"pref:{{*:u-{sid}}}:*")
    assert prompt["intent"] == "preferences" and prompt["template"] == "shipped/preferences.j2"
    assert "The user's initial request (L1): report {% raw %}" in prompt["text"]
    assert prompt["bindings"] == [
        {"field": "user_query", "layer": "l1", "key": "user_query", "status": "bound",
         "confidence": 1.0},
        {"field": "preferences", "layer": "l2", "key": "pref", "status": "notice",
         "confidence": None},
    ]  # fmt: skip
    assert prompt["context_used"] == ["L1:session.user_query"]
