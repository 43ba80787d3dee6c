"""Reader for Confluence *storage format*: the ``body.storage`` XHTML the REST API returns.

Storage format is XHTML plus ``ac:`` (macros, links, tasks, layouts) and ``ri:`` (resource
identifiers) elements, with HTML named entities (``&nbsp;``) that plain XML does not know. This
module rewrites it into the same HTML shapes the export reader renders, so both sources give
identical sections for identical content:

* ``code`` / ``noformat`` macros -> "Code:" (or "Code (title):") + the CDATA body, line by line
* ``info`` / ``note`` / ``warning`` / ``tip`` -> "Info: ..." / "Note: ..." / ... panels
* ``expand`` -> its title as a line, then its body; ``panel`` and unknown macros -> their body
* ``status`` -> its title; ``jira`` -> the issue key; ``toc``, ``anchor``, ``children``,
  ``attachments`` and images -> dropped (navigation, not content)
* ``ac:link`` -> its link text, else the linked page title / attachment file name
* task lists -> list items

Hostile bodies are refused rather than half-read: markup declarations (``<!DOCTYPE``,
``<!ENTITY``: billion-laughs expansion, ``SYSTEM "file:///etc/passwd"``) are never written by
Confluence, so a body holding one outside CDATA raises :class:`IngestError` before parsing; the
parser itself never resolves entities, loads DTDs or touches the network; and a body nested
deeper than ``max_markup_depth`` (or past the parser's own 2048-level limit, where libxml2
would silently cut it off) raises before the recursive converter sees it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from html.entities import name2codepoint

from lxml import etree

from context_core.errors import IngestError
from context_core.ingest.model import DateSource, Page, compute_content_hash
from context_core.ingest.render import (
    depth_problem,
    markup_depth,
    parser_limit_hit,
    render_sections,
)

__all__ = ["parse_storage_page", "storage_to_html"]

AC = "http://atlassian.com/content"
RI = "http://atlassian.com/resource/identifier"
_XML_ENTITIES = {"amp", "lt", "gt", "quot", "apos"}
_ENTITY = re.compile(r"&([A-Za-z][A-Za-z0-9]{1,31});")
# CDATA sections and comments are skipped (a code macro may well quote "<!DOCTYPE html>");
# a markup declaration anywhere else is what the regex is after.
_DECLARATION = re.compile(
    r"<!\[CDATA\[.*?(?:\]\]>|\Z)|<!--.*?(?:-->|\Z)|<!(DOCTYPE|ENTITY|ELEMENT|ATTLIST|NOTATION)\b",
    re.IGNORECASE | re.DOTALL,
)
DEFAULT_MAX_MARKUP_DEPTH = 200
_PANEL_MACROS = {"info", "note", "warning", "tip"}
_DROP_MACROS = {
    "toc",
    "toc-zone",
    "anchor",
    "children",
    "attachments",
    "pagetree",
    "recently-updated",
    "contentbylabel",
    "gallery",
    "view-file",
    "viewpdf",
    "profile",
    "livesearch",
}
_DROP_AC = {"image", "emoticon", "placeholder", "parameter", "task-id", "task-uuid"}


def _entities_to_numeric(xhtml: str) -> str:
    """&nbsp; -> &#160; etc. (XML knows only five named entities); unknown names -> text."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in _XML_ENTITIES:
            return m.group(0)
        cp = name2codepoint.get(name)
        return f"&#{cp};" if cp is not None else f"&amp;{name};"

    return _ENTITY.sub(repl, xhtml)


def _declaration(xhtml: str) -> str | None:
    """The first markup declaration (DOCTYPE, ENTITY, ...) outside CDATA and comments."""
    for m in _DECLARATION.finditer(xhtml):
        if m.group(1):
            return m.group(1).upper()
    return None


def _q(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


def _param(macro: etree._Element, name: str) -> str:
    for p in macro.iterchildren(_q(AC, "parameter")):
        if p.get(_q(AC, "name")) == name:
            return " ".join("".join(p.itertext()).split())
    return ""


def _child(el: etree._Element, ns: str, name: str) -> etree._Element | None:
    return next(el.iterchildren(_q(ns, name)), None)


class _Converter:
    def __init__(self) -> None:
        self.attachments: list[str] = []

    def _note_attachment(self, el: etree._Element) -> None:
        for att in el.iter(_q(RI, "attachment")):
            name = att.get(_q(RI, "filename"))
            if name and name not in self.attachments:
                self.attachments.append(name)

    def convert(self, el: etree._Element) -> etree._Element | None:
        """A namespace-free HTML element for ``el`` (None = drop it, keep its tail)."""
        tag = el.tag if isinstance(el.tag, str) else ""
        if not tag:
            return None  # comments, processing instructions
        if tag.startswith(f"{{{AC}}}"):
            return self._ac(el, tag.split("}", 1)[1])
        if tag.startswith(f"{{{RI}}}"):
            return None
        local = tag.rsplit("}", 1)[-1]
        out = etree.Element(local)
        for k in ("class", "id", "datetime", "colspan", "rowspan"):
            if el.get(k) is not None:
                out.set(k, el.get(k))
        if local == "time" and not "".join(el.itertext()).strip():
            out.text = el.get("datetime", "")
        self._copy_children(el, out)
        return out

    def _copy_children(self, src: etree._Element, dst: etree._Element) -> None:
        if src.text:
            dst.text = (dst.text or "") + src.text
        for child in src:
            conv = self.convert(child)
            if conv is not None:
                dst.append(conv)
                conv.tail = child.tail
            elif child.tail:
                last = dst[-1] if len(dst) else None
                if last is not None:
                    last.tail = (last.tail or "") + child.tail
                else:
                    dst.text = (dst.text or "") + child.tail

    def _body(self, macro: etree._Element, into: etree._Element) -> etree._Element:
        rich = _child(macro, AC, "rich-text-body")
        if rich is not None:
            self._copy_children(rich, into)
        return into

    def _ac(self, el: etree._Element, name: str) -> etree._Element | None:
        if name in ("structured-macro", "macro"):
            return self._macro(el)
        if name == "link":
            return self._link(el)
        if name in _DROP_AC:
            if name == "image":
                self._note_attachment(el)
            return None
        if name == "task-list":
            out = etree.Element("ul")
            for task in el.iterchildren(_q(AC, "task")):
                li = etree.SubElement(out, "li")
                body = _child(task, AC, "task-body")
                if body is not None:
                    self._copy_children(body, li)
            return out
        if name in ("layout", "layout-section", "layout-cell", "rich-text-body", "task-body"):
            return self._container(el, "div")
        if name in ("plain-text-body", "plain-text-link-body", "link-body"):
            return self._container(el, "span")
        return self._container(el, "div")  # unknown ac: element: keep its text

    def _container(self, el: etree._Element, tag: str) -> etree._Element:
        out = etree.Element(tag)
        self._copy_children(el, out)
        return out

    def _macro(self, m: etree._Element) -> etree._Element | None:
        name = (m.get(_q(AC, "name")) or "").lower()
        if name in _DROP_MACROS:
            return None
        if name in ("code", "noformat"):
            out = etree.Element("div", {"class": "code"})
            title = _param(m, "title")
            if title:
                etree.SubElement(out, "div", {"class": "codeHeader"}).text = title
            body = _child(m, AC, "plain-text-body")
            etree.SubElement(out, "pre").text = "".join(body.itertext()) if body is not None else ""
            return out
        if name in _PANEL_MACROS:
            kind = "information" if name == "info" else name
            out = etree.Element(
                "div",
                {"class": f"confluence-information-macro confluence-information-macro-{kind}"},
            )
            title = _param(m, "title")
            if title:
                etree.SubElement(out, "p").text = title
            return self._body(m, out)
        if name in ("expand", "ui-expand"):
            out = etree.Element("div", {"class": "expand-container"})
            etree.SubElement(out, "div", {"class": "expand-control"}).text = (
                _param(m, "title") or "Click here to expand..."
            )
            self._body(m, etree.SubElement(out, "div"))
            return out
        if name == "status":
            span = etree.Element("span")
            span.text = _param(m, "title")
            return span
        if name == "jira":
            span = etree.Element("span")
            span.text = _param(m, "key")
            return span
        out = etree.Element("div")  # panel, section/column, details, unknown: body only
        self._body(m, out)
        if not len(out) and not (out.text or "").strip():
            plain = _child(m, AC, "plain-text-body")
            if plain is None:
                return None
            out.text = "".join(plain.itertext())
        return out

    def _link(self, el: etree._Element) -> etree._Element | None:
        self._note_attachment(el)
        span = etree.Element("span")
        for body_name in ("plain-text-link-body", "link-body"):
            body = _child(el, AC, body_name)
            if body is not None and "".join(body.itertext()).strip():
                self._copy_children(body, span)
                return span
        for ri_name, attr in (
            ("page", "content-title"),
            ("blog-post", "content-title"),
            ("attachment", "filename"),
            ("space", "space-key"),
            ("url", "value"),
        ):
            target = _child(el, RI, ri_name)
            if target is not None and target.get(_q(RI, attr)):
                span.text = target.get(_q(RI, attr))
                return span
        return None  # ri:user and friends: no readable name in storage format


def storage_to_html(
    xhtml: str, *, max_markup_depth: int = DEFAULT_MAX_MARKUP_DEPTH
) -> tuple[etree._Element, tuple[str, ...]]:
    """Parse storage XHTML into a plain-HTML ``<div>`` plus the attachment names it references.

    Raises :class:`IngestError` when nothing can be recovered from the markup, when it declares
    a DTD or entities, or when it is nested deeper than ``max_markup_depth`` (the depth counts
    the body's own elements: a top-level ``<p>`` is 1).
    """
    declared = _declaration(xhtml)
    if declared is not None:
        raise IngestError(
            f"storage body contains a <!{declared}> declaration, which Confluence never writes: "
            "refused unparsed, so no entity is expanded and no file or URL is read"
        )
    wrapped = (
        f'<ac:root xmlns:ac="{AC}" xmlns:ri="{RI}" xmlns:at="http://atlassian.com/template">'
        f"{_entities_to_numeric(xhtml)}</ac:root>"
    )
    parser = etree.XMLParser(
        recover=True,
        resolve_entities=False,
        load_dtd=False,
        no_network=True,
        huge_tree=True,
    )
    try:
        root = etree.fromstring(wrapped.encode("utf-8"), parser=parser)
    except etree.XMLSyntaxError as e:
        raise IngestError(f"unparseable storage-format XHTML: {e}") from e
    if root is None:
        raise IngestError("unparseable storage-format XHTML: nothing could be recovered")
    problem = depth_problem(
        markup_depth(root) - 1, max_markup_depth, parser_limit_hit(parser.error_log)
    )
    if problem:
        raise IngestError(problem)
    conv = _Converter()
    out = etree.Element("div")
    try:
        conv._copy_children(root, out)
    except RecursionError as e:  # defensive: the depth check should have caught it
        raise IngestError(
            f"markup nested too deep to convert (recursion limit hit under "
            f"max_markup_depth={max_markup_depth}; lower CTX_MAX_MARKUP_DEPTH)"
        ) from e
    return out, tuple(conv.attachments)


def parse_storage_page(
    xhtml: str,
    *,
    page_id: str,
    title: str,
    space: str,
    ancestors: Iterable[str] = (),
    author: str | None = None,
    updated_at: datetime,
    source_path: str | None = None,
    ancestor_ids: Iterable[str] = (),
    attachments: Iterable[str] = (),
    date_source: DateSource = "given",
    max_markup_depth: int = DEFAULT_MAX_MARKUP_DEPTH,
) -> Page:
    """A :class:`Page` from one storage-format body (``sections`` may be empty: the caller
    decides whether an empty page is quarantined). ``ancestors`` must already exclude the space
    home, as in the export reader. A naive ``updated_at`` is taken as UTC.

    Raises :class:`IngestError` for a body that cannot be used (see :func:`storage_to_html`);
    callers turn it into a ``Quarantined``."""
    body, referenced = storage_to_html(xhtml, max_markup_depth=max_markup_depth)
    try:
        sections = tuple(render_sections(body))
    except RecursionError as e:  # defensive: the depth check should have caught it
        raise IngestError(
            f"markup nested too deep to render (recursion limit hit under "
            f"max_markup_depth={max_markup_depth}; lower CTX_MAX_MARKUP_DEPTH)"
        ) from e
    title = " ".join(title.split())
    names = list(attachments)
    names += [n for n in referenced if n not in names]
    if updated_at.tzinfo is None:
        updated_at = updated_at.replace(tzinfo=UTC)
    return Page(
        page_id=str(page_id),
        title=title,
        space=space,
        ancestors=tuple(ancestors),
        author=author,
        updated_at=updated_at,
        sections=sections,
        attachments=tuple(names),
        source_path=source_path or f"storage:{space}/{page_id}",
        content_hash=compute_content_hash(title, sections),
        ancestor_ids=tuple(ancestor_ids),
        date_source=date_source,
    )
