"""Issue 9, reader side: page exports whose index.html *is* the page, export description
(kind / complete), bounded reading of zips and folders (per-page and per-export byte caps,
zip-slip names), and hostile markup (deep nesting, entity tricks) that must end as Quarantined
records, never as an exception, a hang or a silently truncated page.

Every fixture is written by the project: tests/fixtures/confluence/page-export-zh/index.html
(hand-written) or files built here in tmp_path.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from context_core.errors import BackendUnavailableError, IngestError
from context_core.ingest import Page, Quarantined, read_html_export
from context_core.ingest import archive as archive_mod
from context_core.ingest.archive import read_capped, unsafe_member_name
from context_core.ingest.confluence import describe_export, parse_export_page
from context_core.ingest.rest import ConfluenceRestSource
from context_core.ingest.storage import parse_storage_page
from context_core.sample_data import sample_export_path

FIXTURES = Path(__file__).parent / "fixtures" / "confluence"
ZH_EXPORT = FIXTURES / "page-export-zh"
SAMPLE = sample_export_path()


def _results(path: Path, **kw: object) -> tuple[list[Page], list[Quarantined]]:
    pages: list[Page] = []
    bad: list[Quarantined] = []
    for r in read_html_export(path, **kw):  # type: ignore[arg-type]
        (pages if isinstance(r, Page) else bad).append(r)  # type: ignore[arg-type]
    return pages, bad


def _page_html(title: str, body: str, *, space: str = "Test Space", head: str = "") -> str:
    return f"""<!DOCTYPE html><html><head><title>{space} : {title}</title>{head}</head><body>
<div id="page"><div id="main-header"><div id="breadcrumb-section"><ol id="breadcrumbs">
<li class="first"><span><a href="index.html">{space}</a></span></li>
<li><span><a href="Home_1.html">Home</a></span></li></ol></div>
<h1 id="title-heading"><span id="title-text">{space} : {title}</span></h1></div>
<div id="content"><div class="page-metadata">Created by <span class='author'>A</span>, last
modified on Jun 29, 2019</div>
<div id="main-content" class="wiki-content group">{body}</div></div>
</div></body></html>"""


def _zip_folder(folder: Path, archive: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                zf.write(f, f"{prefix}{f.relative_to(folder)}")
    return archive


# --- index.html that is a page ------------------------------------------------------------


@pytest.fixture(params=["folder", "zip"])
def zh_export(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "folder":
        return ZH_EXPORT
    archive = _zip_folder(ZH_EXPORT, tmp_path / "页面导出.zip", prefix="页面导出/")
    with zipfile.ZipFile(archive, "a") as zf:  # attachments travel along, never read as pages
        for n in (1, 2):
            zf.writestr(f"页面导出/attachments/123456/{n}.png", b"\x89PNG not really")
    return archive


def test_page_export_index_is_the_page(zh_export: Path):
    pages, bad = _results(zh_export)
    assert bad == []
    (page,) = pages
    assert page.page_id == "123456"  # from the attachments/123456/... links
    assert page.space == "空间"  # the space name from the first breadcrumb / "空间 : 页面"
    assert page.title == "页面"
    assert page.author == "张三"
    assert page.updated_at == datetime(2018, 1, 11, tzinfo=UTC)
    assert page.date_source == "metadata"
    assert page.ancestors == ("设备",)  # space link and home page dropped
    assert page.ancestor_ids == ("100002",)
    assert [s.heading_path for s in page.sections] == [(), ("巡检",), ("巡检", "记录")]
    assert page.sections[1].text == "每班检查一次轴承温度。\n温度超过 80 ℃ 时停机并报告值班长。"
    assert len(page.attachments) == 20 and page.attachments[0] == "截图-01.png"
    assert "Document generated" not in page.text
    assert page.source_path.endswith("index.html")

    (override,) = read_html_export(zh_export, space="KJ")
    assert isinstance(override, Page)
    assert (override.space, override.page_id, override.content_hash) == (
        "KJ",
        "123456",
        page.content_hash,
    )


def test_page_export_description(zh_export: Path):
    info = describe_export(zh_export)
    assert (info.kind, info.complete) == ("page", False)
    assert (info.space_key, info.space_name) == ("空间", "空间")
    assert info.tree == {}


def test_page_export_space_falls_back_to_the_stem(tmp_path: Path):
    export = tmp_path / "KJ-export"
    export.mkdir()
    html = (ZH_EXPORT / "index.html").read_text(encoding="utf-8")
    html = html.replace(">空间</a>", "></a>").replace("空间 : 页面", "页面")  # no space name
    (export / "index.html").write_text(html, encoding="utf-8")
    assert describe_export(export).space_key == "KJ-export"
    (page,) = read_html_export(export)
    assert isinstance(page, Page)
    assert (page.space, page.title, page.page_id) == ("KJ-export", "页面", "123456")


def _id_of(html: str, *, space: str = "S", file_name: str = "index.html") -> str:
    r = parse_export_page(
        html.encode(), file_name=file_name, source_path="mem", mtime=0.0, space=space
    )
    assert isinstance(r, Page), r
    return r.page_id


def test_content_page_id_fallbacks():
    link = '<a href="attachments/{0}/a.png">a.png</a>'
    # most common attachments id wins (a page may embed another page's image)
    body = "<p>x</p>" + link.format(555) * 3 + link.format(777)
    assert _id_of(_page_html("T", body)) == "555"
    # a tie is ambiguous: fall through to the page-id meta tag
    tie = "<p>x</p>" + link.format(555) + link.format(777)
    meta = '<meta name="ajs-page-id" content="424242">'
    assert _id_of(_page_html("T", tie, head=meta)) == "424242"
    assert _id_of(_page_html("T", '<p data-page-id="9001">x</p>')) == "9001"
    # links elsewhere (absolute download URLs) are not the page's own attachments
    remote = '<p>x <a href="https://w.example/download/attachments/31/f.png">f</a></p>'
    digest = hashlib.sha256(b"S\x1fT").hexdigest()[:16]
    assert _id_of(_page_html("T", remote)) == f"page-{digest}"
    # an id in the file name always wins
    assert _id_of(_page_html("T", body), file_name="T_123.html") == "123"


def test_page_files_without_ids_in_their_names(tmp_path: Path):
    export = tmp_path / "loose"
    export.mkdir()
    (export / "Some-Title.html").write_text(
        _page_html("Some Title", "<p>text</p>"), encoding="utf-8"
    )
    (export / "Other-Title.html").write_text(
        _page_html("Other", '<p>text</p><a href="attachments/31337/x.pdf">x.pdf</a>'),
        encoding="utf-8",
    )
    info = describe_export(export)
    assert (info.kind, info.complete, info.space_key) == ("pages", False, "loose")
    pages, bad = _results(export)
    assert bad == []
    by_title = {p.title: p for p in pages}
    digest = hashlib.sha256(b"loose\x1fSome Title").hexdigest()[:16]
    assert by_title["Some Title"].page_id == f"page-{digest}"
    assert by_title["Other"].page_id == "31337"
    again, _ = _results(export)  # stable across runs
    assert [p.page_id for p in again] == [p.page_id for p in pages]


@pytest.mark.parametrize("as_zip", [False, True])
def test_only_an_unrelated_index_html_yields_nothing(tmp_path: Path, as_zip: bool):
    export = tmp_path / "site"
    export.mkdir()
    (export / "index.html").write_text(
        "<html><head><title>My site</title></head><body><div id='main-content'>"
        "<h1>Welcome</h1><p>Not a Confluence page.</p></div></body></html>",
        encoding="utf-8",
    )
    path = _zip_folder(export, tmp_path / "site.zip") if as_zip else export
    assert list(read_html_export(path)) == []
    info = describe_export(path)
    assert (info.kind, info.complete, info.space_key) == ("pages", False, "site")


def test_empty_index_html_is_unrelated(tmp_path: Path):
    (tmp_path / "index.html").write_bytes(b"")
    (tmp_path / "Fine_900000001.html").write_text(_page_html("Fine", "<p>ok</p>"))
    info = describe_export(tmp_path)
    assert (info.kind, info.complete) == ("pages", False)
    (page,) = read_html_export(tmp_path)
    assert isinstance(page, Page) and page.page_id == "900000001"


def test_space_export_is_complete(tmp_path: Path):
    info = describe_export(SAMPLE)
    assert (info.kind, info.complete, info.space_key) == ("space", True, "EQM")
    assert info.home_id == "720000001" and len(info.tree) == 17
    zipped = describe_export(_zip_folder(SAMPLE, tmp_path / "EQM-export.zip", prefix="EQM/"))
    assert zipped == info
    # the space index is never yielded as a page
    pages, bad = _results(SAMPLE)
    assert len(pages) + len(bad) == 17
    sources = [p.source_path for p in pages] + [q.source_path for q in bad]
    assert not any(s.endswith("index.html") for s in sources)


def test_unreadable_export_paths_still_raise(tmp_path: Path):
    with pytest.raises(IngestError, match="does not exist"):
        describe_export(tmp_path / "nope")
    with pytest.raises(IngestError, match="does not exist"):
        list(read_html_export(tmp_path / "nope"))
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    with pytest.raises(IngestError, match=r"neither a folder nor a \.zip"):
        list(read_html_export(tmp_path / "notes.txt"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IngestError, match=r"no \.html pages"):
        list(read_html_export(empty))


def test_oversized_index_html_is_a_clear_error(tmp_path: Path):
    export = tmp_path / "big"
    export.mkdir()
    (export / "index.html").write_text(_page_html("T", "<p>" + "x " * 10_000 + "</p>"))
    with pytest.raises(IngestError, match=r"index\.html.*max_page_bytes=1000.*CTX_MAX_PAGE_BYTES"):
        describe_export(export, max_page_bytes=1000)


# --- bounded archives ---------------------------------------------------------------------

CAP = 10_000
BOMB_BYTES = 50 * 1024 * 1024


def _bomb_zip(path: Path) -> Path:
    """A zip with one 50 MB (uncompressed) page member, written in pieces, plus good pages."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("EQM/Good-One_900000001.html", _page_html("Good one", "<p>first</p>"))
        with zf.open("EQM/Bomb_900000002.html", "w") as member:
            piece = b"<p>" + b"a" * (1024 * 1024 - 7) + b"</p>\n"
            for _ in range(BOMB_BYTES // len(piece)):
                member.write(piece)
        zf.writestr("EQM/Good-Two_900000003.html", _page_html("Good two", "<p>second</p>"))
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bomb_zip(tmp_path_factory.mktemp("bomb") / "bomb.zip")


def test_oversized_zip_member_is_refused_from_its_header(bomb: Path, monkeypatch):
    opened: list[str] = []
    real_open = zipfile.ZipFile.open

    def spy(self, name, *a, **kw):
        opened.append(getattr(name, "filename", name))
        return real_open(self, name, *a, **kw)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    pages, bad = _results(bomb, max_page_bytes=CAP)
    assert sorted(p.title for p in pages) == ["Good one", "Good two"]
    (q,) = bad
    assert q.source_path.endswith("!/EQM/Bomb_900000002.html")
    assert q.reason.startswith("page is ") and "uncompressed" in q.reason
    assert "max_page_bytes=10000" in q.reason and "CTX_MAX_PAGE_BYTES" in q.reason
    assert "EQM/Bomb_900000002.html" not in opened  # refused without reading a byte


def test_oversized_zip_member_is_refused_while_streaming(bomb: Path, monkeypatch):
    """Headers can lie: with the header check switched off, the counted, streamed read alone
    stops the member after cap + 1 bytes of decompressed data."""
    monkeypatch.setattr(archive_mod, "_declared_size", lambda info: None)
    produced: dict[str, int] = {}
    real_read = zipfile.ZipExtFile.read

    def counting_read(self, n=-1):
        data = real_read(self, n)
        produced[self.name] = produced.get(self.name, 0) + len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting_read)
    pages, bad = _results(bomb, max_page_bytes=CAP)
    assert len(pages) == 2
    (q,) = bad
    assert q.reason == (
        "page is over max_page_bytes=10000 (uncompressed; raise CTX_MAX_PAGE_BYTES to ingest it)"
    )
    assert produced["EQM/Bomb_900000002.html"] == CAP + 1  # never the 50 MB


def test_read_capped_stops_an_endless_stream():
    class Endless(io.RawIOBase):
        served = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            b[:] = b"x" * len(b)
            self.served += len(b)
            return len(b)

    stream = Endless()
    data = read_capped(stream, 3 * 1024 * 1024)
    assert len(data) == 3 * 1024 * 1024 + 1
    assert stream.served == len(data)


@pytest.mark.parametrize("as_zip", [False, True])
def test_export_byte_budget_quarantines_the_rest(tmp_path: Path, as_zip: bool):
    export = tmp_path / "many"
    export.mkdir()
    for i in range(5):
        (export / f"Page-{i}_90000001{i}.html").write_text(
            _page_html(f"Page {i}", "<p>" + "word " * 400 + "</p>"), encoding="utf-8"
        )
    size = (export / "Page-0_900000010.html").stat().st_size
    path = _zip_folder(export, tmp_path / "many.zip") if as_zip else export
    pages, bad = _results(path, max_export_bytes=2 * size + size // 2)
    assert [p.title for p in pages] == ["Page 0", "Page 1"]
    assert len(bad) == 3
    for q in bad:
        assert "over max_export_bytes=" in q.reason and "CTX_MAX_EXPORT_BYTES" in q.reason


def test_zip_slip_member_names_are_refused(tmp_path: Path):
    archive = tmp_path / "slip.zip"
    hostile = [
        "../evil_900000001.html",
        "/abs_900000002.html",
        "EQM\\..\\..\\win_900000003.html",
        "EQM/../../up_900000004.html",
        "C:/drive_900000005.html",
        "../../etc/cron.d/job",
    ]
    with zipfile.ZipFile(archive, "w") as zf:
        for name in hostile:
            zf.writestr(zipfile.ZipInfo(name), _page_html("Evil", "<p>evil</p>"))
        zf.writestr("Fine_900000009.html", _page_html("Fine", "<p>fine</p>"))
    pages, bad = _results(archive)
    assert [p.title for p in pages] == ["Fine"]
    assert sorted(q.source_path.split("!/", 1)[1] for q in bad) == sorted(hostile)
    for q in bad:
        assert "zip-slip" in q.reason and "never read" in q.reason
    assert not (tmp_path.parent / "evil_900000001.html").exists()
    assert unsafe_member_name("EQM/attachments/1/a.png") is None
    assert unsafe_member_name("a/./b.html") is None


def test_folder_symlink_out_of_the_export_is_refused(tmp_path: Path):
    outside = tmp_path / "secret.html"
    outside.write_text(_page_html("Secret", "<p>secret</p>"), encoding="utf-8")
    export = tmp_path / "export"
    export.mkdir()
    (export / "Fine_900000009.html").write_text(_page_html("Fine", "<p>ok</p>"))
    (export / "Link_900000008.html").symlink_to(outside)
    pages, bad = _results(export)
    assert [p.title for p in pages] == ["Fine"]
    assert [Path(q.source_path).name for q in bad] == ["Link_900000008.html"]
    assert "outside the export" in bad[0].reason


# --- deep or hostile markup -----------------------------------------------------------------


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deep_html_is_quarantined_not_truncated(tmp_path: Path, depth: int):
    export = tmp_path / "deep"
    export.mkdir()
    body = "<div>" * depth + "deep text" + "</div>" * depth + "<p>after the nest</p>"
    (export / "Deep_900000001.html").write_text(_page_html("Deep", body), encoding="utf-8")
    (export / "Fine_900000002.html").write_text(_page_html("Fine", "<p>ok</p>"))
    t0 = time.perf_counter()
    pages, bad = _results(export)
    assert time.perf_counter() - t0 < 30
    assert [p.title for p in pages] == ["Fine"]
    (q,) = bad
    # libxml2's HTML parser stops building the tree at 256 levels (silently, in recover
    # mode): the reader notices and says so instead of ingesting a cut-off page
    assert q.reason.startswith("markup nested more than 256 deep, over max_markup_depth=200")
    assert "the parser stops" in q.reason


def test_html_depth_over_the_setting(tmp_path: Path):
    body = "<div>" * 60 + "x" + "</div>" * 60
    r = parse_export_page(
        _page_html("Deep", body).encode(),
        file_name="Deep_1.html",
        source_path="mem",
        mtime=0.0,
        space="S",
        max_markup_depth=50,
    )
    assert isinstance(r, Quarantined)
    assert r.reason == (
        "markup nested 65 deep, over max_markup_depth=50 (raise CTX_MAX_MARKUP_DEPTH to ingest it)"
    )
    ok = parse_export_page(
        _page_html("Deep", body).encode(),
        file_name="Deep_1.html",
        source_path="mem",
        mtime=0.0,
        space="S",
        max_markup_depth=65,
    )
    assert isinstance(ok, Page) and ok.text == "x"


def test_recursion_error_in_rendering_is_a_quarantine(monkeypatch):
    import context_core.ingest.confluence as confluence

    def boom(_body):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(confluence, "render_sections", boom)
    r = parse_export_page(
        _page_html("T", "<p>x</p>").encode(),
        file_name="T_1.html",
        source_path="mem",
        mtime=0.0,
        space="S",
    )
    assert isinstance(r, Quarantined) and "too deep to render" in r.reason


def _storage(xhtml: str, **kw: object) -> Page:
    args: dict[str, object] = {
        "page_id": "1",
        "title": "T",
        "space": "S",
        "updated_at": datetime(2024, 5, 1, tzinfo=UTC),
    }
    args.update(kw)
    return parse_storage_page(xhtml, **args)  # type: ignore[arg-type]


def test_deep_storage_format_is_refused():
    deep = "<div>" * 2_000 + "x" + "</div>" * 2_000
    with pytest.raises(IngestError) as e:
        _storage(deep)
    assert str(e.value) == (
        "markup nested 2000 deep, over max_markup_depth=200 "
        "(raise CTX_MAX_MARKUP_DEPTH to ingest it)"
    )
    deeper = "<div>" * 100_000 + "x" + "</div>" * 100_000
    with pytest.raises(IngestError, match=r"more than 2047 deep.*parser stops"):
        _storage(deeper)
    assert _storage("<div>" * 150 + "x" + "</div>" * 150).text == "x"
    # a setting raised past what the recursive converter can take still ends as a reason
    with pytest.raises(IngestError, match="too deep to convert"):
        _storage(deep, max_markup_depth=5_000)


BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
        for i in range(1, 10)
    )
    + "]><p>start &lol9; end</p>"
)
XXE = '<!DOCTYPE x [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><p>a &xxe; b</p>'


@pytest.mark.parametrize("body", [BILLION_LAUGHS, XXE], ids=["billion-laughs", "xxe"])
def test_storage_entity_declarations_are_refused(body: str):
    t0 = time.perf_counter()
    with pytest.raises(IngestError, match="DOCTYPE> declaration, which Confluence never writes"):
        _storage(body)
    assert time.perf_counter() - t0 < 5


def test_storage_entities_never_expand_nor_read_files():
    # undeclared references stay literal text; nothing is fetched
    page = _storage("<p>a &xxe; b &lol9; c &nbsp;d</p>")
    assert page.text == "a &xxe; b &lol9; c d"
    # a DOCTYPE quoted inside a code macro's CDATA is content, not a declaration
    code = (
        '<ac:structured-macro ac:name="code"><ac:plain-text-body><![CDATA[<!DOCTYPE html>\n'
        "<html></html>]]></ac:plain-text-body></ac:structured-macro>"
    )
    assert _storage(code).text.splitlines() == ["Code:", "<!DOCTYPE html>", "<html></html>"]


@pytest.mark.parametrize("doc", [BILLION_LAUGHS, XXE], ids=["billion-laughs", "xxe"])
def test_html_export_entities_never_expand_nor_read_files(tmp_path: Path, doc: str):
    dtd = doc.split("]>", 1)[0] + "]>"
    html = _page_html("Hostile", "<p>a &xxe; &lol9; b</p>").replace("<!DOCTYPE html>", dtd)
    f = tmp_path / "Hostile_900000001.html"
    f.write_text(html, encoding="utf-8")
    t0 = time.perf_counter()
    (r,) = read_html_export(tmp_path)
    assert time.perf_counter() - t0 < 5
    text = r.text if isinstance(r, Page) else r.reason
    assert "root:" not in text and "lollollol" not in text
    if isinstance(r, Page):
        assert "a &xxe; &lol9; b" in text


def test_export_reading_keeps_the_real_sample_intact(tmp_path: Path):
    """The bounds change nothing for an ordinary export (zip or folder)."""
    pages, bad = _results(SAMPLE)
    archive = _zip_folder(SAMPLE, tmp_path / "EQM.zip", prefix="EQM/")
    zpages, zbad = _results(archive, max_export_bytes=10 * 1024 * 1024)
    assert {p.page_id: p.content_hash for p in pages} == {p.page_id: p.content_hash for p in zpages}
    assert [q.reason for q in bad] == [q.reason for q in zbad]


# --- REST: one bad page never aborts the sync ---------------------------------------------


def _result(pid: str, title: str, body: object, version: object = None) -> dict[str, object]:
    return {
        "content": {
            "id": pid,
            "type": "page",
            "status": "current",
            "title": title,
            "space": {"key": "HZ", "name": "Hazards"},
            "body": {"storage": {"value": body, "representation": "storage"}},
            "version": version
            if version is not None
            else {"by": {"displayName": "Kim"}, "when": "2024-03-04T09:30:00.000Z", "number": 1},
            "ancestors": [],
        },
        "title": title,
        "entityType": "content",
    }


class _Served(BaseHTTPRequestHandler):
    """A Confluence stand-in: the space, and one search page of generated results."""

    search_status = 200

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/rest/api/space/HZ":
            return self._send(200, {"key": "HZ", "homepage": {"id": "1", "title": "Home"}})
        if path == "/rest/api/search":
            if self.search_status != 200:
                return self._send(self.search_status, {"message": "boom"})
            results = [
                _result("100", "Deep", "<div>" * 2_000 + "x" + "</div>" * 2_000),
                _result("101", "Good", "<h1>Steps</h1><p>Close the valve.</p>"),
                _result("102", "Laughs", BILLION_LAUGHS),
                _result("103", "Odd", "<p>x</p>", version="not-an-object"),
            ]
            return self._send(
                200,
                {"results": results, "start": 0, "limit": 50, "size": 4, "_links": {}},
            )
        return self._send(404, {"message": "no route"})

    def _send(self, status: int, payload: object) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served() -> Iterator[tuple[str, type[_Served]]]:
    handler = type("Handler", (_Served,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_rest_sync_quarantines_bad_pages_and_keeps_going(served):
    url, _ = served
    src = ConfluenceRestSource(url, space="HZ", username="u", token="t" + "0" * 8)
    results = list(src.pages())
    assert [type(r).__name__ for r in results] == ["Quarantined", "Page"] + ["Quarantined"] * 2
    deep, good, laughs, odd = results
    assert isinstance(good, Page) and good.text == "Close the valve."
    assert deep == Quarantined(
        f"{url}/pages/100",
        "markup nested 2000 deep, over max_markup_depth=200 (raise CTX_MAX_MARKUP_DEPTH to "
        "ingest it)",
    )
    assert isinstance(laughs, Quarantined) and "<!DOCTYPE> declaration" in laughs.reason
    assert isinstance(odd, Quarantined) and odd.source_path == f"{url}/pages/103"
    assert odd.reason.startswith("unreadable API result (AttributeError")
    assert src.last_modified == datetime(2024, 3, 4, 9, 30, tzinfo=UTC)


def test_rest_recursion_error_is_a_quarantine(served, monkeypatch):
    import context_core.ingest.rest as rest

    def boom(*_a, **_kw):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(rest, "parse_storage_page", boom)
    url, _ = served
    src = ConfluenceRestSource(url, space="HZ", username="u", token="t" + "0" * 8)
    results = list(src.pages())
    assert len(results) == 4 and all(isinstance(r, Quarantined) for r in results)
    assert "too deep to read" in results[1].reason


def test_rest_transport_errors_still_stop_the_sync(served):
    url, handler = served
    handler.search_status = 500
    src = ConfluenceRestSource(url, space="HZ", username="u", token="t" + "0" * 8)
    with pytest.raises(BackendUnavailableError, match=r"Confluence search at .* failed"):
        list(src.pages())
