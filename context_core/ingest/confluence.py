"""Reader for Confluence HTML exports (a folder or the .zip Confluence gives).

Layouts it understands (see the DLX export under ``shared/data/confluence``)::

    index.html                      a space export: space details table (Key, Name) +
                                    "Available Pages" tree; or, for "Export page -> HTML",
                                    the page itself; or absent (loose page files)
    <Title>_<id>.html | <id>.html   one page each: #breadcrumbs, #title-text ("Space : Title"),
    | <Title>.html                  div.page-metadata, #main-content, "Attachments:" section
    attachments/<page id>/...       files (listed by name on the page, never embedded)

Every page file becomes a :class:`Page` or, when it cannot be used, a :class:`Quarantined`
with the reason; a bad page never stops the others. Files are read lazily and with hard bounds
(:mod:`context_core.ingest.archive`: per-page and per-export byte caps, zip-slip names refused),
and a page nested deeper than ``max_markup_depth`` is quarantined before it is rendered. The
body renderer (:func:`render_sections`) is shared with the storage-format reader, which maps
``ac:`` macros onto the same HTML shapes.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

from lxml import etree

from context_core.errors import IngestError
from context_core.ingest.archive import Export, open_export
from context_core.ingest.dates import explain_no_date, find_date
from context_core.ingest.model import DateSource, Page, Quarantined, compute_content_hash
from context_core.ingest.render import (
    depth_problem,
    element_text,
    normalise_line,
    parser_limit_hit,
    render_sections,
)

__all__ = [
    "DEFAULT_MAX_EXPORT_BYTES",
    "DEFAULT_MAX_MARKUP_DEPTH",
    "DEFAULT_MAX_PAGE_BYTES",
    "ExportInfo",
    "ExportKind",
    "describe_export",
    "parse_export_page",
    "read_export_info",
    "read_html_export",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_PAGE_BYTES = 5 * 1024 * 1024
DEFAULT_MAX_EXPORT_BYTES = 2 * 1024**3
DEFAULT_MAX_MARKUP_DEPTH = 200

ExportKind = Literal["space", "page", "pages"]


def _parse_html(data: bytes) -> tuple[etree._Element, str | None]:
    """Plain lxml.etree HTML parse (lxml.html's element classes cost ~2x on large exports),
    plus libxml2's message when it stopped at one of its limits (the tree is then truncated:
    e.g. past 256 nesting levels the rest of the document is silently dropped)."""
    parser = etree.HTMLParser(encoding="utf-8", no_network=True)
    root = etree.fromstring(data, parser=parser)
    if root is None:
        raise etree.ParserError("Document is empty")
    return root, parser_limit_hit(parser.error_log)


@dataclass(slots=True)
class _Index:
    """One walk over a page: elements by id, the few classes the reader looks up, and the
    nesting depth (an iterative walk, so a hostile 100,000-level page costs no recursion)."""

    ids: dict[str, etree._Element]
    classes: dict[str, list[etree._Element]]
    depth: int

    @classmethod
    def build(cls, root: etree._Element, wanted: tuple[str, ...]) -> _Index:
        ids: dict[str, etree._Element] = {}
        classes: dict[str, list[etree._Element]] = {w: [] for w in wanted}
        depth = deepest = 0
        for event, el in etree.iterwalk(root, events=("start", "end")):
            if event == "end":
                depth -= 1
                continue
            depth += 1
            if depth > deepest:
                deepest = depth
            ident = el.get("id")
            if ident is not None:
                ids.setdefault(ident, el)
            c = el.get("class")
            if c and any(w in c for w in wanted):
                for name in c.split():
                    if name in classes:
                        classes[name].append(el)
        return cls(ids, classes, deepest)


def _by_class(root: etree._Element, cls: str, *, below: bool = False) -> list[etree._Element]:
    """Elements whose class list contains ``cls`` (in the document, or only below ``root``)."""
    scope = ".//" if below else "//"
    expr = f"{scope}*[contains(concat(' ', normalize-space(@class), ' '), $c)]"
    return list(root.xpath(expr, c=f" {cls} "))


_PAGE_FILE = re.compile(r"(?:^|_)(\d+)\.html?$", re.IGNORECASE)
_ATTACHMENT_LINK = re.compile(r"^(?:\./)?attachments/(\d+)/")
# Confluence writes this placeholder for whiteboards/databases it cannot export.
_UNSUPPORTED_PLACEHOLDER = "we currently only support exported pages"


@dataclass(frozen=True, slots=True)
class ExportInfo:
    """What index.html says about the export.

    ``kind``: "space" = index.html is a space index (Key/Name details table or "Available
    Pages" tree); "page" = index.html is itself a page ("Export page -> HTML"); "pages" = no
    index.html (or an unrelated one), only page files. ``complete`` is True only for "space":
    such an export claims to hold the whole space, so pages missing from it may be deleted;
    the other kinds hold a part of a space and must never cause deletes.
    """

    space_key: str | None
    space_name: str | None
    home_id: str | None
    tree: dict[str, str | None]  # page id -> parent page id, from "Available Pages"
    titles: dict[str, str]  # page id -> title as listed in the tree
    kind: ExportKind = "pages"
    complete: bool = False


def _page_id(name: str) -> str | None:
    m = _PAGE_FILE.search(unquote(name))
    return m.group(1) if m else None


def _space_details(root: etree._Element) -> dict[str, str]:
    details: dict[str, str] = {}
    for tr in root.iter("tr"):
        ths, tds = tr.findall("th"), tr.findall("td")
        if ths and tds:
            details[normalise_line(element_text(ths[0])).lower()] = normalise_line(
                element_text(tds[0])
            )
    return details


def _page_tree(idx: _Index) -> tuple[bool, dict[str, str | None], dict[str, str], str | None]:
    """(has an "Available Pages" section, page -> parent, page -> title, home id).

    Walked with an explicit stack in document order (a recursive walk would let a hostile
    index.html choose the recursion depth).
    """
    tree: dict[str, str | None] = {}
    titles: dict[str, str] = {}
    home_id: str | None = None
    found = False
    for section in idx.classes["pageSection"]:
        h2 = section.find(".//h2")
        if h2 is None or "available pages" not in element_text(h2).lower():
            continue
        found = True
        stack: list[tuple[etree._Element, str | None]] = [
            (ul, None) for ul in reversed(section.findall("ul"))
        ]
        while stack:
            el, parent = stack.pop()
            if el.tag == "ul":
                stack.extend(
                    (li, parent)
                    for li in reversed(el)
                    if isinstance(li.tag, str) and li.tag == "li"
                )
                continue
            a = el.find("a")
            pid = _page_id(a.get("href", "")) if a is not None else None
            if pid and a is not None:
                tree[pid] = parent
                titles[pid] = normalise_line(element_text(a))
                if home_id is None and any(
                    "home_page" in (img.get("src") or "") for img in el.findall("img")
                ):
                    home_id = pid
            stack.extend((sub, pid or parent) for sub in reversed(el.findall("ul")))
    if home_id is None:
        roots = [p for p, parent in tree.items() if parent is None]
        home_id = roots[0] if len(roots) == 1 else None
    return found, tree, titles, home_id


def _page_space_name(idx: _Index) -> str | None:
    """The space a page belongs to: the first breadcrumb (Confluence puts the space there),
    else the "Space" of a "Space : Title" heading."""
    crumbs = idx.ids.get("breadcrumbs")
    first = next(crumbs.iter("a"), None) if crumbs is not None else None
    if first is not None:
        name = normalise_line(element_text(first))
        if name:
            return name
    title_el = idx.ids.get("title-text")
    raw = normalise_line(element_text(title_el)) if title_el is not None else ""
    if " : " in raw:
        return raw.split(" : ", 1)[0].strip() or None
    return None


def read_export_info(index_html: bytes) -> ExportInfo:
    """Parse index.html: which kind of export it heads, the space key/name and the page tree.

    A space index is recognised by its "Available Pages" tree, by a ``#main-content`` of class
    ``pageSection``, or by a Key/Name details table outside any page body; a page by a
    ``#main-content`` of class ``wiki-content`` (or a ``#title-text`` beside a
    ``#main-content``). For a page, ``space_key`` and ``space_name`` are both the space *name*
    (a page export does not carry the key). Anything else is an unrelated index.html (empty or
    unparseable ones included): kind "pages", nothing known, never complete.
    """
    try:
        root, stopped = _parse_html(index_html)
    except (etree.LxmlError, ValueError):
        return ExportInfo(None, None, None, {}, {}, kind="pages")
    idx = _Index.build(root, ("pageSection",))
    main = idx.ids.get("main-content")
    main_cls = set((main.get("class") or "").split()) if main is not None else set()
    has_tree, tree, titles, home_id = _page_tree(idx)
    details = {} if "wiki-content" in main_cls else _space_details(root)
    if has_tree or "pageSection" in main_cls or {"key", "name"} <= details.keys():
        if stopped is not None:
            log.warning("index.html was cut off by the parser (%s): not a complete export", stopped)
        return ExportInfo(
            space_key=details.get("key") or None,
            space_name=details.get("name") or None,
            home_id=home_id,
            tree=tree,
            titles=titles,
            kind="space",
            complete=stopped is None,
        )
    if main is not None and ("wiki-content" in main_cls or "title-text" in idx.ids):
        name = _page_space_name(idx)
        return ExportInfo(name, name, None, {}, {}, kind="page")
    return ExportInfo(None, None, None, {}, {}, kind="pages")


def _read_index(export: Export, stem: str) -> tuple[ExportInfo, bytes | None]:
    """ExportInfo (space key defaulted to ``stem``) and the index.html bytes, if any.

    An index.html that cannot be read whole (over max_page_bytes, corrupt) makes the export
    unreadable: without it neither the space key nor whether deletes are safe is known.
    """
    if export.index is None:
        return ExportInfo(stem, None, None, {}, {}), None
    got = export.read(export.index)
    if isinstance(got, str):
        raise IngestError(f"cannot read {export.index.display}: {got}")
    info = read_export_info(got)
    return replace(info, space_key=info.space_key or stem), got


def describe_export(
    path: Path | str, *, max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
) -> ExportInfo:
    """What kind of export ``path`` is, reading only its index.html (capped, streamed for zips).

    ``space_key`` is what :func:`read_html_export` uses when no ``space`` override is given:
    for kind "space" the index's Key; for kind "page" the space name from the first breadcrumb
    or from "Space : Title" (a page export carries no key); otherwise, and whenever that is
    missing, the folder or zip file stem. Raises :class:`IngestError` when the export cannot be
    opened or its index.html cannot be read whole.
    """
    path = Path(path)
    with open_export(path, max_page_bytes=max_page_bytes) as export:
        info, _ = _read_index(export, path.stem)
    return info


def read_html_export(
    path: Path | str,
    *,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
    space: str | None = None,
    max_export_bytes: int = DEFAULT_MAX_EXPORT_BYTES,
    max_markup_depth: int = DEFAULT_MAX_MARKUP_DEPTH,
) -> Iterator[Page | Quarantined]:
    """Yield one Page or Quarantined per page file of an HTML export, in file-name order.

    When index.html is itself a page ("Export page -> HTML") it comes first. ``space``
    overrides the space key; without it the key is :func:`describe_export`'s (space index Key,
    else for a page export the space name from its breadcrumb or "Space : Title", else the
    folder or zip stem). Files are read one at a time, each at most ``max_page_bytes``
    (uncompressed, counted while streaming), all together at most ``max_export_bytes``; a page
    nested deeper than ``max_markup_depth`` is quarantined. Raises :class:`IngestError` only
    when the export as a whole is unreadable (missing path, not a folder or zip, no .html in
    it, index.html unreadable); a folder holding only an unrelated index.html yields nothing.
    """
    path = Path(path)
    with open_export(
        path, max_page_bytes=max_page_bytes, max_export_bytes=max_export_bytes
    ) as export:
        info, index_data = _read_index(export, path.stem)
        space_key = space or info.space_key or path.stem
        if info.kind == "page" and index_data is not None and export.index is not None:
            yield parse_export_page(
                index_data,
                file_name=export.index.name,
                source_path=export.index.display,
                mtime=export.index.mtime,
                space=space_key,
                info=info,
                max_page_bytes=max_page_bytes,
                max_markup_depth=max_markup_depth,
            )
        for member in export.pages:
            got = export.read(member)
            if isinstance(got, str):
                yield Quarantined(member.display, got)
                continue
            yield parse_export_page(
                got,
                file_name=member.name,
                source_path=member.display,
                mtime=member.mtime,
                space=space_key,
                info=info,
                max_page_bytes=max_page_bytes,
                max_markup_depth=max_markup_depth,
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
    max_markup_depth: int = DEFAULT_MAX_MARKUP_DEPTH,
) -> Page | Quarantined:
    """Parse one exported page file; never raises for bad content.

    The page id comes from the file name (``Title_<id>.html`` / ``<id>.html``); a file named
    without one (``index.html`` of a page export, ``Some-Title.html``) gets it from its content
    instead (see :func:`_content_page_id`).
    """
    info = info or ExportInfo(None, None, None, {}, {})
    if len(data) > max_page_bytes:
        return Quarantined(
            source_path,
            f"page is {len(data)} bytes, over max_page_bytes={max_page_bytes} "
            "(raise CTX_MAX_PAGE_BYTES to ingest it)",
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return Quarantined(source_path, f"not valid UTF-8 at byte {e.start}")
    try:
        root, stopped = _parse_html(data)
    except (etree.LxmlError, ValueError) as e:
        return Quarantined(source_path, f"unparseable HTML: {e}")
    idx = _Index.build(root, ("pageSection", "page-metadata"))
    problem = depth_problem(idx.depth, max_markup_depth, stopped)
    if problem:
        return Quarantined(source_path, problem)
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
    try:
        sections = render_sections(body)
    except RecursionError:  # defensive: the depth check should have caught it
        return Quarantined(
            source_path,
            f"markup nested too deep to render (recursion limit hit under "
            f"max_markup_depth={max_markup_depth}; lower CTX_MAX_MARKUP_DEPTH)",
        )
    if not sections:
        return Quarantined(source_path, "empty body: #main-content has no text")
    ancestors, ancestor_ids = _breadcrumbs(idx, info)
    author, updated_at, date_source, date_note = _metadata(idx, mtime, source_path)
    return Page(
        page_id=_page_id(file_name) or _content_page_id(root, space, title),
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
        date_note=date_note,
    )


def _content_page_id(root: etree._Element, space: str, title: str) -> str:
    """A page id for a file whose name carries none, from the page itself.

    1. The ``<id>`` of its ``attachments/<id>/...`` links: Confluence files a page's
       attachments under its own id. The most common one wins (a page may embed another
       page's image); a tie is ambiguous and falls through.
    2. ``<meta name="ajs-page-id">`` or a ``data-page-id`` attribute, where the export kept one.
    3. ``"page-" + sha256(space + "\\x1f" + title)[:16]``: stable across runs as long as the
       page keeps its space and title, so re-ingesting updates it instead of duplicating it.
    """
    counts: Counter[str] = Counter()
    for el in root.iter("a", "img"):
        m = _ATTACHMENT_LINK.match(el.get("href") or el.get("src") or "")
        if m:
            counts[m.group(1)] += 1
    top = counts.most_common(2)
    if top and (len(top) == 1 or top[0][1] > top[1][1]):
        return top[0][0]
    for el in root.iter("meta"):
        content = (el.get("content") or "").strip()
        if el.get("name") == "ajs-page-id" and content.isdigit():
            return content
    for el in root.xpath("//*[@data-page-id]"):
        value = (el.get("data-page-id") or "").strip()
        if value.isdigit():
            return value
    digest = hashlib.sha256(f"{space}\x1f{title}".encode()).hexdigest()
    return f"page-{digest[:16]}"


def _strip_space(raw_title: str, space_name: str | None) -> str:
    if space_name and raw_title.startswith(f"{space_name} : "):
        return raw_title[len(space_name) + 3 :].strip()
    if " : " in raw_title:
        return raw_title.split(" : ", 1)[1].strip()
    return raw_title


def _breadcrumbs(idx: _Index, info: ExportInfo) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Ancestor titles and ids, dropping the space link (index.html, or the first crumb when it
    links to no page) and the space home.

    The home is recognised from index.html (its tree icon) or, without an index, as the first
    page crumb, which is where Confluence always puts it.
    """
    crumbs = idx.ids.get("breadcrumbs")
    if crumbs is None:
        return (), ()
    items: list[tuple[str, str]] = []
    for i, a in enumerate(crumbs.iter("a")):
        href = a.get("href", "")
        if href.endswith("index.html") or (i == 0 and _page_id(href) is None):
            continue  # the space link (to index.html in a space export, anywhere in a page one)
        items.append((_page_id(href) or "", normalise_line(element_text(a))))
    if items and (items[0][0] == info.home_id or info.home_id is None):
        items = items[1:]
    items = [(pid, t) for pid, t in items if t]
    return tuple(t for _, t in items), tuple(pid for pid, _ in items)


_BY = re.compile(r"\(unlicensed\)", re.IGNORECASE)


def _metadata(
    idx: _Index, mtime: float, source: str
) -> tuple[str | None, datetime, DateSource, str]:
    """(author, last modified, where the date came from, why the metadata date was not used)."""
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
        return author, dt, "metadata", ""
    why = explain_no_date(text) if meta is not None else "no div.page-metadata on the page"
    note = f"{why}; the file modification time was used as the last-modified date"
    log.warning("%s: %s", source, note)
    return author, datetime.fromtimestamp(mtime, tz=UTC), "mtime", note


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
