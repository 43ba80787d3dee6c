"""Uploads scanned by a real clamd before anything reaches L3.

A private ``clamd`` runs in the foreground for the session, its ``DatabaseDirectory`` holding
only a signature database written here: one ``.ndb`` body signature for a harmless marker
string (:data:`MARKER`), so "infected" is a real clamd verdict without real malware or a
signature download. The uploads go through the real gateway, the real MiniLM encoder and
Qdrant Edge on a temp dir; the HTTP tests run the real app on uvicorn.

Skips (saying why) only when no ``clamd`` binary is installed or it cannot start.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_ops_hardening import run_app
from test_service import cleanup_service_keys, service_settings

from context_core.access.compliance import find_blocked
from context_core.config import Settings, get_settings
from context_core.errors import (
    ScannerUnavailableError,
    UnsupportedUploadTypeError,
    UploadBlockedError,
    UploadInfectedError,
    UploadTooLargeError,
    UploadUnreadableError,
)
from context_core.gateway.sanitize import Gateway
from context_core.ingest.clamd import ClamdScanner, ScanVerdict, parse_clamd_url
from context_core.ingest.pipeline import read_quarantine_history
from context_core.ingest.upload import (
    decode_text,
    parse_keywords,
    quarantine_dir,
    safe_filename,
    scan_and_ingest,
)
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder
from context_core.knowledge.memory import KnowledgeMemory
from context_core.knowledge.store import VectorStore

MARKER = "CTX-TEST-MALWARE-MARKER-5f3a9c1e7b2d4a60"
SIGNATURE = "CTX.Test.Marker"  # clamd reports custom signatures as <name>.UNOFFICIAL
PRC_ID = "11010519491231002X"  # checksum-valid test number
CARD = "6222021234567890128"  # Luhn-valid UnionPay test number
PHONE = "13812341234"


# --- a private clamd -------------------------------------------------------------------------


class ClamdUnavailable(RuntimeError):
    """No clamd binary, or it did not come up: the reason a test skips."""


@contextmanager
def running_clamd(tmp: Path, *, stream_max: str = "30M") -> Iterator[tuple[str, Any]]:
    """clamd in the foreground with only this module's signature database; yields
    ``(unix:// URL, the process)`` once it answers PING, stops it afterwards."""
    binary = shutil.which("clamd") or next(
        (p for p in ("/usr/sbin/clamd", "/usr/local/sbin/clamd") if Path(p).exists()), None
    )
    if binary is None:
        raise ClamdUnavailable("no clamd binary (apt-get install -y clamav-daemon)")
    db = tmp / "db"
    db.mkdir(parents=True, exist_ok=True)
    (db / "ctx-test.ndb").write_text(f"{SIGNATURE}:0:*:{MARKER.encode().hex()}\n")
    sock = tmp / "clamd.sock"
    conf = tmp / "clamd.conf"
    conf.write_text(
        "\n".join(
            [
                "Foreground yes",
                f"LocalSocket {sock}",
                f"DatabaseDirectory {db}",
                f"LogFile {tmp / 'clamd.log'}",
                f"TemporaryDirectory {tmp}",
                f"StreamMaxLength {stream_max}",
                "MaxThreads 2",
                "SelfCheck 3600",
                "",
            ]
        )
    )
    log = (tmp / "clamd.out").open("wb")
    proc = subprocess.Popen(
        [binary, "--foreground", f"--config-file={conf}"], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"unix://{sock}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                out = (tmp / "clamd.out").read_text(errors="replace")[-600:]
                raise ClamdUnavailable(f"clamd exited with {proc.returncode}: {out}")
            try:
                if sock.exists() and ClamdScanner(url, timeout_s=2).ping():
                    break
            except ScannerUnavailableError:
                pass
            if time.monotonic() > deadline:
                raise ClamdUnavailable("clamd did not answer PING within 90 s")
            time.sleep(0.1)
        yield url, proc
    finally:
        stop(proc)
        log.close()


def stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="session")
def clamd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        with running_clamd(tmp_path_factory.mktemp("clamd")) as (url, _proc):
            yield url
    except ClamdUnavailable as e:
        pytest.skip(f"clamd unavailable: {e}")


# --- files -----------------------------------------------------------------------------------


def make_pdf(pages: list[list[str]], *, compress: bool = False, title: str = "") -> bytes:
    """A small valid PDF, one text line per entry, Helvetica; streams Flate-compressed when
    ``compress`` (as real PDFs are)."""

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    n = len(pages)
    objs: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        (
            "<< /Type /Pages /Kids ["
            + " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
            + f"] /Count {n} >>"
        ).encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, lines in enumerate(pages):
        ops = "BT /F1 12 Tf 72 720 Td 16 TL " + " ".join(f"({esc(x)}) Tj T*" for x in lines)
        content = (ops + " ET").encode("latin-1")
        head = b"<< /Length %d" % (len(zlib.compress(content)) if compress else len(content))
        body = zlib.compress(content) if compress else content
        objs.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        objs.append(
            head
            + (b" /Filter /FlateDecode" if compress else b"")
            + b" >>\nstream\n"
            + body
            + b"\nendstream"
        )
    info = None
    if title:
        objs.append(f"<< /Title ({esc(title)}) >>".encode("latin-1"))
        info = len(objs)
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for k, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    trailer = f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R"
    trailer += f" /Info {info} 0 R" if info else ""
    out += (trailer + f" >>\nstartxref\n{xref}\n%%EOF\n").encode()
    return bytes(out)


TEXT = (
    "Coolant pump maintenance notes.\n"
    "The coolant pump PX-7 must be primed with glycol before the first start.\n"
    "Check the impeller clearance every 500 operating hours.\n"
)
HTML = """<!doctype html><html><head><meta charset="utf-8"><title>Boiler handbook</title>
<script>var tracking = 1;</script></head><body>
<h1>Boiler start-up</h1><p>Open the feedwater valve before lighting the burner of boiler B-12.</p>
<h2>Flame failure</h2><p>A flame failure lockout on boiler B-12 needs a manual reset after
purging the furnace for sixty seconds.</p></body></html>"""
PDF_PAGES = [
    ["Conveyor belt inspection guide."],
    ["The conveyor belt CB-9 tracking is adjusted at the tail pulley take-up screws."],
]


# --- the library -----------------------------------------------------------------------------


class RecordingEncoder:
    """The real encoder, remembering every text it embedded (what the vectors are made of)."""

    def __init__(self, inner: Encoder) -> None:
        self._inner = inner
        self.embedded: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def encode(self, texts: Any, **kw: Any) -> Any:
        self.embedded.extend(texts)
        return self._inner.encode(texts, **kw)


class Env:
    """One upload target: settings, the gateway, Qdrant Edge, the knowledge memory."""

    def __init__(self, tmp: Path, encoder: Encoder, clamd_url: str, **extra: Any) -> None:
        self.settings: Settings = get_settings(
            data_dir=tmp / "ctx", reports_dir=tmp / "reports", clamd_url=clamd_url, **extra
        )
        self.gateway = Gateway(audit_path=tmp / "audit.jsonl")
        self.store: VectorStore = EdgeStore(tmp / "qdrant")
        self.encoder = RecordingEncoder(encoder)
        self.km = KnowledgeMemory(self.store, encoder, self.settings, self.gateway)
        self.km.encoder = self.encoder  # type: ignore[assignment]
        self.scanner = ClamdScanner(clamd_url, timeout_s=self.settings.clamd_timeout_s)

    def upload(self, data: bytes, name: str, ctype: str | None = None, **kw: Any) -> Any:
        kw.setdefault("scanner", self.scanner)
        kw.setdefault("agent_id", "agent-a")
        return scan_and_ingest(data, name, ctype, gateway=self.gateway, knowledge=self.km, **kw)

    def points(self) -> int:
        return sum(
            self.store.count(c) if self.store.info(c) is not None else 0
            for c in (self.km.main, self.km.hot)
        )

    def texts(self, source: str) -> list[str]:
        if self.store.info(self.km.hot) is None:
            return []
        recs = self.store.scroll(self.km.hot, filter={"source": source})
        return [
            str(r.payload["text"]) for r in sorted(recs, key=lambda r: r.payload["chunk_index"])
        ]

    def quarantine(self) -> list[dict[str, Any]]:
        return read_quarantine_history(quarantine_dir(self.settings))


@pytest.fixture
def env(tmp_path: Path, encoder: Encoder, clamd_url: str) -> Iterator[Env]:
    e = Env(tmp_path, encoder, clamd_url)
    try:
        yield e
    finally:
        e.store.close()


def test_clean_text_html_and_pdf_are_indexed_and_searchable(env: Env) -> None:
    assert env.points() == 0
    txt = env.upload(TEXT.encode(), "pump-notes.txt", "text/plain")
    html = env.upload(HTML.encode(), "boiler.html", "text/html; charset=utf-8")
    pdf = env.upload(make_pdf(PDF_PAGES, compress=True), "conveyor.pdf", "application/pdf")
    for r in (txt, html, pdf):
        assert r.collection == env.settings.collection_hot
        assert r.scope == "agent:agent-a"
        assert r.chunks >= 1 and len(r.point_ids) == r.chunks
    assert env.points() == txt.chunks + html.chunks + pdf.chunks
    assert txt.source == "upload:agent-a/pump-notes.txt" and txt.encoding == "utf-8"
    assert pdf.source == "upload:agent-a/conveyor.pdf" and pdf.sections == 2
    # the script is not text; the headings are the HTML's
    assert not any("tracking" in t for t in env.texts(html.source))
    assert any("Boiler start-up" in t for t in env.texts(html.source))
    assert any("page 2" in t and "tail pulley" in t for t in env.texts(pdf.source))

    scopes = ["system:local", "agent:agent-a"]
    for query, source in (
        ("how do I prime the coolant pump PX-7", txt.source),
        ("boiler B-12 flame failure lockout reset", html.source),
        ("conveyor belt CB-9 tracking adjustment", pdf.source),
    ):
        hits = env.km.search(query, hot_scopes=scopes, limit=3)
        assert hits and hits[0].payload["source"] == source, (query, [h.payload for h in hits])
        p = hits[0].payload
        assert p["trust"] == "unreviewed" and p["written_by"] == "agent-a"
        assert p["confirmed"] is False and p["expires_at"] > time.time()
    # another agent's scope does not see them
    other = env.km.search("coolant pump PX-7 primed with glycol", hot_scopes=["agent:agent-b"])
    assert not any(h.payload["source"] == txt.source for h in other)


def test_same_file_again_is_idempotent_and_a_new_version_replaces_the_old(env: Env) -> None:
    first = env.upload(TEXT.encode(), "notes.txt", "text/plain")
    again = env.upload(TEXT.encode(), "notes.txt", "text/plain")
    assert again.point_ids == first.point_ids and again.replaced == 0
    assert env.points() == first.chunks
    newer = env.upload(b"The seal kit SK-3 replaces SK-2 from March.", "notes.txt", "text/plain")
    assert newer.replaced == first.chunks and newer.point_ids != first.point_ids
    assert env.texts(newer.source) == ["notes.txt\nThe seal kit SK-3 replaces SK-2 from March."]
    assert env.points() == newer.chunks


@pytest.mark.parametrize(
    ("name", "ctype", "data"),
    [
        ("notes.txt", "text/plain", f"harmless words {MARKER} more words".encode()),
        ("doc.pdf", "application/pdf", make_pdf([["intro"], [f"x {MARKER} y"]], compress=True)),
    ],
    ids=["text", "compressed-pdf"],
)
def test_a_file_with_the_marker_is_refused_and_quarantined(
    env: Env, name: str, ctype: str, data: bytes
) -> None:
    env.upload(TEXT.encode(), "before.txt", "text/plain")
    before = env.points()
    with pytest.raises(UploadInfectedError) as err:
        env.upload(data, name, ctype)
    assert err.value.signature.startswith(SIGNATURE)
    assert err.value.http_status == 422 and err.value.error_code == "upload_infected"
    assert env.points() == before, "nothing of an infected file reaches L3"
    (line,) = env.quarantine()
    assert line["reason_kind"] == "infected" and line["signature"] == err.value.signature
    assert (
        line["source_path"] == f"upload:agent-a/{name}"
        and line["run_id"] == err.value.quarantine_id
    )
    kept = quarantine_dir(env.settings) / line["file"]
    assert kept.read_bytes() == data and (kept.stat().st_mode & 0o777) == 0o600


def test_blocked_keywords_quarantine_the_file_and_write_nothing(env: Env) -> None:
    before = env.points()
    kws = parse_keywords("Project Nightjar, 机密 ,,")
    assert kws == ("Project Nightjar", "机密")
    with pytest.raises(UploadBlockedError) as err:
        env.upload(b"Status of PROJECT\n  nightjar: on hold.", "status.txt", blocked_keywords=kws)
    assert err.value.keyword == "Project Nightjar" and err.value.error_code == "upload_blocked"
    with pytest.raises(UploadBlockedError) as err2:
        env.upload(
            "这是机密文件，请勿外传。".encode(), "memo.txt", "text/plain", blocked_keywords=kws
        )
    assert err2.value.keyword == "机密"
    assert env.points() == before
    lines = env.quarantine()
    assert [ln["keyword"] for ln in lines] == ["Project Nightjar", "机密"]
    assert all(ln["reason_kind"] == "blocked_keyword" for ln in lines)
    # word boundaries: "nightjars" and "projectnightjar" are other words
    ok = env.upload(b"Projectnightjar nightjars are birds.", "birds.txt", blocked_keywords=kws)
    assert ok.chunks == 1


def test_keyword_matching_boundaries() -> None:
    """Uploads use the compliance profiles' matcher (one matcher for every blocked-keyword
    check)."""
    kws = ["acme", "red team", "机密", "ｃｏｄｅ"]

    def first(text: str) -> str | None:
        found = find_blocked(text, kws)
        return found[0] if found else None

    assert first("ACME Corp") == "acme"
    assert first("在ACME公司") == "acme"  # CJK neighbours are no word characters
    assert first("acmeCorp") is None and first("the acme_x") is None
    assert first("a Red\n\tTeam exercise") == "red team"
    assert first("绝密与机密") == "机密"
    assert first("source CODE") == "ｃｏｄｅ"  # NFKC folds full-width forms
    assert find_blocked("anything", []) == ()
    # look-alikes (issue 32): invisible characters and other scripts' letters
    assert first("ac\u034fme Corp") == "acme"  # combining grapheme joiner
    assert first("a\u2063c\u200bm\u00ade") == "acme"  # invisible separator, ZWSP, soft hyphen
    assert first("АСМЕ Corp") == "acme"  # Cyrillic capitals
    assert first("𝐚𝐜𝐦𝐞 Corp") == "acme"  # mathematical bold
    assert first("red\u00a0tеаm") == "red team"  # no-break space, Cyrillic е а
    assert first("机\u200b密") == "机密"
    assert first("\U000e0001acme\U000e007f") == "acme"  # tag characters
    assert first("ас\u0301me") == "acme"  # Cyrillic, combining accent
    assert first("асmеCorp") is None  # still whole words


def test_pii_is_redacted_in_the_stored_chunks(env: Env) -> None:
    text = (
        f"Customer callback: phone {PHONE}, ID number {PRC_ID}, card {CARD}.\n"
        "The pump warranty covers the seal for two years."
    )
    r = env.upload(text.encode(), f"case {PHONE}.txt", "text/plain")
    assert r.redactions.get("pii_phone", 0) >= 2  # the text and the file name
    assert r.redactions.get("pii_id") == 1 and r.redactions.get("pii_card") == 1
    assert PHONE not in r.source and "138****1234" in r.source
    stored = "\n".join(env.texts(r.source))
    for raw in (PHONE, PRC_ID, CARD):
        assert raw not in stored
    assert "138****1234" in stored and "warranty" in stored
    # the vectors were made from the redacted text, not just the stored payload
    embedded = "\n".join(env.encoder.embedded)
    assert "warranty" in embedded and not any(raw in embedded for raw in (PHONE, PRC_ID, CARD))
    recs = list(env.store.scroll(env.km.hot))
    assert not any(raw in json.dumps(rec.payload) for rec in recs for raw in (PHONE, PRC_ID, CARD))


def test_scanner_down_or_silent_refuses_with_503_and_writes_nothing(
    env: Env, tmp_path: Path
) -> None:
    env.upload(TEXT.encode(), "before.txt", "text/plain")
    before = env.points()
    dead = ClamdScanner(f"unix://{tmp_path / 'no-such.sock'}", timeout_s=1)
    with pytest.raises(ScannerUnavailableError) as err:
        env.upload(b"fine text", "a.txt", scanner=dead)
    assert err.value.http_status == 503 and err.value.retry_after_s >= 1
    with pytest.raises(ScannerUnavailableError, match="CTX_CLAMD_URL"):
        env.upload(b"fine text", "a.txt", scanner=None)
    # a scanner that accepts the connection and never answers: a timeout, not a pass
    with socket.socket(socket.AF_UNIX) as silent:
        path = tmp_path / "silent.sock"
        silent.bind(str(path))
        silent.listen(1)
        t0 = time.monotonic()
        with pytest.raises(ScannerUnavailableError, match="did not answer within"):
            env.upload(b"fine text", "a.txt", scanner=ClamdScanner(f"unix://{path}", timeout_s=0.5))
        assert time.monotonic() - t0 < 5
    assert env.points() == before and env.quarantine() == []


def test_size_type_and_unreadable_files(env: Env) -> None:
    with pytest.raises(UploadTooLargeError) as big:
        env.upload(b"x" * 1001, "big.txt", "text/plain", max_bytes=1000)
    assert big.value.limit_bytes == 1000 and big.value.http_status == 413
    with pytest.raises(UnsupportedUploadTypeError) as bad:
        env.upload(b"MZ\x90\x00", "tool.exe", "application/x-msdownload")
    assert bad.value.http_status == 415 and "application/pdf" in bad.value.details()["allowed"]
    with pytest.raises(UploadUnreadableError, match="no %PDF- header"):
        env.upload(b"just text", "fake.pdf", "application/octet-stream")
    with pytest.raises(UploadUnreadableError, match="binary data"):
        env.upload(b"\x00\x01\x02binary", "blob.txt", "text/plain")
    with pytest.raises(UploadUnreadableError, match="no text"):
        env.upload(b"<html><body><script>x()</script></body></html>", "empty.html")
    assert env.points() == 0
    assert [ln["reason_kind"] for ln in env.quarantine()] == ["unreadable"] * 3


def test_text_decoding() -> None:
    gbk = "泵的机械密封每两年更换一次，检查叶轮间隙。".encode("gbk") * 4
    text, enc, bad = decode_text(gbk)
    assert text.startswith("泵的机械密封") and bad == 0 and enc.lower().startswith("gb")
    assert decode_text("héllo".encode("utf-16"))[0] == "héllo"
    text, enc, bad = decode_text(b"caf\xc3\xa9 " + b"ok " * 40 + b"\xff end", declared=None)
    assert "café" in text and (bad >= 1 or enc != "utf-8")
    assert decode_text(b"plain ascii")[1:] == ("utf-8", 0)


def test_names_and_urls() -> None:
    assert safe_filename("../../etc/passwd") == "passwd"
    assert safe_filename("C:\\Users\\me\\report.pdf") == "report.pdf"
    assert safe_filename("a\x00b\u202e.txt") == "ab.txt"
    assert safe_filename("") == "upload"
    assert safe_filename("x" * 400 + ".pdf").endswith(".pdf")
    assert len(safe_filename("x" * 400 + ".pdf")) <= 180
    assert parse_clamd_url("tcp://127.0.0.1:3310")[1] == ("127.0.0.1", 3310)
    assert parse_clamd_url("unix:///run/clamav/clamd.ctl")[1] == "/run/clamav/clamd.ctl"
    with pytest.raises(ValueError, match="CTX_CLAMD_URL"):
        parse_clamd_url("http://clamd")


def test_the_scanner_speaks_to_clamd(clamd_url: str) -> None:
    s = ClamdScanner(clamd_url, timeout_s=10)
    assert s.ping() and s.version().startswith("ClamAV ")
    assert s.scan(b"nothing here") == ScanVerdict(None)
    big = b"A" * 300_000 + MARKER.encode() + b"B" * 10  # across several INSTREAM chunks
    assert (s.scan(big).signature or "").startswith(SIGNATURE)


def test_clamd_stream_limit_is_413(tmp_path: Path) -> None:
    try:
        with running_clamd(tmp_path, stream_max="1K") as (url, _proc):
            from context_core.errors import ScannerLimitError

            with pytest.raises(ScannerLimitError):
                ClamdScanner(url, timeout_s=10).scan(b"x" * 200_000)
    except ClamdUnavailable as e:
        pytest.skip(f"clamd unavailable: {e}")


# --- over HTTP, the real app -----------------------------------------------------------------

UPLOAD_LIMIT = 200 * 1024


@contextmanager
def upload_service(
    tmp: Path, redis_url: str, clamd: str
) -> Iterator[tuple[str, Any, dict[str, str]]]:
    tmp.mkdir(parents=True, exist_ok=True)
    settings, keys = service_settings(
        tmp,
        redis_url,
        max_body_bytes=64 * 1024,  # JSON routes; an upload may be bigger
        clamd_url=clamd,
        clamd_timeout_s=5,
        upload_max_bytes=UPLOAD_LIMIT,
        blocked_keywords="Project Nightjar, 机密",
    )
    with run_app(settings) as (url, app):
        yield url, app, keys


def _points(app: Any) -> int:
    svc = app.state.services
    return sum(
        svc.store.count(c) if svc.store.info(c) is not None else 0
        for c in (svc.settings.collection_main, svc.settings.collection_hot)
    )


def _post(
    url: str, key: str | None, name: str, data: bytes, ctype: str, **form: str
) -> httpx.Response:
    headers = {"X-API-Key": key} if key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        return c.post("/v1/uploads", files={"file": (name, data, ctype)}, data=form)


@pytest.fixture(scope="module")
def http(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, clamd_url: str
) -> Iterator[tuple[str, Any, dict[str, str]]]:
    with upload_service(tmp_path_factory.mktemp("upload-http"), redis_url, clamd_url) as s:
        yield s
    cleanup_service_keys(redis_url)


def test_http_upload_indexes_and_refuses(http: tuple[str, Any, dict[str, str]]) -> None:
    url, app, keys = http
    key = keys["agent-a"]
    # bigger than CTX_MAX_BODY_BYTES (64 KiB): files have their own limit
    long_text = (TEXT * 600).encode()
    assert 64 * 1024 < len(long_text) < UPLOAD_LIMIT
    pdf = make_pdf(PDF_PAGES, compress=True)
    ok = _post(url, key, "conveyor.pdf", pdf, "application/pdf", section="CONV")
    assert ok.status_code == 201, ok.text
    body = ok.json()
    assert body["source"] == "upload:agent-a/conveyor.pdf" and body["scope"] == "agent:agent-a"
    assert body["chunks"] == len(body["point_ids"]) >= 1 and body["bytes"] == len(pdf)
    big = _post(url, key, "notes.txt", long_text, "text/plain")
    assert big.status_code == 201, big.text
    n = _points(app)
    assert n == body["chunks"] + big.json()["chunks"]
    hits = app.state.services.knowledge.search(
        "conveyor belt CB-9 tracking", hot_scopes=["agent:agent-a"], section="CONV"
    )
    assert hits and hits[0].payload["source"] == "upload:agent-a/conveyor.pdf"

    infected = _post(url, key, "x.txt", f"hello {MARKER}".encode(), "text/plain")
    assert infected.status_code == 422, infected.text
    assert infected.json()["error"] == "upload_infected"
    assert infected.json()["signature"].startswith(SIGNATURE)
    assert MARKER not in infected.text
    secret_line = f"Project Nightjar budget, call {PHONE}"
    blocked = _post(url, key, "plan.txt", secret_line.encode(), "text/plain")
    assert blocked.status_code == 422 and blocked.json()["keyword"] == "Project Nightjar"
    assert PHONE not in blocked.text
    assert _points(app) == n
    # the organisation's compliance profile adds its own blocked keywords
    svc = app.state.services
    org = svc.keys.authenticate(key).org
    current = svc.compliance.get(org)
    svc.compliance.put(
        org, {"blocked_keywords": ["Operation Kestrel"]},
        expected_version=current.version, operator="test",
    )  # fmt: skip
    try:
        by_profile = _post(url, key, "ops.txt", b"Notes on operation   KESTREL.", "text/plain")
        assert by_profile.status_code == 422, by_profile.text
        assert by_profile.json()["keyword"] == "Operation Kestrel"
        assert _points(app) == n
    finally:
        latest = svc.compliance.get(org)
        svc.compliance.put(org, {}, expected_version=latest.version, operator="test")

    too_big = _post(url, key, "big.txt", b"y" * (UPLOAD_LIMIT + 1), "text/plain")
    assert too_big.status_code == 413 and too_big.json()["limit_bytes"] == UPLOAD_LIMIT
    way_too_big = _post(url, key, "huge.txt", b"y" * (UPLOAD_LIMIT + 200 * 1024), "text/plain")
    assert way_too_big.status_code == 413
    exe = _post(url, key, "tool.exe", b"MZ\x90\x00", "application/x-msdownload")
    assert exe.status_code == 415 and "application/pdf" in exe.json()["allowed"]
    assert _post(url, None, "a.txt", b"text", "text/plain").status_code == 401
    bad_form = _post(url, key, "a.txt", b"text", "text/plain", section="no spaces!")
    assert bad_form.status_code == 422 and bad_form.json()["error"] == "invalid_request"
    assert _points(app) == n
    # JSON routes keep their own body limit
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30) as c:
        r = c.post("/v1/sessions", content=b'{"user_id": "' + b"u" * 70_000 + b'"}')
    assert r.status_code == 413 and "CTX_MAX_BODY_BYTES" in r.json()["detail"]


def test_http_scanner_stopped_is_503_and_nothing_is_written(tmp_path: Path, redis_url: str) -> None:
    with ExitStack() as stack:
        try:
            clamd, proc = stack.enter_context(running_clamd(tmp_path / "clamd"))
        except ClamdUnavailable as e:
            pytest.skip(f"clamd unavailable: {e}")
        stack.callback(cleanup_service_keys, redis_url)
        url, app, keys = stack.enter_context(upload_service(tmp_path / "svc", redis_url, clamd))
        key = keys["agent-a"]
        assert _post(url, key, "a.txt", TEXT.encode(), "text/plain").status_code == 201
        n = _points(app)
        with httpx.Client(base_url=url, timeout=30) as c:
            ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["clamd"] == "ok"
        stop(proc)  # the scanner goes away
        with httpx.Client(base_url=url, timeout=30) as c:
            ready = c.get("/readyz")  # reported, but the service stays ready for the rest
        assert ready.status_code == 200 and ready.json()["clamd"].startswith("unavailable")
        r = _post(url, key, "b.txt", b"The gearbox oil is changed yearly.", "text/plain")
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "scanner_unavailable"
        assert int(r.headers["Retry-After"]) >= 1
        assert _points(app) == n
        assert read_quarantine_history(quarantine_dir(app.state.services.settings)) == []
