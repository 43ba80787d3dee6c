"""The output sanitizer (context_core/gateway/output.py) against XSS and SSRF payload shapes
written here, and the outputs endpoint that uses it (real app, real Redis).

Each payload is wrapped in benign Markdown (a public link, bold, a list, inline code, an
allowed ``<a>``) and must come out with its dangerous part gone, the removal reported, and the
benign part intact (the ``<a>`` with ``rel="noopener noreferrer"`` added)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_service import cleanup_service_keys, running_service, service_settings

from context_app.service.cpu_budget import ON_LOOP_MAX_CHARS
from context_core.gateway.output import LINK_REMOVED, OutputFormat, check_url, sanitize_output
from context_core.gateway.sanitize import Gateway

FAKE_KEY = "sk_live_" + "Q7x9" * 6
BENIGN_TOP = "See [the docs](https://example.com/docs) and **bold** text.\n\n"
BENIGN_BOTTOM = (
    '\n\n- item one\n- item two\n\nRun `make test` then <a href="https://example.com/ok">ok</a>.\n'
)
KEPT_A = '<a href="https://example.com/ok" rel="noopener noreferrer">ok</a>'


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.parts.append(f"<{tag} " + " ".join(f"{k}={v}" for k, v in attrs) + ">")

    def handle_comment(self, data: str) -> None:
        self.parts.append(f"<!--{data}-->")

    def handle_data(self, data: str) -> None:
        self.parts.append(" ")


def live_markup(text: str) -> str:
    """Tags, attributes and comments as an HTML parser sees them (text nodes left out)."""
    p = _Markup()
    p.feed(text)
    p.close()
    return "".join(p.parts)


def flat(text: str) -> str:
    """What a browser would read: entities decoded, whitespace gone, lower case."""
    return re.sub(r"\s+", "", html.unescape(text)).lower()


# (id, payload, substrings that must be gone (checked on flat()), expected finding kind)
CORPUS: list[tuple[str, str, list[str], str]] = [
    ("script", "<script>alert(1)</script>", ["<script", "alert(1)"], "html_tag"),
    (
        "script-mixed-case",
        "<ScRiPt SRC=//evil.example/x.js></sCrIpT>",
        ["evil.example"],
        "html_tag",
    ),
    ("img-onerror", "<img src=x onerror=alert(1)>", ["onerror", "alert(1)"], "html_attr"),
    ("img-onerror-case", '<IMG SRC="x" OnErRoR="alert(1)">', ["onerror", "alert(1)"], "html_attr"),
    ("svg-onload", "<svg onload=alert(1)>", ["<svg", "onload"], "html_tag"),
    ("svg-script", "<svg><script>alert(1)</script></svg>", ["alert(1)"], "html_tag"),
    (
        "iframe-srcdoc",
        '<iframe srcdoc="&lt;script&gt;alert(1)&lt;/script&gt;"></iframe>',
        ["<iframe", "srcdoc", "alert(1)"],
        "html_tag",
    ),
    ("iframe-js", '<iframe src="javascript:alert(1)"></iframe>', ["javascript"], "html_tag"),
    ("a-js", '<a href="javascript:alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-js-case", '<a href="JaVaScRiPt:alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-js-tab", '<a href="java\tscript:alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-js-newline", '<a href="java\nscript:alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-js-entity", '<a href="&#106;avascript:alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-js-hex-entity", '<a href="&#x6A;avascript:alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-js-colon-entity", '<a href="javascript&colon;alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-js-leading-ctrl", '<a href=" \x01 javascript:alert(1)">x</a>', ["javascript"], "scheme"),
    ("a-vbscript", '<a href="vbscript:msgbox(1)">x</a>', ["vbscript"], "scheme"),
    ("a-data", '<a href="data:text/html;base64,PHNjcmlwdD4=">x</a>', ["data:", "phnj"], "scheme"),
    ("a-file", '<a href="file:///etc/passwd">x</a>', ["file:", "/etc/passwd"], "scheme"),
    (
        "form-action",
        '<form action="javascript:alert(1)"><input type=submit></form>',
        ["<form", "javascript", "<input"],
        "html_tag",
    ),
    (
        "button-formaction",
        "<button formaction=javascript:alert(1)>go</button>",
        ["javascript"],
        "html_tag",
    ),
    (
        "math-xlink",
        '<math><mi xlink:href="javascript:alert(1)">m</mi></math>',
        ["javascript", "<math"],
        "html_tag",
    ),
    (
        "style-expression",
        '<div style="width:expression(alert(1))">d</div>',
        ["expression(", "style="],
        "html_attr",
    ),
    (
        "style-url-js",
        '<p style="background:url(javascript:alert(1))">p</p>',
        ["javascript", "style="],
        "html_attr",
    ),
    (
        "style-tag",
        "<style>body{background:url(javascript:alert(1))}</style>",
        ["<style", "javascript"],
        "html_tag",
    ),
    ("base-href", '<base href="https://evil.example/">', ["<base", "evil.example"], "html_tag"),
    (
        "meta-refresh",
        '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">',
        ["<meta", "refresh", "javascript"],
        "html_tag",
    ),
    (
        "object-data",
        '<object data="javascript:alert(1)"></object>',
        ["<object", "javascript"],
        "html_tag",
    ),
    ("embed-src", '<embed src="javascript:alert(1)">', ["<embed", "javascript"], "html_tag"),
    (
        "details-ontoggle",
        "<details open ontoggle=alert(1)>d</details>",
        ["ontoggle", "alert(1)"],
        "html_attr",
    ),
    (
        "a-onclick",
        '<a href="https://example.com/" onclick="alert(1)">c</a>',
        ["onclick", "alert(1)"],
        "html_attr",
    ),
    ("comment", "<!--<img src=x onerror=alert(1)>-->", ["onerror", "<!--"], "html_comment"),
    (
        "noscript-mxss",
        '<noscript><p title="</noscript><img src=x onerror=alert(1)>"></noscript>',
        ["onerror"],
        "html_tag",
    ),
    ("rejoin", "<<script></script>img src=x onerror=alert(1)>", ["onerror"], "html_tag"),
    ("split-script", "<scr<script>ipt>alert(1)</script>", ["<script", "alert(1)"], "html_tag"),
    ("md-js", "[x](javascript:alert(1))", ["javascript"], "scheme"),
    ("md-js-spaces-upper", "[x](  JAVASCRIPT:alert(1))", ["javascript"], "scheme"),
    ("md-js-entity", "[x](java&#115;cript:alert(1))", ["javascript"], "scheme"),
    ("md-js-angle", "[x](<javascript:alert(1)>)", ["javascript"], "scheme"),
    ("md-js-title", '[x](javascript:alert(1) "t")', ["javascript"], "scheme"),
    ("md-js-escaped", "[x](javascript\\:alert(1))", ["javascript"], "scheme"),
    (
        "md-image-data",
        "![x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
        ["data:", "phnjcmlwdd5"],
        "scheme",
    ),
    (
        "md-nested-image-link",
        "[![i](data:image/svg+xml;base64,PHN2Zz4=)](javascript:alert(1))",
        ["javascript", "data:"],
        "scheme",
    ),
    ("md-refdef", "[r]: javascript:alert(1)\n\n[click][r]", ["javascript"], "scheme"),
    (
        "md-refdef-private",
        '[r]: http://10.1.2.3/admin "t"\n\n[click][r]',
        ["10.1.2.3"],
        "private_host",
    ),
    ("autolink-js", "<javascript:alert(1)>", ["javascript"], "scheme"),
    ("autolink-loopback", "<http://127.0.0.1:8080/admin>", ["127.0.0.1"], "private_host"),
    (
        "bare-metadata",
        "http://169.254.169.254/latest/meta-data/",
        ["169.254.169.254"],
        "private_host",
    ),
    ("bare-js", "click javascript:alert(document.cookie) now", ["javascript"], "scheme"),
    ("bare-short-ipv4", "http://127.1/", ["127.1/"], "private_host"),
    ("md-ipv6-loopback", "[a](http://[::1]/)", ["[::1]"], "private_host"),
    ("md-decimal-ip", "[a](http://2130706433/)", ["2130706433"], "private_host"),
    ("md-hex-ip", "[a](http://0x7f000001/)", ["0x7f000001"], "private_host"),
    ("md-hex-dotted-ip", "[a](http://0x7f.1/)", ["0x7f.1"], "private_host"),
    ("md-octal-ip", "[a](http://0177.0.0.1/)", ["0177.0.0.1"], "private_host"),
    ("md-userinfo-private", "[a](http://user@10.0.0.1/)", ["10.0.0.1"], "private_host"),
    ("md-userinfo-trick", "[a](http://good.example@127.0.0.1/)", ["127.0.0.1"], "private_host"),
    ("md-mapped-ipv6", "[a](http://[::ffff:127.0.0.1]/)", ["::ffff"], "private_host"),
    ("md-unspecified", "[a](http://0.0.0.0:8000/)", ["0.0.0.0"], "private_host"),
    ("md-localhost", "[a](http://localhost:3000/)", ["localhost"], "private_host"),
    ("md-sub-localhost", "[a](http://app.localhost/)", ["app.localhost"], "private_host"),
    ("md-private-192", "[a](http://192.168.1.1/)", ["192.168.1.1"], "private_host"),
    ("md-private-172", "[a](https://172.16.0.5/)", ["172.16.0.5"], "private_host"),
    ("md-link-local-v6", "[a](http://[fe80::1]/)", ["fe80::1"], "private_host"),
    ("md-fragment-trick", "[a](http://127.0.0.1#@example.com)", ["127.0.0.1"], "private_host"),
    (
        "a-metadata-name",
        '<a href="http://metadata.google.internal/computeMetadata/v1/">m</a>',
        ["metadata.google.internal"],
        "private_host",
    ),
    (
        "img-aws-v6-metadata",
        '<img src="http://[fd00:ec2::254]/latest/">',
        ["fd00:ec2::254"],
        "private_host",
    ),
    ("a-scheme-relative", '<a href="//127.0.0.1/x">x</a>', ["127.0.0.1"], "private_host"),
    ("a-backslashes", '<a href="http:\\\\127.0.0.1\\x">x</a>', ["127.0.0.1"], "private_host"),
]


@pytest.fixture
def gateway() -> Gateway:
    return Gateway(audit_path=None)


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 30
    assert len({c[0] for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(
    ("payload", "gone", "kind"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS]
)
def test_markdown_payload_is_removed_and_benign_text_kept(
    gateway: Gateway, payload: str, gone: list[str], kind: str
) -> None:
    text = BENIGN_TOP + payload + BENIGN_BOTTOM
    out = sanitize_output(text, gateway=gateway, fmt="markdown")
    for bad in gone:
        assert bad not in flat(out.text), (bad, out.text)
    kinds = [r.kind for r in out.removed]
    assert kind in kinds, (kinds, out.text)
    assert out.text.startswith(BENIGN_TOP), out.text
    assert out.text.endswith(
        BENIGN_BOTTOM.replace('<a href="https://example.com/ok">ok</a>', KEPT_A)
    )
    # the report never carries more than a short value
    assert all(len(r.value) <= 60 for r in out.removed)


@pytest.mark.parametrize("fmt", ["html", "text"])
@pytest.mark.parametrize(("payload", "gone"), [c[1:3] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_payload_is_removed_in_html_and_text_formats(
    gateway: Gateway, fmt: OutputFormat, payload: str, gone: list[str]
) -> None:
    out = sanitize_output(
        '<a href="https://example.com/ok">ok</a> ' + payload, gateway=gateway, fmt=fmt
    )
    # html: what a browser parses as markup (escaped text is inert); text: everything
    live = flat(live_markup(out.text)) if fmt == "html" else flat(out.text)
    for bad in gone:
        assert bad not in live, (bad, out.text)
    if fmt == "html":  # Markdown-only syntax is inert in HTML: nothing to remove there
        assert KEPT_A in out.text
    else:
        assert out.removed, out.text
        assert "<a" not in out.text and "ok" in out.text


@pytest.mark.parametrize(("payload", "gone"), [c[1:3] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_sanitizing_twice_changes_nothing_more(
    gateway: Gateway, payload: str, gone: list[str]
) -> None:
    once = sanitize_output(BENIGN_TOP + payload + BENIGN_BOTTOM, gateway=gateway)
    twice = sanitize_output(once.text, gateway=gateway)
    assert twice.text == once.text
    assert twice.removed == ()


def test_benign_reply_is_unchanged(gateway: Gateway) -> None:
    text = (
        "## Pump PUMP-0042\n\n"
        "RMS is **4.1 mm/s**, _within_ the [ISO 10816](https://www.iso.org/standard/1.html) "
        "limit (see <https://example.com/limits> or www.example.com).\n\n"
        "1. check the bearing\n2. compare with `rms < 4.5`\n\n"
        "| sensor | value |\n|---|---|\n| vib | 4.1 |\n\n"
        "```python\nif rms < 4.5 and temp > 20:\n    print('ok')\n```\n\n"
        "> quoted <b>note</b> and <code>x</code><br>\n\n"
        '![chart](https://example.com/chart.png "RMS") [rel](/docs/pumps#bearing)\n'
    )
    out = sanitize_output(text, gateway=Gateway(audit_path=None), fmt="markdown")
    assert out.removed == ()
    assert out.text == text


def test_kept_links_get_rel_and_lose_other_attributes(gateway: Gateway) -> None:
    text = '<a href="https://example.com/x" target="_blank" rel="opener" class="c">x</a>'
    out = sanitize_output(text, gateway=gateway, fmt="html")
    assert out.text == '<a href="https://example.com/x" rel="noopener noreferrer">x</a>'
    assert {r.value.split("=")[0] for r in out.removed} == {"target", "class"}
    md = sanitize_output(text, gateway=gateway, fmt="markdown")
    assert md.text == out.text


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com",
        "http://8.8.8.8/",
        "HTTPS://Example.COM/a_(b)?q=1#f",
        "http://[2606:4700:4700::1111]/",
        "/relative/path",
        "#fragment",
        "?q=1",
        "page.html",
        "mailto:ops@example.com",
        "https://1.1.1.1:8443/x",
        "https://0x08.0x08.0x08.0x08/",  # 8.8.8.8 written in hex: public
    ],
)
def test_safe_urls(url: str) -> None:
    assert check_url(url) is None


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("javascript:alert(1)", "scheme"),
        ("  JaVaScRiPt:alert(1)", "scheme"),
        ("\x00\x1fjavascript:alert(1)", "scheme"),
        ("java\u200bscript:alert(1)", "scheme"),
        ("ｊａｖａｓｃｒｉｐｔ:alert(1)", "scheme"),
        ("java%73cript:alert(1)", "scheme"),
        ("vbscript:x", "scheme"),
        ("data:,x", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("ftp://example.com/", "scheme"),
        ("http://127.0.0.1/", "private_host"),
        ("http://127.0.0.1./", "private_host"),
        ("http://2130706433/", "private_host"),
        ("http://017700000001/", "private_host"),
        ("http://0x7f.0.0.1/", "private_host"),
        ("http://0/", "private_host"),
        ("http://[::]/", "private_host"),
        ("http://[::127.0.0.1]/", "private_host"),
        ("http://[64:ff9b::7f00:1]/", "private_host"),
        ("http://[2002:7f00:1::]/", "private_host"),
        ("http://[fe80::1%25eth0]/", "private_host"),
        ("http://[fc00::1]/", "private_host"),
        ("http://100.64.0.1/", "private_host"),
        ("http://169.254.169.254/", "private_host"),
        ("http://100.100.100.200/", "private_host"),
        ("http://metadata.google.internal./", "private_host"),
        ("http://LOCALHOST/", "private_host"),
        ("http://x.localhost/", "private_host"),
        ("http://127.0.0.%31/", "private_host"),
        ("http://127。0。0。1/", "private_host"),
        ("http://a:b@[::1]:80/", "private_host"),
        ("http:127.0.0.1/x", "private_host"),
        ("http:/\\127.0.0.1", "private_host"),
        ("http://[::1/", "bad_url"),
        ("http:///", "bad_url"),
    ],
)
def test_unsafe_urls(url: str, kind: str) -> None:
    verdict = check_url(url)
    assert verdict is not None and verdict[0] == kind, verdict


def test_secrets_are_redacted_and_never_echoed(tmp_path: Path) -> None:
    audit = tmp_path / "audit" / "audit.jsonl"
    gw = Gateway(audit_path=audit)
    text = (
        f"Token {FAKE_KEY} for [panel](http://admin:hunter2secret@10.0.0.7/?key={FAKE_KEY}) "
        "and <img src=x onerror=alert(1)> mail bob@example.com"
    )
    out = sanitize_output(text, gateway=gw, where="output:t-1")
    assert FAKE_KEY not in out.text and "hunter2secret" not in out.text
    assert "bob@example.com" not in out.text and "b***@example.com" in out.text
    kinds = {r.kind for r in out.removed}
    assert {"secret", "pii", "private_host", "html_attr"} <= kinds
    report = json.dumps([r.to_dict() for r in out.removed])
    assert FAKE_KEY not in report and "hunter2secret" not in report and "bob@" not in report
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    raw = audit.read_text()
    assert FAKE_KEY not in raw and "hunter2secret" not in raw and "bob@example.com" not in raw
    audited = {f["kind"] for rec in lines for f in rec["findings"]}
    assert {"secret_value", "pii_email", "private_host", "html_attr"} <= audited
    assert all(rec["where"] == "output:t-1" for rec in lines)
    assert all(len(f["value_sha256"]) == 16 for rec in lines for f in rec["findings"])


def test_removals_are_audited_through_the_gateway_with_its_keyed_hash(tmp_path: Path) -> None:
    """One audit trail: the sanitizer's records go through the gateway (its file, its tail)
    and hash removed values with CTX_AUDIT_HMAC_KEY like the gateway's own."""
    import hashlib
    import hmac

    audit = tmp_path / "audit.jsonl"
    key = b"k" * 32
    gw = Gateway(audit_path=audit, audit_key=key)
    payload = "<img src=x onerror=alert(1)>"
    out = sanitize_output(payload, gateway=gw, where="output:t-2")
    (attr,) = [r for r in out.removed if r.kind == "html_attr"]
    (rec,) = [r for r in gw.recent_audit if r.where == "output:t-2"]  # in the gateway's tail
    (finding,) = [f for f in rec.findings if f.kind == "html_attr"]
    assert finding.value_sha256 == attr.digest
    keyed = hmac.new(key, b"onerror=alert(1)", hashlib.sha256).hexdigest()[:16]
    plain = hashlib.sha256(b"onerror=alert(1)").hexdigest()[:16]
    assert attr.digest == keyed != plain
    assert json.loads(audit.read_text().splitlines()[-1])["findings"][0]["value_sha256"] == keyed


def test_clean_output_writes_no_audit_record(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    out = sanitize_output("all **good** at https://example.com", gateway=Gateway(audit_path=audit))
    assert out.removed == () and not audit.exists()


def test_placeholder_for_removed_bare_urls(gateway: Gateway) -> None:
    out = sanitize_output("open http://10.0.0.1:9200/_cat, then stop.", gateway=gateway)
    assert out.text == f"open {LINK_REMOVED}, then stop."


def test_code_keeps_text_but_escapes_tags(gateway: Gateway) -> None:
    text = "```\nif a < b:\n    <script>alert(1)</script>\n```\n"
    out = sanitize_output(text, gateway=gateway)
    assert "<script" not in out.text and "&lt;script>alert(1)&lt;/script>" in out.text
    assert "if a < b:" in out.text


def test_unknown_format_is_refused(gateway: Gateway) -> None:
    with pytest.raises(ValueError, match="fmt"):
        sanitize_output("x", gateway=gateway, fmt="rtf")  # type: ignore[arg-type]


def test_big_hostile_input_is_fast(gateway: Gateway) -> None:
    import time

    hostile = ('<a "' * 4000) + ("[x](" * 3000) + ("<!--" * 2000)
    t0 = time.perf_counter()
    out = sanitize_output(hostile[:64_000], gateway=gateway)
    assert time.perf_counter() - t0 < 10
    assert "<a " not in out.text


# --- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("outputs")
    settings, raw = service_settings(tmp, redis_url, max_body_bytes=64 * 1024)
    with running_service(settings) as url:
        yield {"url": url, "keys": raw, "settings": settings}
    cleanup_service_keys(redis_url)


def test_outputs_endpoint_stores_and_returns_the_sanitized_reply(
    svc: dict[str, Any], session_id: str
) -> None:
    reply = (
        "Vibration is fine. <img src=x onerror=alert(document.cookie)> "
        f"Use key {FAKE_KEY} on the [admin panel](http://169.254.169.254/latest/meta-data/) "
        'or <a href="https://example.com/runbook">the runbook</a>.'
    )
    with httpx.Client(
        base_url=svc["url"], headers={"X-API-Key": svc["keys"]["agent-a"]}, timeout=30
    ) as c:
        r = c.post(
            "/v1/sessions", json={"session_id": session_id, "user_id": "u", "user_query": "q"}
        )
        assert r.status_code == 201, r.text
        state = r.json()["state"]
        r = c.post(
            f"/v1/sessions/{session_id}/outputs",
            json={"state": state, "trace_id": "tr-out-1", "output": reply},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert FAKE_KEY not in r.text
        assert "onerror" not in body["output"] and "169.254" not in body["output"]
        assert body["state"] == state
        assert body["info"] == {"step": 0, "trace_id": "tr-out-1"}
        assert body["output"] == (
            'Vibration is fine. <img src="x"> Use key [REDACTED] on the admin panel or '
            '<a href="https://example.com/runbook" rel="noopener noreferrer">the runbook</a>.'
        )
        kinds = {x["kind"] for x in body["removed"]}
        assert kinds == {"secret", "html_attr", "private_host"}, body["removed"]
        assert all(set(x) == {"kind", "value", "detail"} for x in body["removed"])

        r = c.post(
            f"/v1/sessions/{session_id}/outputs",
            json={"state": state, "trace_id": "tr-out-2", "output": reply, "format": "text"},
        )
        assert r.status_code == 200, r.text
        assert "<a" not in r.json()["output"] and "<img" not in r.json()["output"]
        bad = c.post(
            f"/v1/sessions/{session_id}/outputs",
            json={"state": state, "trace_id": "t", "output": "x", "format": "rtf"},
        )
        assert bad.status_code == 422
        c.delete(f"/v1/sessions/{session_id}")

    settings = svc["settings"]
    traces = "".join(f.read_text() for f in settings.traces_dir.glob("traces-*.jsonl"))
    stored = [json.loads(x) for x in traces.splitlines()]
    outs = [x for x in stored if x.get("kind") == "step_output" and x["session_id"] == session_id]
    assert [o["output"] for o in outs][:1] == [body["output"]]
    assert FAKE_KEY not in traces and "onerror" not in traces

    audit_file = settings.data_dir / "audit" / "audit.jsonl"
    raw = audit_file.read_text()
    assert FAKE_KEY not in raw
    mine = [json.loads(x) for x in raw.splitlines() if f"output:{session_id}:tr-out-1" in x]
    kinds = {f["kind"] for rec in mine for f in rec["findings"]}
    assert {"secret_value", "html_attr", "private_host"} <= kinds, mine


# --- Markdown parsed like a renderer (issue 32, item 3) ------------------------------------
#
# Each payload hides an unsafe destination where the regex-based sanitizer did not look:
# reference definitions inside containers, labels over two lines, link texts over 4 KiB,
# destinations on a container's continuation line, scheme-relative bare URLs. The check is a
# renderer's: markdown-it (the CommonMark reference parser), with its own link validation
# off, must find no unsafe destination in the output, and the encoded payload is gone.


def rendered_destinations(text: str) -> list[str]:
    """Every link/image destination a CommonMark renderer produces from ``text`` (markdown-it
    with validateLink accepting everything): inline, reference (all definitions, duplicates
    included) and autolinks."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark")
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    env: dict[str, Any] = {}
    out: list[str] = []
    for tok in md.parse(text, env):
        for child in tok.children or ():
            if child.type in ("link_open", "image"):
                out.append(str(child.attrs.get("src" if child.type == "image" else "href")))
    out += [r["href"] for r in env.get("references", {}).values()]
    out += [r["href"] for r in env.get("duplicate_refs", [])]
    return out


LONG = "a" * 5000
# (id, payload, substrings that must be gone (checked on flat()))
RENDERER_CORPUS: list[tuple[str, str, list[str]]] = [
    (
        "refdef-in-blockquote",
        "> [r]: jav&#x61;script:alert(1)\n\n[click][r]",
        ["javascript"],
    ),
    (
        "refdef-in-list-item",
        "- [r]: //169.254.169.254/latest/meta-data/\n\n[click][r]",
        ["169.254.169.254"],
    ),
    (
        "refdef-in-nested-containers",
        "- > [r]:\n  > jav&#x61;script:alert(1)\n\n[click][r]",
        ["javascript"],
    ),
    (
        "refdef-dest-on-next-quoted-line",
        "> > [r]:\n> > //169.254.169.254/latest\n\n[click][r]",
        ["169.254.169.254"],
    ),
    (
        "refdef-label-over-two-lines",
        "[r\nx]: jav&#x61;script:alert(1)\n\n[click][r x]",
        ["javascript"],
    ),
    (
        "refdef-label-over-two-lines-private",
        "[r\nx]:\n  //169.254.169.254/latest 'title'\n\n[click][r x]",
        ["169.254.169.254"],
    ),
    (
        "refdef-in-ordered-list-tab",
        "1.\t[r]: <jav&#x61;script:alert(1)>\n\n[click][r]",
        ["javascript"],
    ),
    ("link-text-over-4k", f"[{LONG}](jav&#x61;script:alert(1))", ["javascript"]),
    ("image-alt-over-4k", f"![{LONG}](//169.254.169.254/latest)", ["169.254.169.254"]),
    (
        "link-text-over-4k-private-mapped-v6",
        f"[{LONG}](http://[::ffff:a9fe:a9fe]/latest)",
        ["::ffff:a9fe:a9fe"],
    ),
    ("link-dest-on-quoted-next-line", "> [x](\n> jav&#x61;script:alert(1))", ["javascript"]),
    ("link-in-list-over-lines", "- [x\n  y](\n  //169.254.169.254/)", ["169.254.169.254"]),
    ("link-label-with-code-span", "[`]`](jav&#x61;script:alert(1))", ["javascript"]),
    (
        "link-entity-colon",
        "[x](javascript&colon;alert(1)) [y](java&Tab;script:alert(1))",
        ["javascript", "java\tscript"],
    ),
    ("link-fullwidth-scheme", "[x](ｊａｖａｓｃｒｉｐｔ:alert(1))", ["ｊａｖａｓｃｒｉｐｔ"]),
    ("link-octal-metadata", "[x](http://0251.0376.0251.0376/)", ["0251.0376"]),
    ("link-in-heading", "## [x](jav&#x61;script:alert(1)) ##", ["javascript"]),
    ("link-in-setext-heading", "[x](//169.254.169.254/)\n---", ["169.254.169.254"]),
    ("nested-image-in-link", "[![i](//127.0.0.1/x.png)](jav&#x61;script:y)", ["javascript"]),
    ("bare-scheme-relative", "fetch //169.254.169.254/latest/meta-data/ now", ["169.254.169.254"]),
]


@pytest.mark.parametrize(
    ("payload", "gone"), [c[1:] for c in RENDERER_CORPUS], ids=[c[0] for c in RENDERER_CORPUS]
)
def test_destinations_a_renderer_would_produce_are_cleaned(
    gateway: Gateway, payload: str, gone: list[str]
) -> None:
    text = BENIGN_TOP + payload + BENIGN_BOTTOM
    out = sanitize_output(text, gateway=gateway)
    for bad in gone:
        assert bad not in flat(out.text), (bad, out.text[-300:])
    unsafe = [u for u in rendered_destinations(out.text) if check_url(u) is not None]
    assert unsafe == [], out.text[-300:]
    assert out.removed, out.text
    assert {r.kind for r in out.removed} <= {"scheme", "private_host", "bad_url"}
    assert out.text.startswith(BENIGN_TOP), out.text[:200]
    assert out.text.endswith(
        BENIGN_BOTTOM.replace('<a href="https://example.com/ok">ok</a>', KEPT_A)
    )
    assert sanitize_output(out.text, gateway=gateway).removed == ()


def test_unsafe_link_becomes_its_text_and_definition_goes_with_its_lines(
    gateway: Gateway,
) -> None:
    text = (
        "> see [the panel](\n> jav&#x61;script:alert(1)) now\n\n"
        "- item\n- [r]:\n  //169.254.169.254/latest\n\n"
        "[click][r] and [ok](https://example.com/a)\n"
    )
    out = sanitize_output(text, gateway=gateway)
    assert out.text == (
        "> see the panel now\n\n- item\n- \n\n[click][r] and [ok](https://example.com/a)\n"
    )
    details = [r.detail for r in out.removed]
    assert details == [
        "link definition [R]: metadata address 169.254.169.254",
        "markdown link: javascript: links are not allowed",
    ]


def test_destination_in_code_loses_its_destination_only(gateway: Gateway) -> None:
    """Renderers disagree about where code ends: a destination is checked there too, and an
    unsafe one is cut out ("[x]()"), the rest of the code kept."""
    out = sanitize_output("Run `curl [x](//169.254.169.254/latest)` now", gateway=gateway)
    assert out.text == "Run `curl [x]()` now"
    assert [r.kind for r in out.removed] == ["private_host"]


def test_crlf_text_is_parsed_like_lf(gateway: Gateway) -> None:
    out = sanitize_output("> [r]:\r\n> jav&#x61;script:x\r\n\r\n[c][r]\r\n", gateway=gateway)
    assert "javascript" not in flat(out.text)
    assert [r.kind for r in out.removed] == ["scheme"]


def test_stripped_character_class_matches_unicodedata() -> None:
    """_normalize_url removes whitespace and Cc/Cf characters with one precompiled class."""
    import sys
    import unicodedata

    from context_core.gateway.output import _STRIPPED_RX

    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        want = ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")
        assert bool(_STRIPPED_RX.fullmatch(ch)) == want, hex(cp)


# Shapes that were quadratic (or worse) in the old sanitizer or are slow in markdown-it-py.
PATHOLOGICAL: list[tuple[str, Any]] = [
    ("bracket-paren run", lambda n: "](" * (n // 2)),
    ("open bracket run", lambda n: "[" * n),
    ("open brackets then unsafe link", lambda n: "[" * n + "](javascript:x)"),
    ("nested emphasis", lambda n: "*a " * (n // 3)),
    ("underscore run", lambda n: "_" * n),
    ("long label", lambda n: "[" + "a" * n + "](javascript:x)"),
    ("overlapping destinations", lambda n: "](http:x" * (n // 8)),
    ("entity destinations", lambda n: "](&" * (n // 3)),
    ("angle destinations", lambda n: "](<" * (n // 3)),
    ("unsafe definitions", lambda n: "[a]: javascript:x\n" * (n // 18)),
    ("comment openers", lambda n: "<!--" * (n // 4)),
    ("close parens after url", lambda n: "http://x" + ")" * n),
    ("backtick runs", lambda n: "".join("`" * i + "a" for i in range(1, int((2 * n) ** 0.5)))),
]


@pytest.mark.parametrize(("build"), [p[1] for p in PATHOLOGICAL], ids=[p[0] for p in PATHOLOGICAL])
def test_work_is_linear_in_the_input(
    gateway: Gateway, build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: the sanitizer's steps (scan events, parser link rules, rounds) and
    the characters its regexes and string searches are asked to look at grow linearly."""
    import context_core.gateway.output as mod

    steps = [0]
    real = mod._tick

    def counting() -> None:
        steps[0] += 1
        real()

    monkeypatch.setattr(mod, "_tick", counting)
    counts = []
    for n in (8_000, 32_000):
        steps[0] = 0
        sanitize_output(build(n), gateway=gateway)
        counts.append(steps[0])
    assert counts[1] <= 4 * counts[0] * 1.25 + 50, counts


def test_cpu_budget_stops_the_work(gateway: Gateway, tmp_path: Path) -> None:
    from context_core.errors import PayloadTooLargeError, SanitizeBudgetExceededError

    gw = Gateway(audit_path=tmp_path / "audit.jsonl")
    hostile = "[x](javascript:a) <b>b</b> http://127.0.0.1/ " * 20_000
    with pytest.raises(SanitizeBudgetExceededError) as info:
        sanitize_output(hostile, gateway=gw, budget_ms=0.001)
    err = info.value
    assert isinstance(err, PayloadTooLargeError) and type(err).http_status == 413
    assert err.details() == {"limit_ms": 0.001, "setting": "CTX_OUTPUT_SANITIZE_BUDGET_MS"}
    assert "CTX_OUTPUT_SANITIZE_BUDGET_MS" in str(err)
    assert not (tmp_path / "audit.jsonl").exists()  # nothing audited for a refused output
    assert sanitize_output("fine", gateway=gateway, budget_ms=10_000).text == "fine"


def test_hostile_shapes_cost_about_what_prose_costs(gateway: Gateway) -> None:
    """Timed against a baseline measured here (no absolute threshold): 32 KB of each hostile
    shape against 32 KB of ordinary Markdown with links. The old sanitizer took seconds on
    the bracket run (quadratic), ~1000x the prose."""
    import time

    def best(text: str) -> float:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            sanitize_output(text, gateway=gateway)
            runs.append(time.perf_counter() - t0)
        return min(runs)

    n = 32_000
    prose = (BENIGN_TOP + "Some **text** with [a link](https://example.com/x).\n\n") * 400
    base = best(prose[:n])
    for hostile in ("](" * (n // 2), "[" * n + "](javascript:x)", "](http:x" * (n // 8)):
        assert best(hostile) < 15 * base + 0.01, hostile[:20]


# --- over HTTP: off the event loop, within a CPU budget ----------------------------------------


def _open_session(c: httpx.Client, session_id: str) -> str:
    r = c.post("/v1/sessions", json={"session_id": session_id, "user_id": "u", "user_query": "q"})
    assert r.status_code == 201, r.text
    return str(r.json()["state"])


def test_healthz_answers_while_an_output_is_being_sanitized(
    svc: dict[str, Any], session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sanitizer's CPU work on a long output does not hold the event loop: while one
    output is being cleaned (held busy, computing, until this test has its /healthz answer),
    /healthz answers. On the loop, /healthz would wait for the cleaning to end. (Outputs up
    to ON_LOOP_MAX_CHARS are cleaned on the loop: this one is longer.)"""
    import threading
    import time

    marker = "SLOW-SANITIZE-MARKER"
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = Gateway.clean_text_with_findings

    def busy(self: Gateway, text: str, *args: Any, **kwargs: Any) -> Any:
        if marker in text and not entered.is_set():
            entered.set()
            deadline = time.monotonic() + 20  # a safety net only
            while not release.is_set() and time.monotonic() < deadline:
                sum(range(2000))  # CPU work, holding the GIL between switches
            finished.set()
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Gateway, "clean_text_with_findings", busy)
    long_output = f"{marker} [x](/ok) " + "an ordinary line of text\n" * 60
    assert len(long_output) > ON_LOOP_MAX_CHARS
    headers = {"X-API-Key": svc["keys"]["agent-a"]}
    with httpx.Client(base_url=svc["url"], headers=headers, timeout=60) as c:
        state = _open_session(c, session_id)
        result: dict[str, Any] = {}

        def post() -> None:
            result["r"] = c.post(
                f"/v1/sessions/{session_id}/outputs",
                json={"state": state, "trace_id": "tr-slow", "output": long_output},
            )

        t = threading.Thread(target=post)
        t.start()
        assert entered.wait(30), "the output never reached the sanitizer"
        with httpx.Client(base_url=svc["url"], timeout=60) as probe:
            health = probe.get("/healthz")
        answered_during = not finished.is_set()
        release.set()
        t.join(60)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert answered_during, "/healthz waited for the sanitizer"
        assert result["r"].status_code == 200, result["r"].text
        c.delete(f"/v1/sessions/{session_id}")


def test_a_short_output_is_cleaned_on_the_loop_a_long_one_on_the_pool(
    svc: dict[str, Any], session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output up to ON_LOOP_MAX_CHARS is cleaned where the request runs (no thread hop);
    a longer one on the sanitizer's own pool. Both come back cleaned."""
    import threading

    seen: dict[str, str] = {}
    real = Gateway.clean_text_with_findings

    def spy(self: Gateway, text: str, *args: Any, **kwargs: Any) -> Any:
        for tag in ("SHORT-MARK", "LONG-MARK"):
            if tag in text:
                seen.setdefault(tag, threading.current_thread().name)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Gateway, "clean_text_with_findings", spy)
    short = "SHORT-MARK [x](javascript:alert(1))"
    long = "LONG-MARK [x](javascript:alert(1)) " + "an ordinary line of text\n" * 60
    assert len(short) <= ON_LOOP_MAX_CHARS < len(long)
    headers = {"X-API-Key": svc["keys"]["agent-a"]}
    with httpx.Client(base_url=svc["url"], headers=headers, timeout=60) as c:
        state = _open_session(c, session_id)
        for i, text in enumerate((short, long)):
            r = c.post(
                f"/v1/sessions/{session_id}/outputs",
                json={"state": state, "trace_id": f"tr-where-{i}", "output": text},
            )
            assert r.status_code == 200, r.text
            assert "javascript" not in r.json()["output"]
        c.delete(f"/v1/sessions/{session_id}")
    assert not seen["SHORT-MARK"].startswith("ctx-sanitize"), seen
    assert seen["LONG-MARK"].startswith("ctx-sanitize"), seen


@pytest.fixture(scope="module")
def tight_svc(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("outputs-budget")
    settings, raw = service_settings(
        tmp, redis_url, max_body_bytes=256 * 1024, output_sanitize_budget_ms=0.001
    )
    with running_service(settings) as url:
        yield {"url": url, "keys": raw, "settings": settings}
    cleanup_service_keys(redis_url)


def test_output_over_the_cpu_budget_answers_413_naming_the_setting(
    tight_svc: dict[str, Any], session_id: str
) -> None:
    headers = {"X-API-Key": tight_svc["keys"]["agent-a"]}
    hostile = "[x](javascript:a) <b>b</b> http://127.0.0.1/ " * 1000  # 46 KB, under 64,000
    with httpx.Client(base_url=tight_svc["url"], headers=headers, timeout=60) as c:
        state = _open_session(c, session_id)
        r = c.post(
            f"/v1/sessions/{session_id}/outputs",
            json={"state": state, "trace_id": "tr-budget", "output": hostile},
        )
        assert r.status_code == 413, r.text
        body = r.json()
        assert body["error"] == "output_sanitize_budget_exceeded"
        assert body["setting"] == "CTX_OUTPUT_SANITIZE_BUDGET_MS"
        assert body["limit_ms"] == 0.001
        assert "CTX_OUTPUT_SANITIZE_BUDGET_MS" in body["detail"]
        assert "javascript" not in r.text and "127.0.0.1" not in r.text
        c.delete(f"/v1/sessions/{session_id}")
    traces = "".join(f.read_text() for f in tight_svc["settings"].traces_dir.glob("traces-*.jsonl"))
    assert "tr-budget" not in traces  # nothing stored for a refused output


@pytest.mark.parametrize(
    ("payload", "gone"), [c[1:] for c in RENDERER_CORPUS], ids=[c[0] for c in RENDERER_CORPUS]
)
def test_texts_over_the_token_bounds_are_cleaned_by_the_scan(
    gateway: Gateway, payload: str, gone: list[str]
) -> None:
    """Over markdown-it's cost bounds (1,024 lines) the scan's rewrite applies alone: the
    unsafe destination goes, the text around it stays."""
    filler = "A line of ordinary text.\n" * 1100
    out = sanitize_output(filler + payload + BENIGN_BOTTOM, gateway=gateway)
    for bad in gone:
        assert bad not in flat(out.text), (bad, out.text[-300:])
    unsafe = [u for u in rendered_destinations(out.text) if check_url(u) is not None]
    assert unsafe == [], out.text[-300:]
    assert out.text.startswith(filler)
