"""`ctx ingest --confluence-url`: the REST sync against a real HTTP server speaking Confluence.

Real parts: tests/confluence_server.py on a loopback port (Cloud v2 + v1 and Data Center v1
shapes), the minilm encoder, Qdrant Edge on a temp dir, and a private clamd for attachments
(the test that needs it skips, saying why, when no clamd binary is installed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluence_server import ConfluenceState, FakeAttachment, FakePage, basic, serve
from test_upload_scan import MARKER, ClamdUnavailable, make_pdf, running_clamd
from typer.testing import CliRunner

from context_core.config import Settings, get_settings
from context_core.errors import ConfluenceAuthError, ConfluenceFetchError, MassDeleteError
from context_core.ingest.confluence_client import ConfluenceClient
from context_core.ingest.sync import SpaceCursor, sync_confluence
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
USER = "mei.lin@example.com"
TOKEN = "ATATT3xFfGF0-test-token-9d1c77"  # a made-up token: must never appear in any output


def body(*paras: str, heading: str = "Overview") -> str:
    inner = "".join(f"<p>{p}</p>" for p in paras)
    return (
        f'<h2>{heading}</h2>{inner}<ac:structured-macro ac:name="info"><ac:rich-text-body>'
        f"<p>Owner: platform team.</p></ac:rich-text-body></ac:structured-macro>"
    )


def space(cloud: bool = True, key: str = "OPS", sid: str = "98305", n: int = 6) -> ConfluenceState:
    st = ConfluenceState(cloud=cloud, auth=basic(USER, TOKEN) if cloud else f"Bearer {TOKEN}")
    home = FakePage("1000", "Operations Home", key, body("Start here for runbooks."))
    st.add_space(key, sid, home)
    topics = [
        ("Deploying the API", "Deploys go out with the blue-green switch after the smoke suite."),
        ("Rotating credentials", "Rotate the database password every ninety days via the vault."),
        ("On-call handbook", "The primary on-call answers pages within fifteen minutes."),
        ("Backup and restore", "Nightly snapshots are kept for thirty days in cold storage."),
        ("Incident reviews", "Every sev-one incident gets a blameless review within a week."),
        ("Capacity planning", "Review the quarterly forecast against the cluster headroom."),
        ("Release calendar", "Releases freeze on the last Thursday of each month."),
        ("Log retention", "Application logs are kept for fourteen days, audit logs for a year."),
    ]
    for i, (title, text) in enumerate(topics[:n]):
        st.add(
            FakePage(
                str(1001 + i),
                title,
                key,
                body(text),
                parent="1000",
                when=f"2026-11-{10 + i:02d}T10:00:00.000Z",
            )
        )
    return st


def make_docx() -> bytes:
    """A small Word file written with python-docx: a heading, a paragraph, a table."""
    import io

    import docx

    doc = docx.Document()
    doc.add_heading("Escalation ladder", level=1)
    doc.add_paragraph("Page the duty manager after thirty minutes without a fix.")
    table = doc.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "Sev 1", "call the CTO"
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def cfg(tmp_path: Path, **kw: Any) -> Settings:
    base = {
        "data_dir": tmp_path / "ctx",
        "reports_dir": tmp_path / "reports",
        "confluence_user": USER,
        "confluence_token": TOKEN,
        "confluence_backoff_s": 0.01,
        "confluence_max_wait_s": 0.05,
    }
    return get_settings(**(base | kw))


def points(store: EdgeStore) -> dict[str, dict[str, Any]]:
    if store.info("knowledge_main") is None:
        return {}
    return {r.id: r.payload for r in store.scroll("knowledge_main")}


def sync(settings: Settings, url: str, store: EdgeStore, enc: Encoder, *spaces: str, **kw: Any):
    return sync_confluence(settings, url, list(spaces) or ["OPS"], store=store, encoder=enc, **kw)


@pytest.fixture
def cloud() -> Iterator[tuple[ConfluenceState, str]]:
    st = space(cloud=True)
    with serve(st) as url:
        yield st, url


def test_first_sync_noop_rerun_change_and_cursor(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str]
) -> None:
    st, url = cloud
    settings = cfg(tmp_path)
    with EdgeStore(settings.qdrant_dir) as store:
        (first,) = sync(settings, url, store, encoder)
        s = first.summary
        assert (s.pages_new, s.pages_deleted, s.pages_quarantined) == (7, 0, 0)
        assert first.bodies_fetched == 7 and st.bodies_served() >= 1
        stored = points(store)
        assert len(stored) == s.chunks_written > 0
        titles = {p["title"] for p in stored.values()}
        assert "Deploying the API" in titles
        deploy = next(p for p in stored.values() if p["title"] == "Deploying the API")
        assert deploy["scope"] == f"{url}#OPS" and deploy["url"].startswith(url)
        assert deploy["section"] == "Deploying the API"  # the home is not the area
        site = ConfluenceClient(url).site
        cursor = json.loads(SpaceCursor.path(settings, site, "OPS").read_text())
        assert cursor["pages"]["1001"] == 1 and cursor["last_when"]

        # no change: ids and versions listed, no body fetched, nothing written
        st.log.clear()
        (again,) = sync(settings, url, store, encoder)
        assert again.bodies_fetched == 0 and st.bodies_served() == 0
        assert (again.summary.chunks_written, again.summary.chunks_deleted) == (0, 0)
        assert again.summary.pages_unchanged == 7
        assert points(store) == stored

        # one page edited: only its chunks change
        st.edit("1003", body("The primary on-call acknowledges within five minutes now."))
        st.log.clear()
        (third,) = sync(settings, url, store, encoder)
        assert third.bodies_fetched == 1 and third.summary.pages_changed == 1
        after = points(store)
        changed = {pid for pid in after if after[pid] != stored.get(pid)}
        assert changed and all(after[p]["source"] == "1003" for p in changed)
        assert any("five minutes" in after[p]["text"] for p in changed)
        assert {p for p in stored if stored[p]["source"] != "1003"} <= set(after)


def test_deleted_page_is_guarded_then_removed(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str]
) -> None:
    st, url = cloud
    settings = cfg(tmp_path)
    with EdgeStore(settings.qdrant_dir) as store:
        sync(settings, url, store, encoder)
        before = points(store)
        # one trashed page (1 of 7 = 14%, under the 20% share): deleted on the next run
        st.pages["1002"].status = "trashed"
        (r,) = sync(settings, url, store, encoder)
        assert r.summary.pages_deleted == 1
        left = points(store)
        assert "1002" not in {p["source"] for p in left.values()}
        assert len(left) == len(before) - sum(1 for p in before.values() if p["source"] == "1002")
        # three more gone (3 of 6 = 50%): refused, nothing changes, message about Confluence
        for pid in ("1003", "1004", "1005"):
            del st.pages[pid]
        with pytest.raises(MassDeleteError) as e:
            sync(settings, url, store, encoder)
        assert "Confluence" in str(e.value) and "export path" not in str(e.value)
        assert "--allow-deletes" in str(e.value)
        assert points(store) == left
        (r,) = sync(settings, url, store, encoder, allow_deletes=True)
        assert r.summary.pages_deleted == 3
        assert {p["source"] for p in points(store).values()} == {"1000", "1001", "1006"}


def test_throttling_is_survived_and_a_storm_past_the_budget_changes_nothing(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str]
) -> None:
    st, url = cloud
    settings = cfg(tmp_path)
    with EdgeStore(settings.qdrant_dir) as store:
        # Retry-After: 1 s, capped by CTX_CONFLUENCE_MAX_WAIT_S (0.05 here) -> exactly 3 x 0.05;
        # jittered backoff alone (0.01 x 2^n, random) could not add up to that
        st.throttle, st.retry_after = 3, "1"
        (r,) = sync(settings, url, store, encoder)
        assert r.requests["throttled"] == 3 and r.requests["retries"] == 3
        assert r.requests["waited_s"] == pytest.approx(0.15, abs=0.001)
        assert r.summary.pages_new == 7
        before = points(store)
        cursor = SpaceCursor.path(settings, ConfluenceClient(url).site, "OPS")
        cursor_text = cursor.read_text()

        st.edit("1001", body("A change that must not land while the site is failing."))
        st.errors = 1000  # a 5xx storm: retries run out
        with pytest.raises(ConfluenceFetchError, match=r"HTTP 50[03]"):
            sync(settings, url, store, encoder)
        assert points(store) == before and cursor.read_text() == cursor_text

        st.errors = 0
        tight = cfg(tmp_path, confluence_max_requests=2)
        with pytest.raises(ConfluenceFetchError, match="CTX_CONFLUENCE_MAX_REQUESTS"):
            sync(tight, url, store, encoder)
        assert points(store) == before and cursor.read_text() == cursor_text


def test_bad_credentials_stop_at_once_naming_the_setting_and_never_the_token(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str], caplog: Any
) -> None:
    st, url = cloud
    caplog.set_level("DEBUG")
    with EdgeStore(cfg(tmp_path).qdrant_dir) as store:
        wrong = cfg(tmp_path, confluence_token="not-the-token")
        with pytest.raises(ConfluenceAuthError) as e:
            sync(wrong, url, store, encoder)
        msg = str(e.value)
        assert "401" in msg and "CTX_CONFLUENCE_TOKEN" in msg and "CTX_CONFLUENCE_USER" in msg
        assert len(st.log) == 1  # stopped at once, no retries
        assert points(store) == {}
        st.forbidden = True
        with pytest.raises(ConfluenceAuthError, match=r"403.*permission"):
            sync(cfg(tmp_path), url, store, encoder)
        st.forbidden = False
        results = sync(cfg(tmp_path), url, store, encoder)
        text = json.dumps([r.to_dict() for r in results]) + msg + caplog.text
        text += (tmp_path / "reports" / "ingest_summary.json").read_text()
        text += (tmp_path / "reports" / "confluence_sync.json").read_text()
    assert TOKEN not in text and "not-the-token" not in text


def test_data_center_bearer_token_and_two_sites_never_collide(
    tmp_path: Path, encoder: Encoder
) -> None:
    # same space key and page ids on a Cloud site and a Data Center site
    a, b = space(cloud=True), space(cloud=False)
    b.pages["1001"].body = body("Data Center deploys are run by the release manager by hand.")
    settings = cfg(tmp_path)
    dc = cfg(tmp_path, confluence_user=None)  # token alone -> Bearer
    with serve(a) as url_a, serve(b) as url_b, EdgeStore(settings.qdrant_dir) as store:
        (ra,) = sync(settings, url_a, store, encoder)
        (rb,) = sync(dc, url_b, store, encoder)
        assert ra.summary.pages_new == rb.summary.pages_new == 7
        assert not any("/api/v2/" in s.path for s in b.log)  # DC: v1 only
        both = points(store)
        assert len(both) == ra.summary.chunks_written + rb.summary.chunks_written
        scopes = {p["scope"] for p in both.values()}
        assert scopes == {f"{url_a}#OPS", f"{url_b}#OPS"}
        # a re-sync of site A deletes nothing of site B's
        del a.pages["1006"]
        (ra2,) = sync(settings, url_a, store, encoder)
        assert ra2.summary.pages_deleted == 1
        left = points(store)
        assert sum(1 for p in left.values() if p["scope"] == f"{url_b}#OPS") == sum(
            1 for p in both.values() if p["scope"] == f"{url_b}#OPS"
        )


def test_retry_after_seconds_and_http_dates() -> None:
    from email.utils import format_datetime

    from context_core.ingest.confluence_client import _retry_after_s

    assert _retry_after_s("7") == 7.0 and _retry_after_s(None) is None
    assert _retry_after_s("soon") is None
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < (_retry_after_s(when) or 0) <= 30


def test_pagination_follows_links_next() -> None:
    st = space(cloud=True, n=8)
    with serve(st) as url:
        client = ConfluenceClient(url, user=USER, token=TOKEN)
        ids = [r["id"] for r in client.paginate("/api/v2/spaces/98305/pages", {"limit": 3})]
        assert len(ids) == 9 and len(set(ids)) == 9
        assert client.stats.requests == 3
        st.link_header = True  # the v2 API's other way of saying where the next page is
        again = [r["id"] for r in client.paginate("/api/v2/spaces/98305/pages", {"limit": 4})]
        assert again == ids
        v1 = list(
            client.paginate(
                "/rest/api/content/search", {"cql": 'space = "OPS" and type = page', "limit": 4}
            )
        )
        assert len(v1) == 9


def test_a_hung_server_times_out_and_a_foreign_link_is_not_followed() -> None:
    import time

    st = space(cloud=True)
    with serve(st) as url:
        st.hang_s = 1.0
        client = ConfluenceClient(
            url, user=USER, token=TOKEN, timeout_s=0.2, max_retries=1, backoff_s=0.01
        )
        t0 = time.perf_counter()
        with pytest.raises(ConfluenceFetchError, match="cannot reach"):
            client.get_json("/api/v2/spaces", {"keys": "OPS"})
        assert time.perf_counter() - t0 < 1.5 and client.stats.requests == 2
        st.hang_s = 0.0
        st.foreign_next = "http://collector.invalid/steal?cursor=1"
        client = ConfluenceClient(url, user=USER, token=TOKEN)
        with pytest.raises(ConfluenceFetchError, match="another host"):
            list(client.paginate("/api/v2/spaces/98305/pages", {"limit": 2}))
        assert TOKEN not in repr(client.session.auth) + repr(vars(client))


@pytest.fixture(scope="module")
def clamd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        with running_clamd(tmp_path_factory.mktemp("clamd")) as (url, _proc):
            yield url
    except ClamdUnavailable as e:
        pytest.skip(f"clamd unavailable: {e}")


def test_attachments_ingested_or_skipped_with_reasons(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str], clamd: str
) -> None:
    st, url = cloud
    pdf = make_pdf([["Failover drill checklist", "Switch the primary region during the drill."]])
    st.attachments["1001"] = [
        FakeAttachment("att1", "failover.pdf", "application/pdf", pdf),
        FakeAttachment("att2", "notes.txt", "text/plain", b"Rollback takes four minutes."),
        FakeAttachment("att3", "diagram.png", "image/png", b"\x89PNG\r\n\x1a\n" + b"0" * 64),
        FakeAttachment("att4", "dropper.txt", "text/plain", f"payload {MARKER}".encode()),
        FakeAttachment("att5", "big.txt", "text/plain", b"x " * 40_000),
        FakeAttachment("att6", "secret.txt", "text/plain", b"Project Nightjar budget."),
        FakeAttachment("att7", "broken.pdf", "application/pdf", b"%PDF-1.4 not really"),
        FakeAttachment("att8", "escalation.docx", DOCX, make_docx()),
        FakeAttachment("att9", "budget.xlsx", XLSX, b"PK\x03\x04 spreadsheet"),
    ]
    settings = cfg(tmp_path, clamd_url=clamd, upload_max_bytes=50_000, blocked_keywords="nightjar")
    with EdgeStore(settings.qdrant_dir) as store:
        (r,) = sync(settings, url, store, encoder)
        assert r.attachments_ingested == 3
        assert r.attachments_skipped == {
            "type_not_allowed": 2,
            "infected": 1,
            "too_large": 1,
            "blocked_keyword": 1,
            "extract_failed": 1,
        }
        att = [p for p in points(store).values() if p.get("attachment")]
        assert {p["attachment"] for p in att} == {"failover.pdf", "notes.txt", "escalation.docx"}
        word = [p for p in att if p["attachment"] == "escalation.docx"]
        assert any("Escalation ladder" in p["heading_path"] for p in word)
        assert any("call the CTO" in p["text"] for p in word)
        pdf_chunk = next(p for p in att if p["attachment"] == "failover.pdf")
        assert pdf_chunk["page"] == "1001" and "/download/attachments/1001/" in pdf_chunk["url"]
        assert "primary region" in pdf_chunk["text"]
        # unchanged attachments are not downloaded again
        st.log.clear()
        (again,) = sync(settings, url, store, encoder)
        assert st.downloads() == 0 and again.summary.chunks_written == 0
        # a page edit re-lists its attachments; unchanged ones are still not downloaded
        st.edit("1001", body("Deploys now need two approvals."))
        st.log.clear()
        (third,) = sync(settings, url, store, encoder)
        assert st.downloads() == 0 and third.attachments_unchanged == 3
        # an attachment added to page 1002 without editing the page: found by the attachment
        # search, only it is downloaded, and the page's chunks stay as they are
        st.attachments["1002"] = [
            FakeAttachment(
                "att10",
                "restore.md",
                "text/markdown",
                b"# Restore drill\nRestores are rehearsed every quarter.",
                when="2026-12-02T08:00:00.000Z",
            )
        ]
        st.log.clear()
        (fourth,) = sync(settings, url, store, encoder)
        assert st.downloads() == 1 and fourth.attachments_ingested == 1
        assert fourth.summary.pages_changed == 0 and fourth.summary.pages_new == 1
        assert any(p.get("attachment") == "restore.md" for p in points(store).values())


def test_cli_syncs_a_space_and_prints_the_summary(
    tmp_path: Path, cloud: tuple[ConfluenceState, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from context_app.cli import app

    st, url = cloud
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("CTX_CONFLUENCE_USER", USER)
    monkeypatch.setenv("CTX_CONFLUENCE_TOKEN", TOKEN)
    runner = CliRunner()
    out = runner.invoke(app, ["ingest", "--confluence-url", url, "--space", "OPS", "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "pages new" in out.output and "bodies fetched" in out.output
    again = runner.invoke(
        app, ["ingest", "--confluence-url", url, "--space", "OPS", "--no-progress"]
    )
    assert again.exit_code == 0 and TOKEN not in out.output + again.output
    # two of the seven pages gone: refused by the guard, then allowed
    for pid in ("1001", "1002"):
        del st.pages[pid]
    args = ["ingest", "--confluence-url", url, "--space", "OPS", "--no-progress"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1 and "refusing to delete 2 of 7" in refused.output
    allowed = runner.invoke(app, [*args, "--allow-deletes"])
    assert allowed.exit_code == 0, allowed.output
    assert re.search(r"pages deleted\s*│\s*2\b", allowed.output)
    nospace = runner.invoke(app, ["ingest", "--confluence-url", url])
    assert nospace.exit_code == 1 and "at least one --space" in nospace.output
    both = runner.invoke(app, ["ingest", str(tmp_path), "--confluence-url", url, "--space", "X"])
    assert both.exit_code == 1 and "not both" in both.output
    monkeypatch.setenv("CTX_CONFLUENCE_TOKEN", "wrong")
    bad = runner.invoke(app, ["ingest", "--confluence-url", url, "--space", "OPS"])
    assert bad.exit_code == 1 and "CTX_CONFLUENCE_TOKEN" in bad.output


def test_a_page_without_text_is_quarantined_once_not_fetched_on_every_run(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str]
) -> None:
    st, url = cloud
    st.add(
        FakePage(
            "1100", "Team pages", "OPS", '<ac:structured-macro ac:name="children"/>', parent="1000"
        )
    )
    settings = cfg(tmp_path)
    with EdgeStore(settings.qdrant_dir) as store:
        (first,) = sync(settings, url, store, encoder)
        assert first.summary.pages_quarantined == 1 and first.summary.pages_new == 7
        lines = (tmp_path / "reports" / "quarantine.jsonl").read_text().splitlines()
        assert any("/pages/1100" in ln and "no text" in ln for ln in lines)
        for _ in range(2):  # the quarantine is remembered across runs, not just the next one
            st.log.clear()
            (again,) = sync(settings, url, store, encoder)
            assert again.bodies_fetched == 0 and st.bodies_served() == 0
        st.edit("1100", body("Now the page lists the team's rota."))
        (fixed,) = sync(settings, url, store, encoder)
        assert fixed.bodies_fetched == 1 and fixed.summary.pages_new == 1


def test_word_extraction_reads_headings_and_tables_and_refuses_bombs() -> None:
    import io
    import zipfile

    from context_core.errors import UploadTooLargeError, UploadUnreadableError
    from context_core.ingest.upload import extract_sections, resolve_type

    assert resolve_type("x.docx", None)[1] == "docx"
    _, sections, _, _ = extract_sections(make_docx(), "docx")
    assert sections[0].heading_path == ("Escalation ladder",)
    assert "thirty minutes" in sections[0].text and "Sev 1 | call the CTO" in sections[0].text
    with pytest.raises(UploadUnreadableError, match="not a zip"):
        extract_sections(b"just text pretending", "docx")
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("word/document.xml", b"\0" * (40 * 1024 * 1024))
    assert len(bomb.getvalue()) < 200_000
    with pytest.raises(UploadTooLargeError, match="unpacks to"):
        extract_sections(bomb.getvalue(), "docx")


def test_several_spaces_are_all_read_before_any_write(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str]
) -> None:
    st, url = cloud
    st.add_space("SEC", "98306", FakePage("2000", "Security Home", "SEC", body("Report it.")))
    settings = cfg(tmp_path)
    with EdgeStore(settings.qdrant_dir) as store:
        with pytest.raises(ConfluenceFetchError, match="no space 'NOPE'"):
            sync(settings, url, store, encoder, "OPS", "NOPE")
        assert points(store) == {}  # OPS was read fine, but nothing was written
        assert not SpaceCursor.path(settings, ConfluenceClient(url).site, "OPS").exists()
        ops, sec = sync(settings, url, store, encoder, "OPS", "SEC")
        assert (ops.summary.pages_new, sec.summary.pages_new) == (7, 1)
        report = json.loads((tmp_path / "reports" / "confluence_sync.json").read_text())
        assert [s["space"] for s in report["spaces"]] == ["OPS", "SEC"]


def test_a_page_the_search_misses_is_read_by_id_v1_then_v2(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str]
) -> None:
    """A page moved in from another space keeps its old modification date, so the
    incremental CQL search does not return it: it is read by id (v2 when v1 has no such id)."""
    st, url = cloud
    settings = cfg(tmp_path)
    with EdgeStore(settings.qdrant_dir) as store:
        sync(settings, url, store, encoder)
        st.add(
            FakePage(
                "1200",
                "Moved here: DNS runbook",
                "OPS",
                body("Flush the resolver cache before blaming the network."),
                parent="1000",
                when="2026-06-01T10:00:00.000Z",
            )
        )
        st.v1_content_missing = True
        st.log.clear()
        (r,) = sync(settings, url, store, encoder)
        assert r.summary.pages_new == 1 and r.bodies_fetched == 1
        assert any(s.path.endswith("/api/v2/pages/1200") for s in st.log)
        moved = [p for p in points(store).values() if p["source"] == "1200"]
        assert moved and "resolver cache" in moved[0]["text"]
        del st.pages["1200"]  # gone again (v1 and v2 both 404): deleted from L3
        (gone,) = sync(settings, url, store, encoder)
        assert gone.summary.pages_deleted == 1
        assert not [p for p in points(store).values() if p["source"] == "1200"]


def test_a_cloud_site_without_v1_content_search_is_read_through_v2(
    tmp_path: Path, encoder: Encoder, cloud: tuple[ConfluenceState, str]
) -> None:
    st, url = cloud
    st.v1_content_missing = "all"
    settings = cfg(tmp_path)
    with EdgeStore(settings.qdrant_dir) as store:
        (r,) = sync(settings, url, store, encoder)
        assert r.summary.pages_new == 7 and r.bodies_fetched == 7
        assert sum(1 for s in st.log if s.path.startswith("/wiki/rest/api/content/1")) == 0
        (again,) = sync(settings, url, store, encoder)
        assert again.bodies_fetched == 0 and again.summary.chunks_written == 0
