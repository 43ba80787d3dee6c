"""Reader for Confluence "Export space -> HTML" output (a folder or the .zip Confluence gives).

Layout it understands (see the DLX export under ``shared/data/confluence``)::

    index.html                      space details table (Key, Name) + "Available Pages" tree
    <Title>_<id>.html | <id>.html   one page each: #breadcrumbs, #title-text ("Space : Title"),
                                    div.page-metadata, #main-content, "Attachments:" section
    attachments/<page id>/...       files (listed by name on the page, never embedded)

Every page file becomes a :class:`Page` or, when it cannot be used, a :class:`Quarantined`
with the reason; a bad page never stops the others. The body renderer (:func:`render_sections`)
is shared with the storage-format reader, which maps ``ac:`` macros onto the same HTML shapes.
"""

from __future__ import annotations

import logging
import os
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

from lxml import etree

from context_core.errors import IngestError
from context_core.ingest.dates import find_date
from context_core.ingest.model import DateSource, Page, Quarantined, compute_content_hash
from context_core.ingest.render import element_text, normalise_line, render_sections

__all__ = [
    "DEFAULT_MAX_PAGE_BYTES",
    "ExportInfo",
    "parse_export_page",
    "read_export_info",
    "read_html_export",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_PAGE_BYTES = 5 * 1024 * 1024


def _parse_html(data: bytes) -> etree._Element:
    """Plain lxml.etree HTML parse (lxml.html's element classes cost ~2x on large exports)."""
    root = etree.fromstring(data, parser=etree.HTMLParser(encoding="utf-8"))
    if root is None:
        raise etree.ParserError("Document is empty")
    return root


@dataclass(slots=True)
class _Index:
    """One walk over a page: elements by id and the few classes the reader looks up."""

    ids: dict[str, etree._Element]
    classes: dict[str, list[etree._Element]]

    @classmethod
    def build(cls, root: etree._Element, wanted: tuple[str, ...]) -> _Index:
        ids: dict[str, etree._Element] = {}
        classes: dict[str, list[etree._Element]] = {w: [] for w in wanted}
        for el in root.iter():
            ident = el.get("id")
            if ident is not None:
                ids.setdefault(ident, el)
            c = el.get("class")
            if c and any(w in c for w in wanted):
                for name in c.split():
                    if name in classes:
                        classes[name].append(el)
        return cls(ids, classes)


def _by_class(root: etree._Element, cls: str, *, below: bool = False) -> list[etree._Element]:
    """Elements whose class list contains ``cls`` (in the document, or only below ``root``)."""
    scope = ".//" if below else "//"
    expr = f"{scope}*[contains(concat(' ', normalize-space(@class), ' '), $c)]"
    return list(root.xpath(expr, c=f" {cls} "))


_PAGE_FILE = re.compile(r"(?:^|_)(\d+)\.html?$", re.IGNORECASE)
# Confluence writes this placeholder for whiteboards/databases it cannot export.
_UNSUPPORTED_PLACEHOLDER = "we currently only support exported pages"


@dataclass(frozen=True, slots=True)
class ExportInfo:
    """What index.html says about the space."""

    space_key: str | None
    space_name: str | None
    home_id: str | None
    tree: dict[str, str | None]  # page id -> parent page id, from "Available Pages"
    titles: dict[str, str]  # page id -> title as listed in the tree


@dataclass(frozen=True, slots=True)
class _File:
    name: str
    display: str
    data: bytes | None  # None = read from disk when its turn comes (keeps memory flat)
    mtime: float


def _page_id(name: str) -> str | None:
    m = _PAGE_FILE.search(unquote(name))
    return m.group(1) if m else None


def read_export_info(index_html: bytes) -> ExportInfo:
    """Parse index.html: space key/name from the details table and the page tree."""
    root = _parse_html(index_html)
    details: dict[str, str] = {}
    for tr in root.iter("tr"):
        ths, tds = tr.findall("th"), tr.findall("td")
        if ths and tds:
            details[normalise_line(element_text(ths[0])).lower()] = normalise_line(
                element_text(tds[0])
            )
    tree: dict[str, str | None] = {}
    titles: dict[str, str] = {}
    home_id: str | None = None

    def visit(ul: etree._Element, parent: str | None) -> None:
        nonlocal home_id
        for li in ul:
            if not isinstance(li.tag, str) or li.tag != "li":
                continue
            a = li.find("a")
            pid = _page_id(a.get("href", "")) if a is not None else None
            if pid:
                tree[pid] = parent
                titles[pid] = normalise_line(element_text(a))
                if home_id is None and any(
                    "home_page" in (img.get("src") or "") for img in li.findall("img")
                ):
                    home_id = pid
            for sub in li.findall("ul"):
                visit(sub, pid or parent)

    for section in _by_class(root, "pageSection"):
        h2 = section.find(".//h2")
        if h2 is not None and "available pages" in element_text(h2).lower():
            for ul in section.findall("ul"):
                visit(ul, None)
    if home_id is None:
        roots = [p for p, parent in tree.items() if parent is None]
        home_id = roots[0] if len(roots) == 1 else None
    return ExportInfo(
        space_key=details.get("key") or None,
        space_name=details.get("name") or None,
        home_id=home_id,
        tree=tree,
        titles=titles,
    )


def _files(path: Path) -> tuple[bytes | None, list[_File]]:
    """(index.html bytes or None, page files) of a folder or zip export."""
    if not path.exists():
        raise IngestError(f"export path {path} does not exist; pass a folder or .zip export")
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise IngestError(f"{path} is neither a folder nor a .zip Confluence export")
        return _zip_files(path)
    base = path
    if not (base / "index.html").is_file():
        found = sorted(path.glob("*/index.html"))
        if len(found) == 1:
            base = found[0].parent
    index = (base / "index.html").read_bytes() if (base / "index.html").is_file() else None
    files = []
    for p in sorted(base.iterdir()):
        if p.is_file() and p.suffix.lower() in (".html", ".htm") and p.name != "index.html":
            files.append(_File(p.name, str(p), None, p.stat().st_mtime))
    if not files and index is None:
        raise IngestError(f"no .html pages in {path}; is this a Confluence HTML export?")
    return index, files


def _zip_files(path: Path) -> tuple[bytes | None, list[_File]]:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            indexes = sorted(
                (i for i in infos if i.filename.rsplit("/", 1)[-1] == "index.html"),
                key=lambda i: i.filename.count("/"),
            )
            prefix = indexes[0].filename[: -len("index.html")] if indexes else ""
            index = zf.read(indexes[0]) if indexes else None
            files = []
            for i in sorted(infos, key=lambda i: i.filename):
                rest = i.filename[len(prefix) :]
                if not i.filename.startswith(prefix) or "/" in rest or rest == "index.html":
                    continue
                if not rest.lower().endswith((".html", ".htm")):
                    continue
                mtime = datetime(*i.date_time, tzinfo=UTC).timestamp()
                files.append(_File(rest, f"{path}!/{i.filename}", zf.read(i), mtime))
    except (zipfile.BadZipFile, OSError) as e:
        raise IngestError(f"cannot read zip export {path}: {e}") from e
    return index, files


def read_html_export(
    path: Path | str, *, max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES, space: str | None = None
) -> Iterator[Page | Quarantined]:
    """Yield one Page or Quarantined per page file of an HTML space export, in file-name order.

    ``space`` overrides the space key (default: "Key" from index.html, else the folder name).
    Raises :class:`IngestError` only when the export as a whole is unreadable.
    """
    path = Path(path)
    index, files = _files(path)
    info = read_export_info(index) if index else ExportInfo(None, None, None, {}, {})
    space_key = space or info.space_key or path.stem
    for f in files:
        data = f.data
        if data is None:
            try:
                size = os.path.getsize(f.display)
                if size > max_page_bytes:
                    yield Quarantined(
                        f.display,
                        f"page is {size} bytes, over max_page_bytes={max_page_bytes} "
                        "(raise CTX_MAX_PAGE_BYTES to ingest it)",
                    )
                    continue
                data = Path(f.display).read_bytes()
            except OSError as e:
                yield Quarantined(f.display, f"unreadable file: {e}")
                continue
        yield parse_export_page(
            data,
            file_name=f.name,
            source_path=f.display,
            mtime=f.mtime,
            space=space_key,
            info=info,
            max_page_bytes=max_page_bytes,
        )


def parse_export_page(
    data: bytes,
    *,
    file_name: str,
    source_path: str,
    mtime: float,
    space: str,
    info: ExportInfo | None = None,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
) -> Page | Quarantined:
    """Parse one exported page file; never raises for bad content."""
    info = info or ExportInfo(None, None, None, {}, {})
    if len(data) > max_page_bytes:
        return Quarantined(
            source_path,
            f"page is {len(data)} bytes, over max_page_bytes={max_page_bytes} "
            "(raise CTX_MAX_PAGE_BYTES to ingest it)",
        )
    page_id = _page_id(file_name)
    if page_id is None:
        return Quarantined(source_path, f"cannot derive a page id from file name {file_name!r}")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return Quarantined(source_path, f"not valid UTF-8 at byte {e.start}")
    try:
        root = _parse_html(data)
    except (etree.LxmlError, ValueError) as e:
        return Quarantined(source_path, f"unparseable HTML: {e}")
    idx = _Index.build(root, ("pageSection", "page-metadata"))
    title_el = idx.ids.get("title-text")
    raw_title = normalise_line(element_text(title_el)) if title_el is not None else ""
    title = _strip_space(raw_title, info.space_name)
    if not title:
        return Quarantined(source_path, "malformed page: no #title-text (no page title)")
    body = idx.ids.get("main-content")
    if body is None:
        return Quarantined(source_path, "empty body: no #main-content (a folder-only page?)")
    body_text = normalise_line(element_text(body)).lower()
    if body_text == _UNSUPPORTED_PLACEHOLDER or (
        body_text.startswith(_UNSUPPORTED_PLACEHOLDER) and idx.ids.get("main-content-2") is not None
    ):
        return Quarantined(
            source_path, "unsupported content: whiteboard/database placeholder, not a page"
        )
    sections = render_sections(body)
    if not sections:
        return Quarantined(source_path, "empty body: #main-content has no text")
    ancestors, ancestor_ids = _breadcrumbs(idx, info)
    author, updated_at, date_source = _metadata(idx, mtime, source_path)
    return Page(
        page_id=page_id,
        title=title,
        space=space,
        ancestors=ancestors,
        author=author,
        updated_at=updated_at,
        sections=tuple(sections),
        attachments=_attachments(idx),
        source_path=source_path,
        content_hash=compute_content_hash(title, sections),
        ancestor_ids=ancestor_ids,
        date_source=date_source,
    )


def _strip_space(raw_title: str, space_name: str | None) -> str:
    if space_name and raw_title.startswith(f"{space_name} : "):
        return raw_title[len(space_name) + 3 :].strip()
    if " : " in raw_title:
        return raw_title.split(" : ", 1)[1].strip()
    return raw_title


def _breadcrumbs(idx: _Index, info: ExportInfo) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Ancestor titles and ids, dropping the space link (index.html) and the space home.

    The home is recognised from index.html (its tree icon) or, without an index, as the first
    page crumb, which is where Confluence always puts it.
    """
    crumbs = idx.ids.get("breadcrumbs")
    if crumbs is None:
        return (), ()
    items: list[tuple[str, str]] = []
    for a in crumbs.iter("a"):
        href = a.get("href", "")
        if href.endswith("index.html"):
            continue
        items.append((_page_id(href) or "", normalise_line(element_text(a))))
    if items and (items[0][0] == info.home_id or info.home_id is None):
        items = items[1:]
    items = [(pid, t) for pid, t in items if t]
    return tuple(t for _, t in items), tuple(pid for pid, _ in items)


_BY = re.compile(r"\(unlicensed\)", re.IGNORECASE)


def _metadata(idx: _Index, mtime: float, source: str) -> tuple[str | None, datetime, DateSource]:
    meta = next(iter(idx.classes["page-metadata"]), None)
    author: str | None = None
    text = ""
    if meta is not None:
        text = normalise_line(element_text(meta))
        spans = _by_class(meta, "author", below=True)
        names = [normalise_line(_BY.sub("", element_text(s))) for s in spans]
        names = [n for n in names if n]
        author = names[-1] if names else None  # "last modified by" comes second
    dt = find_date(text) if text else None
    if dt is not None:
        return author, dt, "metadata"
    log.warning(
        "no parseable last-modified date in %s (metadata %r); using the file mtime",
        source,
        text[:120],
    )
    return author, datetime.fromtimestamp(mtime, tz=UTC), "mtime"


def _attachments(idx: _Index) -> tuple[str, ...]:
    names: list[str] = []
    for section in idx.classes["pageSection"]:
        h = section.find(".//h2")
        if h is None or "attachments" not in (h.get("id") or element_text(h).lower()):
            continue
        for a in section.iter("a"):
            if "attachments/" in (a.get("href") or ""):
                n = normalise_line(element_text(a))
                if n and n not in names:
                    names.append(n)
    return tuple(names)
