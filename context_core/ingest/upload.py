"""User uploads (PDF, Word, HTML, plain text, Markdown) into L3, scanned and cleaned first.

:func:`scan_and_ingest` runs, in this order, and writes nothing to L3 until every step passed:

1. **size** (``CTX_UPLOAD_MAX_BYTES``, 413) and **type** (declared content type, else the
   file name's extension; 415 naming :data:`ALLOWED_TYPES`) - cheap checks that parse nothing;
2. **malware scan** of the raw bytes by clamd (:mod:`context_core.ingest.clamd`) before any
   parser touches them. Fail closed: no verdict (clamd down, timed out, no scanner
   configured) is :class:`~context_core.ingest.clamd.ScannerUnavailableError` (503 +
   Retry-After), never "clean". A finding is quarantined and refused
   (:class:`UploadInfectedError`, 422 ``upload_infected`` naming the signature);
3. **text extraction**: PDF with pypdf (one section per page), Word ``.docx`` with
   python-docx (``Heading N`` paragraphs as heading paths, tables row by row, the archive's
   unpacked size checked first), HTML with the ingest
   renderer (:func:`context_core.ingest.render.render_sections`: heading-path sections, the
   same depth guard as Confluence pages), text and Markdown decoded by BOM, strict UTF-8, the
   HTML ``charset`` declaration, then charset detection (charset-normalizer), and as a last
   resort UTF-8 with replacement characters, counted in ``decode_errors``. A file that yields
   no text, is not what its type says, or cannot be parsed is quarantined and refused
   (:class:`UploadUnreadableError`, 422 ``upload_unreadable``);
4. **blocked keywords** (the organisation's list, passed in): matched on the extracted,
   not yet redacted text and the file name, case-insensitively after NFKC folding, on word
   boundaries, and as plain substrings for keywords holding CJK characters (which have no
   word boundaries). A hit is quarantined and refused (:class:`UploadBlockedError`, 422
   ``upload_blocked`` naming the keyword). Checked before redaction so a keyword inside,
   say, an e-mail address still blocks the file;
5. **redaction** of every text, heading and the file name through the gateway's DLP (the one
   rule table: secrets, PRC ID numbers, bank cards, phones, e-mails); counts by kind are
   returned, values never;
6. **chunking** with the ingest chunker (heading-aware, ``CTX_CHUNK_MAX_TOKENS``), embedding,
   and :meth:`KnowledgeMemory.upsert_chunks` into the **hot collection**, trust-scoped like a
   hot answer: the uploader's private scope ``agent:<id>`` (a shared namespace only when the
   uploader holds ``write`` there; ``system:local`` for an in-process call without an agent),
   ``trust = "unreviewed"``, ``confirmed = False`` (the daily merge never promotes it into
   main) and ``expires_at`` after ``CTX_UPLOAD_TTL_HOURS``. Why not main: main is curated
   knowledge every agent sees and may be labelled ``confident``; an agent's file is neither
   reviewed nor everybody's. Readers see it as they see hot answers (capped at
   ``low_confidence``).

Point ids are UUIDv5 of scope, source, the file's SHA-256 and the chunk index: the same file
uploaded again rewrites the same points; a new version under the same name replaces the old
one's chunks (removed after the new ones are written). ``source`` is
``upload:<agent>/<file name>`` (``system`` without an agent), the file name stripped of any
directory part and cleaned by the gateway.

Quarantine: the refused file is kept as ``<quarantine_dir>/<id>.bin`` (mode 0600; default
``<data_dir>/quarantine/uploads``) for an operator to review, and one line is appended to
``<quarantine_dir>/quarantine.jsonl`` in the ingest history's shape (``run_id``, ``at``,
``export``, ``kind``, ``source_path``, ``reason``; see
:func:`context_core.ingest.pipeline.read_quarantine_history`) plus ``reason_kind``
(``infected`` / ``blocked_keyword`` / ``unreadable``), ``signature`` or ``keyword``,
``sha256``, ``bytes``, ``content_type``, ``agent`` and ``file``. The kept copy is the raw,
unredacted file: the quarantine directory must be as protected as the data directory.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import secrets
import time
import unicodedata
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PureWindowsPath
from typing import TYPE_CHECKING, Any, Literal

from context_core.access.compliance import find_blocked
from context_core.errors import (
    ScannerUnavailableError,
    UnsupportedUploadTypeError,
    UploadBlockedError,
    UploadInfectedError,
    UploadRefusedError,
    UploadTooLargeError,
    UploadUnreadableError,
)
from context_core.fsutil import append_line
from context_core.ingest.clamd import Scanner
from context_core.ingest.model import Page, Section, compute_content_hash
from context_core.ingest.render import normalise_line
from context_core.knowledge.memory import UNREVIEWED, AclSource, resolve_hot_scope
from context_core.knowledge.store import PointRecord

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.gateway.sanitize import Gateway
    from context_core.ingest.model import Chunk
    from context_core.knowledge.embedding import Encoder
    from context_core.knowledge.memory import KnowledgeMemory

__all__ = [
    "ALLOWED_TYPES",
    "MAX_TEXT_CHARS",
    "QUARANTINE_FILE",
    "CheckedFile",
    "UnsupportedUploadTypeError",
    "UploadBlockedError",
    "UploadInfectedError",
    "UploadRefusedError",
    "UploadResult",
    "UploadTooLargeError",
    "UploadUnreadableError",
    "check_file",
    "decode_text",
    "extract_sections",
    "parse_keywords",
    "quarantine_dir",
    "resolve_type",
    "safe_filename",
    "scan_and_ingest",
    "upload_point_id",
]

log = logging.getLogger(__name__)

UploadKind = Literal["pdf", "html", "text", "markdown", "docx"]

#: The content types an upload may have, and how each is read.
ALLOWED_TYPES: dict[str, UploadKind] = {
    "application/pdf": "pdf",
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/plain": "text",
    "text/markdown": "markdown",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
}
_EXTENSIONS = {
    ".pdf": "application/pdf",
    ".html": "text/html",
    ".htm": "text/html",
    ".xhtml": "application/xhtml+xml",
    ".txt": "text/plain",
    ".text": "text/plain",
    ".log": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
#: Declared types that say nothing: the extension decides.
_GENERIC_TYPES = frozenset({"", "application/octet-stream", "binary/octet-stream"})

MAX_TEXT_CHARS = 2_000_000
"""Most characters of text one upload may yield (a small PDF can inflate to far more text
than its size, and every character is embedded): 413 beyond."""

QUARANTINE_FILE = "quarantine.jsonl"  # the same name as the ingest's history
_UPLOAD_NAMESPACE = uuid.UUID("5b0c2f8e-3d71-4a96-8c1e-7f2a9d4e6b53")
_MAX_FILENAME = 180


# --------------------------------------------------------------------------------------------
# Errors: each class says how the service answers it (see context_core.errors)
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UploadResult:
    """What one accepted upload wrote (ids, scope, expiry) and what cleaning found."""

    source: str
    filename: str
    content_type: str
    bytes: int
    sha256: str
    collection: str
    scope: str
    chunks: int
    point_ids: tuple[str, ...]
    replaced: int  # chunks of an earlier version of the same source that were removed
    expires_at: float
    redactions: dict[str, int]
    sections: int
    encoding: str | None = None  # text and HTML: the charset the bytes were read with
    decode_errors: int = 0  # bytes that were not valid in it (replaced by U+FFFD)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["point_ids"] = list(self.point_ids)
        return out


# --------------------------------------------------------------------------------------------
# Names, types, keywords
# --------------------------------------------------------------------------------------------


def safe_filename(name: str | None) -> str:
    """The file name alone (no directory part, Windows or POSIX), NFC, without control
    characters, whitespace collapsed, at most 180 characters (the extension kept)."""
    base = PureWindowsPath(name or "").name  # splits on both "\\" and "/"
    base = unicodedata.normalize("NFC", base)
    base = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C")
    base = " ".join(base.split()).strip(" .")
    if len(base) > _MAX_FILENAME:
        stem, dot, ext = base.rpartition(".")
        ext = ext if dot and len(ext) <= 10 else ""
        base = (stem if ext else base)[: _MAX_FILENAME - len(ext) - 1].rstrip() + (
            f".{ext}" if ext else ""
        )
    return base or "upload"


def resolve_type(filename: str, content_type: str | None) -> tuple[str, UploadKind]:
    """``(content type, kind)``: the declared type when it is an allowed one, the
    extension's when the declared one is missing or generic; 415 otherwise."""
    declared = (content_type or "").split(";", 1)[0].strip().lower()
    if declared in ALLOWED_TYPES:
        return declared, ALLOWED_TYPES[declared]
    ext = os.path.splitext(filename)[1].lower()
    if declared in _GENERIC_TYPES and ext in _EXTENSIONS:
        mime = _EXTENSIONS[ext]
        return mime, ALLOWED_TYPES[mime]
    what = declared or (f"extension {ext!r}" if ext else "no type and no extension")
    raise UnsupportedUploadTypeError(
        f"unsupported upload type ({what}); allowed: {', '.join(sorted(ALLOWED_TYPES))} "
        f"(or application/octet-stream with one of {', '.join(sorted(_EXTENSIONS))})",
        declared=declared or ext,
        allowed=list(ALLOWED_TYPES),
    )


def parse_keywords(raw: str | Iterable[str] | None) -> tuple[str, ...]:
    """Keywords from a comma-separated setting (ASCII or full-width commas, newlines) or a
    list: stripped, empty ones dropped, duplicates (after folding) dropped, order kept."""
    if raw is None:
        return ()
    items = re.split(r"[,，\n]", raw) if isinstance(raw, str) else list(raw)
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        kw = " ".join(str(item).split())
        folded = _fold(kw)
        if kw and folded not in seen:
            seen.add(folded)
            out.append(kw)
    return tuple(out)


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


# --------------------------------------------------------------------------------------------
# Text extraction
# --------------------------------------------------------------------------------------------

_BOMS = (  # UTF-32 first: its little-endian BOM starts with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def decode_text(data: bytes, *, declared: str | None = None) -> tuple[str, str, int]:
    """``(text, encoding, replaced)``: by BOM, strict UTF-8, the ``declared`` charset,
    charset detection, and last UTF-8 with U+FFFD for each bad byte (``replaced`` of them).

    Raises :class:`UploadUnreadableError` for binary data (NUL bytes without a UTF-16/32 BOM)
    or text that is mostly undecodable.
    """
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(enc), enc, 0
            except UnicodeDecodeError:
                raise UploadUnreadableError(
                    f"the file starts with a {enc} mark but is not {enc}"
                ) from None
    if b"\0" in data[:8192]:
        raise UploadUnreadableError("binary data (NUL bytes) in a text file")
    try:
        return data.decode("utf-8"), "utf-8", 0
    except UnicodeDecodeError:
        pass
    # UTF-8 with a few stray bytes (a truncated copy, one pasted Latin-1 character) is UTF-8:
    # a detector would read all of it as some single-byte charset. The bad bytes are counted.
    as_utf8, bad = _utf8_replacing(data)
    non_ascii = len(data.translate(None, _ASCII))
    if bad <= max(1, non_ascii // 50) and _REAL_NON_ASCII.search(as_utf8):
        return as_utf8, "utf-8", bad
    if declared:
        try:
            return data.decode(declared), codecs.lookup(declared).name, 0
        except (LookupError, UnicodeDecodeError):
            pass
    from charset_normalizer import from_bytes

    best = from_bytes(data[:1_000_000]).best()
    if best is not None and best.encoding:
        try:
            return data.decode(best.encoding), best.encoding, 0
        except (LookupError, UnicodeDecodeError):
            pass
    if bad > max(16, len(as_utf8) // 10):
        raise UploadUnreadableError(
            f"the text is not in any recognisable encoding ({bad} undecodable bytes)"
        )
    return as_utf8, "utf-8", bad


_ASCII = bytes(range(128))
_REAL_NON_ASCII = re.compile("[^\x00-\x7f\ufffd]")


def _utf8_replacing(data: bytes) -> tuple[str, int]:
    """UTF-8 with U+FFFD for each undecodable sequence, and how many there were."""
    text = data.decode("utf-8", errors="replace")
    return text, text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")


def _lines(text: str) -> list[str]:
    return [line for line in (normalise_line(raw) for raw in text.splitlines()) if line]


_MD_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _markdown_sections(text: str) -> list[Section]:
    """ATX headings (``#`` .. ``######``) open sections with a heading path, as HTML does."""
    sections: list[Section] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []

    def flush() -> None:
        lines = _lines("\n".join(body))
        if lines:
            sections.append(Section(tuple(h for _, h in path), "\n".join(lines)))
        body.clear()

    fence = False
    for raw in text.splitlines():
        if raw.lstrip().startswith(("```", "~~~")):
            fence = not fence
        m = None if fence else _MD_HEADING.match(raw)
        if m and normalise_line(m.group(2)):
            flush()
            level = len(m.group(1))
            while path and path[-1][0] >= level:
                path.pop()
            path.append((level, normalise_line(m.group(2))))
        else:
            body.append(raw)
    flush()
    return sections


def _html_sections(text: str, max_depth: int) -> tuple[str, list[Section]]:
    from lxml import etree

    from context_core.ingest.render import (
        depth_problem,
        markup_depth,
        parser_limit_hit,
        render_sections,
    )

    parser = etree.HTMLParser(encoding="utf-8", no_network=True)
    try:
        root = etree.fromstring(text.encode("utf-8"), parser=parser)
    except (etree.ParserError, ValueError) as e:
        raise UploadUnreadableError(f"not readable as HTML ({type(e).__name__})") from None
    if root is None:
        raise UploadUnreadableError("not readable as HTML (no document)")
    problem = depth_problem(markup_depth(root), max_depth, parser_limit_hit(parser.error_log))
    if problem is not None:
        raise UploadUnreadableError(problem)
    title_el = root.find(".//title")
    title = normalise_line("".join(title_el.itertext())) if title_el is not None else ""
    body = root.find(".//body")
    return title, render_sections(body if body is not None else root)


def _pdf_sections(data: bytes, max_chars: int) -> tuple[str, list[Section]]:
    from pypdf import PdfReader

    if b"%PDF-" not in data[:1024]:
        raise UploadUnreadableError("not a PDF (no %PDF- header)")
    sections: list[Section] = []
    total = 0
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise UploadUnreadableError("the PDF is encrypted (a password is needed to read it)")
        for number, page in enumerate(reader.pages, 1):
            lines = _lines(page.extract_text() or "")
            if lines:
                text = "\n".join(lines)
                total += len(text)
                if total > max_chars:
                    raise UploadTooLargeError(
                        f"the PDF yields more than {max_chars} characters of text"
                    )
                sections.append(Section((f"page {number}",), text))
        meta = reader.metadata
        title = normalise_line(str(meta.title)) if meta is not None and meta.title else ""
    except (UploadRefusedError, UploadTooLargeError):
        raise
    except Exception as e:  # a hostile or damaged PDF may fail anywhere in the parser
        raise UploadUnreadableError(f"not a readable PDF ({type(e).__name__})") from None
    return title, sections


_DOCX_MAX_INFLATE = 100  # a .docx may unpack to at most this many times its size


def _docx_sections(data: bytes, max_chars: int) -> tuple[str, list[Section]]:
    """Word (OOXML) with python-docx: ``Heading N`` paragraphs open sections with a heading
    path, as HTML headings do; table cells are read row by row. The archive's unpacked size is
    checked first, so a zip bomb is refused before it is inflated."""
    import zipfile

    from docx import Document

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            inflated = sum(i.file_size for i in zf.infolist())
    except (zipfile.BadZipFile, ValueError):
        raise UploadUnreadableError("not a Word .docx file (not a zip archive)") from None
    if inflated > max(len(data) * _DOCX_MAX_INFLATE, 8 * 1024 * 1024):
        raise UploadTooLargeError(f"the .docx unpacks to {inflated} bytes (an archive bomb?)")
    try:
        doc = Document(io.BytesIO(data))
        sections: list[Section] = []
        path: list[tuple[int, str]] = []
        body: list[str] = []

        def flush() -> None:
            if body:
                sections.append(Section(tuple(h for _, h in path), "\n".join(body)))
            body.clear()

        for para in doc.paragraphs:
            text = normalise_line(para.text)
            style = para.style.name if para.style is not None else ""
            level = _heading_level(style or "")
            if level and text:
                flush()
                while path and path[-1][0] >= level:
                    path.pop()
                path.append((level, text))
            elif text:
                body.append(text)
        for table in doc.tables:
            for row in table.rows:
                cells = [normalise_line(c.text) for c in row.cells]
                line = " | ".join(c for c in cells if c)
                if line:
                    body.append(line)
        flush()
        title = normalise_line(doc.core_properties.title or "")
    except (UploadRefusedError, UploadTooLargeError):
        raise
    except Exception as e:  # a damaged or hostile archive may fail anywhere in the reader
        raise UploadUnreadableError(f"not a readable Word file ({type(e).__name__})") from None
    if sum(len(sec.text) for sec in sections) > max_chars:
        raise UploadTooLargeError(f"the .docx yields more than {max_chars} characters of text")
    return title, sections


def _heading_level(style: str) -> int:
    """1..9 for Word's built-in ``Heading N`` / ``Title`` styles, else 0."""
    if style == "Title":
        return 1
    m = re.fullmatch(r"Heading ([1-9])", style)
    return int(m.group(1)) if m else 0


def extract_sections(
    data: bytes,
    kind: UploadKind,
    *,
    max_markup_depth: int = 200,
    max_chars: int = MAX_TEXT_CHARS,
) -> tuple[str, list[Section], str | None, int]:
    """``(title, sections, encoding, decode_errors)`` of a file of ``kind``; raises
    :class:`UploadUnreadableError` when it yields no text and :class:`UploadTooLargeError`
    past ``max_chars`` characters."""
    encoding: str | None = None
    replaced = 0
    if kind == "pdf":
        title, sections = _pdf_sections(data, max_chars)
    elif kind == "docx":
        title, sections = _docx_sections(data, max_chars)
    else:
        declared = None
        if kind == "html":
            m = _META_CHARSET.search(data[:4096])
            declared = m.group(1).decode("ascii") if m else None
        text, encoding, replaced = decode_text(data, declared=declared)
        if len(text) > max_chars * 4:  # markup is dropped below; plain text is not
            raise UploadTooLargeError(f"the file holds more than {max_chars * 4} characters")
        if kind == "html":
            title, sections = _html_sections(text, max_markup_depth)
        elif kind == "markdown":
            title, sections = "", _markdown_sections(text)
        else:
            lines = _lines(text)
            title, sections = "", ([Section((), "\n".join(lines))] if lines else [])
    total = sum(len(s.text) for s in sections)
    if total > max_chars:
        raise UploadTooLargeError(f"the file yields {total} characters of text, over {max_chars}")
    if not total:
        raise UploadUnreadableError("the file holds no text to index")
    return title, sections, encoding, replaced


# --------------------------------------------------------------------------------------------
# Quarantine
# --------------------------------------------------------------------------------------------


def quarantine_dir(settings: Settings) -> Path:
    """``<data_dir>/quarantine/uploads``: refused files and their ``quarantine.jsonl``."""
    return settings.upload_quarantine_dir


def _quarantine(
    qdir: Path,
    data: bytes,
    error: UploadRefusedError,
    *,
    source: str,
    content_type: str,
    sha256: str,
    agent_id: str | None,
    now: float,
) -> str | None:
    """Keep the file and append its line; the id, or None when the disk refused (logged:
    the upload is refused either way)."""
    at = datetime.fromtimestamp(now, UTC)
    qid = f"{at.strftime('%Y%m%dT%H%M%SZ')}-{sha256[:12]}-{secrets.token_hex(3)}"
    try:
        qdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(qdir / f"{qid}.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        line = {
            "run_id": qid,
            "at": at.isoformat(timespec="seconds"),
            "export": "upload",
            "kind": "quarantined",
            "reason_kind": error.reason_kind,
            "source_path": source,
            "reason": str(error),
            **error.fields(),
            "sha256": sha256,
            "bytes": len(data),
            "content_type": content_type,
            "agent": agent_id,
            "file": f"{qid}.bin",
        }
        append_line(qdir / QUARANTINE_FILE, json.dumps(line, ensure_ascii=False), mode=0o600)
    except OSError as e:
        log.error("upload %s refused (%s) but could not be quarantined: %s", source, error, e)
        return None
    log.warning("upload %s quarantined as %s: %s", source, qid, error)
    return qid


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


def upload_point_id(scope: str, source: str, sha256: str, chunk_index: int) -> str:
    """Deterministic: same scope, name and bytes -> the same ids (a re-upload overwrites)."""
    return str(uuid.uuid5(_UPLOAD_NAMESPACE, f"{scope}\x00{source}\x00{sha256}\x00{chunk_index}"))


def _checked_text(
    up: _Upload,
    data: bytes,
    filename: str,
    scanner: Scanner | None,
    settings: Settings,
    max_text_chars: int,
    blocked_keywords: Sequence[str],
) -> tuple[str, list[Section], str | None, int]:
    """Steps 1-4 of every upload: the scan (before any parser sees the bytes; no verdict, no
    upload), the text, the blocked keywords (on the text as extracted, before redaction, and
    the name), and redaction through the gateway's DLP. Returns the redacted title and
    sections, the encoding and the decode-error count; a refusal is quarantined."""
    _scan(up, scanner)
    try:
        title, sections, encoding, decode_errors = extract_sections(
            data, up.kind, max_markup_depth=settings.max_markup_depth, max_chars=max_text_chars
        )
    except UploadRefusedError as e:
        raise up.refuse(e) from None
    _check_keywords(up, filename, title, sections, blocked_keywords)
    title, sections = up.redact(title, sections)
    return title, sections, encoding, decode_errors


def scan_and_ingest(
    data: bytes,
    filename: str,
    content_type: str | None,
    *,
    scanner: Scanner | None,
    gateway: Gateway,
    knowledge: KnowledgeMemory,
    blocked_keywords: Sequence[str] = (),
    agent_id: str | None = None,
    namespace: str | None = None,
    namespaces: AclSource | None = None,
    section: str = "general",
    settings: Settings | None = None,
    quarantine_to: Path | None = None,
    max_bytes: int | None = None,
    max_text_chars: int = MAX_TEXT_CHARS,
    now: float | None = None,
) -> UploadResult:
    """Scan, read, check, clean, chunk and index one uploaded file (see the module doc).

    ``scanner`` None (none configured) is refused like an unreachable one. ``agent_id`` is
    the uploader (None: an in-process system write); ``namespace`` a shared namespace it
    asks to write under, granted only with ``write`` there per ``namespaces``. ``settings``
    default to ``knowledge.settings``; ``quarantine_to`` to :func:`quarantine_dir`;
    ``max_bytes`` to ``CTX_UPLOAD_MAX_BYTES``.

    Raises (nothing written to L3 in any case): :class:`UploadTooLargeError` (413),
    :class:`UnsupportedUploadTypeError` (415), :class:`ScannerUnavailableError` (503),
    :class:`~context_core.ingest.clamd.ScannerLimitError` (413), and the quarantining
    :class:`UploadInfectedError`, :class:`UploadBlockedError`, :class:`UploadUnreadableError`
    (422).
    """
    settings = settings or knowledge.settings
    t_now = time.time() if now is None else now
    _check_size(data, max_bytes if max_bytes is not None else settings.upload_max_bytes)
    up = _Upload.open(
        data,
        filename,
        content_type,
        gateway=gateway,
        agent_id=agent_id,
        qdir=quarantine_to if quarantine_to is not None else quarantine_dir(settings),
        now=t_now,
    )
    # 1-4. scan, text, blocked keywords, redaction
    title, sections, encoding, decode_errors = _checked_text(
        up, data, filename, scanner, settings, max_text_chars, blocked_keywords
    )
    # 5. chunk, embed, write (the first write to L3 happens here)
    chunks = _chunk(up, title, sections, knowledge.encoder, settings)
    scope = resolve_hot_scope(agent_id, namespace, namespaces)
    expires_at = t_now + settings.upload_ttl_hours * 3600.0
    records = _embed(up, chunks, knowledge.encoder, settings, title, section, scope, expires_at)
    replaced = _write(knowledge, records, source=up.source, scope=scope)
    return UploadResult(
        source=up.source,
        filename=up.name,
        content_type=up.mime,
        bytes=len(data),
        sha256=up.sha256,
        collection=knowledge.hot,
        scope=scope,
        chunks=len(records),
        point_ids=tuple(r.id for r in records),
        replaced=replaced,
        expires_at=expires_at,
        redactions=dict(sorted(up.found.items())),
        sections=len(sections),
        encoding=encoding,
        decode_errors=decode_errors,
    )


@dataclass(frozen=True, slots=True)
class CheckedFile:
    """A file that passed the upload checks: its redacted title and sections (not chunked)."""

    title: str
    sections: list[Section]
    content_type: str
    sha256: str
    redactions: dict[str, int]


def check_file(
    data: bytes,
    filename: str,
    content_type: str | None,
    *,
    scanner: Scanner | None,
    gateway: Gateway,
    settings: Settings,
    source: str,
    blocked_keywords: Sequence[str] = (),
    quarantine_to: Path | None = None,
    max_text_chars: int = MAX_TEXT_CHARS,
    now: float | None = None,
) -> CheckedFile:
    """Steps 1-5 of :func:`scan_and_ingest` (size, type, scan, extraction, blocked keywords,
    redaction) for a file that another job indexes: the Confluence sync's attachments.

    Raises what :func:`scan_and_ingest` raises for those steps; a refused file is quarantined
    under ``source`` in the same place and shape. Writes nothing to L3.
    """
    _check_size(data, settings.upload_max_bytes)
    up = _Upload.open(
        data,
        filename,
        content_type,
        gateway=gateway,
        agent_id=None,
        qdir=quarantine_to if quarantine_to is not None else quarantine_dir(settings),
        now=time.time() if now is None else now,
    )
    up.source = source
    title, sections, _, _ = _checked_text(
        up, data, filename, scanner, settings, max_text_chars, blocked_keywords
    )
    return CheckedFile(title, sections, up.mime, up.sha256, dict(sorted(up.found.items())))


# The steps of scan_and_ingest, in the order it runs them.


def _check_size(data: bytes, limit: int) -> None:
    if len(data) > limit:
        raise UploadTooLargeError(
            f"the file has {len(data)} bytes, over the {limit}-byte upload limit "
            "(CTX_UPLOAD_MAX_BYTES)",
            limit_bytes=limit,
        )


@dataclass(slots=True)
class _Upload:
    """One file on its way in: its cleaned name and identity, what the DLP found so far, and
    where a refusal quarantines it."""

    data: bytes
    name: str  # safe_filename, then cleaned by the gateway
    mime: str
    kind: UploadKind
    source: str  # upload:<agent or system>/<name>
    sha256: str
    agent_id: str | None
    gateway: Gateway
    qdir: Path
    now: float
    found: Counter[str]  # what the DLP removed, by kind

    @classmethod
    def open(
        cls,
        data: bytes,
        filename: str,
        content_type: str | None,
        *,
        gateway: Gateway,
        agent_id: str | None,
        qdir: Path,
        now: float,
    ) -> _Upload:
        """Name and type the file (415 here, before anything is read); clean the name."""
        name = safe_filename(filename)
        mime, kind = resolve_type(name, content_type)
        up = cls(data, name, mime, kind, "", "", agent_id, gateway, qdir, now, Counter())
        up.name = up.clean(name) or "upload"
        up.source = f"upload:{agent_id or 'system'}/{up.name}"
        up.sha256 = hashlib.sha256(data).hexdigest()
        return up

    def clean(self, text: str) -> str:
        """The text through the gateway's DLP, its findings counted."""
        out, findings = self.gateway.clean_text_with_findings(text, where="upload")
        self.found.update(f.kind for f in findings)
        return out

    def redact(self, title: str, sections: list[Section]) -> tuple[str, list[Section]]:
        """Title (the file name when there is none), headings and texts through the DLP."""
        clean = self.clean
        return (
            clean(title) if title else self.name,
            [Section(tuple(clean(h) for h in s.heading_path), clean(s.text)) for s in sections],
        )

    def refuse(self, error: UploadRefusedError) -> UploadRefusedError:
        """Quarantine the file for ``error``; the error, to raise."""
        error.quarantine_id = _quarantine(
            self.qdir,
            self.data,
            error,
            source=self.source,
            content_type=self.mime,
            sha256=self.sha256,
            agent_id=self.agent_id,
            now=self.now,
        )
        return error


def _scan(up: _Upload, scanner: Scanner | None) -> None:
    """No scanner or no verdict: 503; a finding: quarantined and refused."""
    if scanner is None:
        raise ScannerUnavailableError(
            "no malware scanner is configured (CTX_CLAMD_URL): uploads are refused until one is"
        )
    verdict = scanner.scan(up.data)
    if verdict.signature is not None:
        raise up.refuse(
            UploadInfectedError(
                f"the malware scanner found {verdict.signature!r} in the file; it was "
                "quarantined and not stored",
                signature=verdict.signature,
            )
        )


def _check_keywords(
    up: _Upload,
    filename: str,
    title: str,
    sections: list[Section],
    blocked_keywords: Sequence[str],
) -> None:
    """Refuse (and quarantine) a file whose name or extracted text holds a blocked keyword."""
    keywords = parse_keywords(list(blocked_keywords))
    if not keywords:
        return
    headings = [] if up.kind == "pdf" else [h for s in sections for h in s.heading_path]
    haystack = "\n".join([filename or "", title, *headings, *(s.text for s in sections)])
    blocked = find_blocked(haystack, keywords)
    hit = blocked[0] if blocked else None
    if hit is not None:
        raise up.refuse(
            UploadBlockedError(
                f"the file contains the blocked keyword {hit!r}; it was quarantined and not stored",
                keyword=hit,
            )
        )


def _chunk(
    up: _Upload, title: str, sections: list[Section], encoder: Encoder, settings: Settings
) -> list[Chunk]:
    """The cleaned file as one page, chunked by the ingest chunker."""
    from context_core.ingest.chunking import chunk_page

    page = Page(
        page_id=up.source,
        title=title,
        space="uploads",
        ancestors=(),
        author=None,
        updated_at=datetime.fromtimestamp(up.now, UTC),
        sections=tuple(sections),
        attachments=(),
        source_path=up.source,
        content_hash=compute_content_hash(title, sections),
    )
    chunks = chunk_page(
        page,
        encoder,
        max_tokens=settings.chunk_max_tokens,
        overlap=settings.chunk_overlap_tokens,
    )
    if not chunks:  # pragma: no cover - extract_sections refuses text-less files
        raise up.refuse(UploadUnreadableError("the file holds no text to index"))
    return list(chunks)


def _embed(
    up: _Upload,
    chunks: list[Chunk],
    encoder: Encoder,
    settings: Settings,
    title: str,
    section: str,
    scope: str,
    expires_at: float,
    /,
) -> list[PointRecord]:
    """Embed the chunks; one hot point each, trust-scoped like a hot answer."""
    vectors = encoder.encode([c.text for c in chunks], batch_size=settings.embed_batch_size)
    updated = datetime.fromtimestamp(up.now, UTC)
    records: list[PointRecord] = []
    for ch, vec in zip(chunks, vectors, strict=True):
        payload: dict[str, Any] = {
            "source": up.source,
            "title": title,
            "section": section,
            "heading_path": list(ch.heading_path),
            "updated_at": updated.isoformat(),
            "updated_at_ts": up.now,
            "chunk_index": ch.chunk_index,
            "n_chunks": len(chunks),
            "n_tokens": ch.n_tokens,
            "content_hash": up.sha256,
            "text": ch.text,
            "model": encoder.name,
            "expires_at": expires_at,
            "confirmed": False,
            "kind": "upload",
            "filename": up.name,
            "content_type": up.mime,
            "written_by": up.agent_id or None,
            "namespace": scope,
            "trust": UNREVIEWED,
        }
        pid = upload_point_id(scope, up.source, up.sha256, ch.chunk_index)
        records.append(PointRecord(pid, vec, payload))
    return records


def _write(
    knowledge: KnowledgeMemory, records: list[PointRecord], *, source: str, scope: str
) -> int:
    """Upsert into the hot collection, then drop an earlier version's chunks (same name and
    scope, other ids); how many were dropped."""
    knowledge.ensure_collections()
    store, hot = knowledge.store, knowledge.hot
    knowledge.upsert_chunks(hot, records)
    new_ids = {r.id for r in records}
    stale = [
        rec.id
        for rec in store.scroll(hot, filter={"source": source, "namespace": scope}, batch=1024)
        if rec.id not in new_ids
    ]
    if stale:
        store.delete(hot, ids=stale)
    log.info("upload %s: %d chunk(s) into %s (scope %s)", source, len(records), hot, scope)
    return len(stale)
