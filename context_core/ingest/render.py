"""Render a Confluence page body (HTML element tree) into heading-path sections of text.

Shared by the HTML export reader and the storage-format reader (which first maps ``ac:``
macros onto the same HTML shapes), so identical content gives identical sections and hashes.

Output conventions: one line per paragraph, list item ("- " prefix), table row
("Header: value; Header2: value2") or code line (after a "Code:" line); info/note/warning/tip
panels start with "Info: " / "Note: " / "Warning: " / "Tip: ". Every line is whitespace-
normalised by :func:`normalise_line`. Tables of contents, icons, attachment thumbnails,
scripts and styles are dropped.
"""

from __future__ import annotations

import re

from lxml import etree

from context_core.ingest.model import Section

__all__ = [
    "depth_problem",
    "element_text",
    "inline_lines",
    "markup_depth",
    "normalise_line",
    "parser_limit_hit",
    "render_sections",
    "table_rows",
]

_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_BLOCKS = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "caption",
        "dd",
        "details",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "section",
        "summary",
        "tbody",
        "td",
        "tfoot",
        "th",
        "thead",
        "tr",
        "ul",
    ]
)
_SKIP_TAGS = frozenset(
    [
        "script",
        "style",
        "img",
        "input",
        "colgroup",
        "col",
        "iframe",
        "button",
        "select",
        "textarea",
        "noscript",
        "svg",
        "template",
        "head",
        "title",
        "meta",
        "link",
        "object",
        "embed",
        "video",
        "audio",
        "source",
    ]
)
_SKIP_CLASSES = frozenset(
    {
        "toc-macro",  # a table of contents repeats the headings
        "confluence-information-macro-icon",
        "expand-control-icon",
        "aui-icon",
        "page-metadata",
        "confluence-embedded-file",  # attachment thumbnail; the name is in the attachments list
        "numberingColumn",
        "hidden",
    }
)
_SKIP_IDS = frozenset(
    {"breadcrumb-section", "footer", "likes-and-labels-container", "comments-section", "labels"}
)
_PANEL_LABELS = {
    "information": "Info",
    "info": "Info",
    "note": "Note",
    "warning": "Warning",
    "tip": "Tip",
}
_INVISIBLE = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad]")


def normalise_line(text: str) -> str:
    """Whitespace normalisation used everywhere: drop zero-width characters, collapse every
    run of Unicode whitespace (incl. NBSP) to one space, strip the ends."""
    return " ".join(_INVISIBLE.sub("", text).split())


def _classes(el: etree._Element) -> set[str]:
    c = el.get("class")
    return set(c.split()) if c else set()


def element_text(el: etree._Element) -> str:
    """All text below ``el`` (works for lxml.html and plain lxml.etree elements)."""
    return "".join(el.itertext())


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1].lower()


class _Renderer:
    """Walks a body element and builds heading-path sections of normalised lines."""

    def __init__(self, *, headings_as_text: bool = False) -> None:
        self.headings_as_text = headings_as_text
        self.stack: list[tuple[int, str]] = []
        self.sections: list[tuple[tuple[str, ...], list[str]]] = [((), [])]
        self.parts: list[str] = []
        self.marker = ""  # list-item marker waiting for the item's first non-empty line

    # --- output ------------------------------------------------------------------------
    def flush(self) -> None:
        if self.parts:
            line = normalise_line("".join(self.parts))
            self.parts.clear()
            self._emit(line)

    def _emit(self, line: str) -> None:
        if line:
            self.sections[-1][1].append(self.marker + line)
            self.marker = ""

    def add_line(self, line: str) -> None:
        self.flush()
        self._emit(normalise_line(line))

    def start_section(self, level: int, title: str) -> None:
        self.flush()
        self.marker = ""
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        self.stack.append((level, title))
        self.sections.append((tuple(t for _, t in self.stack), []))

    def lines(self) -> list[str]:
        self.flush()
        return [line for _, lines in self.sections for line in lines]

    def result(self) -> list[Section]:
        """Sections with text; a heading with no body keeps itself as text unless a later
        section extends its path (then the heading survives in that section's path)."""
        self.flush()
        out: list[Section] = []
        for i, (path, lines) in enumerate(self.sections):
            if lines:
                out.append(Section(path, "\n".join(lines)))
            elif path and not any(p[: len(path)] == path for p, _ in self.sections[i + 1 :]):
                out.append(Section(path, path[-1]))
        return out

    # --- walking -----------------------------------------------------------------------
    def walk_children(self, el: etree._Element) -> None:
        if el.text:
            self.parts.append(el.text)
        for child in el:
            if isinstance(child.tag, str):
                self.walk(child)
            if child.tail:
                self.parts.append(child.tail)

    def walk(self, el: etree._Element) -> None:
        tag = _local(el.tag)
        if tag in _SKIP_TAGS:
            return
        cls = _classes(el)
        if cls & _SKIP_CLASSES or el.get("id") in _SKIP_IDS:
            return
        if tag in _HEADINGS and not self.headings_as_text:
            title = normalise_line(element_text(el))
            if title:
                self.start_section(_HEADINGS[tag], title)
            return
        if tag == "table":
            self.flush()
            for row in table_rows(el):
                self.add_line(row)
            return
        if tag == "br":
            self.flush()
            return
        if ("code" in cls and tag == "div") or tag == "pre":
            self._code(el)
            return
        if "confluence-information-macro" in cls:
            self._panel(el, cls)
            return
        if "expand-control" in cls:  # the expand title: keep it as its own line
            self.add_line(element_text(el))
            return
        if tag == "li":
            self.flush()
            self.marker = "- "
            self.walk_children(el)
            self.flush()
            self.marker = ""
            return
        if tag in _BLOCKS or tag in _HEADINGS:
            self.flush()
            self.walk_children(el)
            self.flush()
            return
        self.walk_children(el)

    def _code(self, el: etree._Element) -> None:
        self.flush()
        header = ""
        for h in el.iter():
            if isinstance(h.tag, str) and "codeHeader" in _classes(h):
                header = normalise_line(element_text(h))
                break
        pre = el if _local(el.tag) == "pre" else next(el.iter("pre"), el)
        label = f"Code ({header}):" if header else "Code:"
        body = [normalise_line(line) for line in element_text(pre).splitlines()]
        body = [b for b in body if b]
        if body:
            self.add_line(label)
            for b in body:
                self.add_line(b)

    def _panel(self, el: etree._Element, cls: set[str]) -> None:
        kind = next(
            (c.rsplit("-", 1)[-1] for c in cls if c.startswith("confluence-information-macro-")),
            "information",
        )
        label = _PANEL_LABELS.get(kind, kind.capitalize())
        lines = inline_lines(el)
        if lines:
            self.add_line(f"{label}: {lines[0]}")
            for line in lines[1:]:
                self.add_line(line)


def inline_lines(el: etree._Element) -> list[str]:
    """Render an element's content to lines, treating headings as plain text."""
    r = _Renderer(headings_as_text=True)
    r.walk_children(el)
    return r.lines()


def _cells(tr: etree._Element) -> list[tuple[bool, str]]:
    out = []
    for cell in tr:
        if not isinstance(cell.tag, str) or _local(cell.tag) not in ("td", "th"):
            continue
        if "numberingColumn" in _classes(cell):
            continue
        out.append((_local(cell.tag) == "th", " ".join(inline_lines(cell))))
    return out


def table_rows(table: etree._Element) -> list[str]:
    """A table as readable lines.

    Header row = the first row whose cells are all ``th``: later rows become
    "Header: value; Header2: value2". A row whose first cell is a ``th`` is keyed by it:
    "Key: value" (one more cell) or "Key: Header2: v2; Header3: v3" / "Key: v1; v2" (no
    header row). Otherwise cells are joined with "; ". Empty cells vanish.
    Nested tables are rendered inside their cell, flattened.
    """
    rows: list[etree._Element] = []
    for child in table:  # rows sit directly below the table or its thead/tbody/tfoot
        tag = _local(child.tag) if isinstance(child.tag, str) else ""
        if tag == "tr":
            rows.append(child)
        elif tag in ("thead", "tbody", "tfoot"):
            rows.extend(tr for tr in child if isinstance(tr.tag, str) and _local(tr.tag) == "tr")
    header: list[str] | None = None
    used: set[int] = set()  # header columns that labelled at least one value
    lines: list[str] = []
    for tr in rows:
        cells = _cells(tr)
        if not cells:
            continue
        if header is None and not lines and all(is_th for is_th, _ in cells):
            if any(text for _, text in cells):
                header = [text for _, text in cells]
            continue
        if header is not None:
            pairs = []
            row_key = cells[0][1] if cells[0][0] and len(cells) > 1 else ""
            rest = cells[1:] if row_key else cells
            offset = 1 if row_key else 0
            for i, (_, text) in enumerate(rest, start=offset):
                if not text:
                    continue
                keyed_pair = bool(row_key) and len(rest) == 1
                name = header[i] if i < len(header) and not keyed_pair else ""
                used.add(i if name else -1)
                pairs.append(f"{name}: {text}" if name else text)
            line = "; ".join(pairs)
            if row_key:  # a row-header table: "Key: value" / "Key: Col: v; Col2: v2"
                line = f"{row_key}: {line}" if line else row_key
        elif cells[0][0] and len(cells) > 1:
            values = "; ".join(t for _, t in cells[1:] if t)
            line = f"{cells[0][1]}: {values}" if values else cells[0][1]
        else:
            line = "; ".join(t for _, t in cells if t)
        if line:
            lines.append(line)
    if header is not None and (not lines or any(h and i not in used for i, h in enumerate(header))):
        # some column names never labelled a value (empty columns, header-only table):
        # keep them as a line of their own so no words of the page are lost
        lines.insert(0, "; ".join(h for h in header if h))
    return lines


def render_sections(body: etree._Element) -> list[Section]:
    """Split a body element into heading-path sections of readable, normalised text."""
    r = _Renderer()
    r.walk_children(body)
    return r.result()


# --- nesting depth ------------------------------------------------------------------------
# The renderer and the storage converter recurse once (or a few times) per nesting level, and
# libxml2 silently stops building the tree at its own depth limit (256 levels for HTML, 2048
# with huge_tree for XML) while still returning what it has. So depth is measured here, on the
# parsed tree and without recursion, and a page that is too deep or was cut off by the parser
# is quarantined with a reason instead of being rendered (or silently truncated).


def markup_depth(root: etree._Element) -> int:
    """Element count on the deepest root-to-leaf path (``root`` itself is 1).

    Counted from start/end events of an iterative walk, never by recursion: hostile pages nest
    100,000 levels deep, far past Python's recursion limit.
    """
    depth = deepest = 0
    for event, _el in etree.iterwalk(root, events=("start", "end")):
        if event == "start":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def parser_limit_hit(error_log: etree._ListErrorLog) -> str | None:
    """libxml2's message when it hit one of its resource limits (depth, text size) and so
    returned a truncated tree; None when the tree is whole."""
    for e in error_log:
        if e.type_name == "ERR_RESOURCE_LIMIT":
            return str(e.message).strip()
    return None


def depth_problem(depth: int, max_depth: int, parser_stopped: str | None) -> str | None:
    """The quarantine reason for a tree ``depth`` levels deep, or None when it may be rendered.

    ``parser_stopped`` is :func:`parser_limit_hit`'s message: the parser cut the document off,
    so ``depth`` is only a lower bound and rendering would silently lose the rest of the page.
    """
    if parser_stopped is not None:
        if "depth" not in parser_stopped.lower():
            return f"page hits a parser resource limit and would be cut off ({parser_stopped})"
        over = f", over max_markup_depth={max_depth}" if depth > max_depth else ""
        return (
            f"markup nested more than {depth} deep{over}: the parser stops at {depth} levels "
            "and would cut the page off there (CTX_MAX_MARKUP_DEPTH cannot lift that limit)"
        )
    if depth > max_depth:
        return (
            f"markup nested {depth} deep, over max_markup_depth={max_depth} "
            "(raise CTX_MAX_MARKUP_DEPTH to ingest it)"
        )
    return None
