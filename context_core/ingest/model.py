"""The records every ingestion source produces and the chunker consumes.

Readers (HTML export, storage-format XHTML, REST) all yield :class:`Page` or
:class:`Quarantined`, so the pipeline never cares where a page came from. A bad page becomes a
``Quarantined`` record with a human-readable reason instead of an exception: one broken file
must never stop a 400-page refresh.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

__all__ = ["Chunk", "DateSource", "Page", "Quarantined", "Section", "compute_content_hash"]

DateSource = Literal["metadata", "mtime", "api", "given"]


@dataclass(frozen=True, slots=True)
class Section:
    """A run of body text under one heading path (``()`` = text before the first heading)."""

    heading_path: tuple[str, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Page:
    """One Confluence page, parsed and normalised.

    ``ancestors`` are the titles from the breadcrumbs, root first, *without* the space itself
    and *without* the space home page: every page sits under the home, so keeping it would make
    it the "area" of every page. ``section`` (the L3 filter field) is therefore simply the first
    ancestor, or the page's own title for pages directly below the home.
    """

    page_id: str
    title: str
    space: str
    ancestors: tuple[str, ...]
    author: str | None
    updated_at: datetime  # tz-aware (UTC when the source gives no zone)
    sections: tuple[Section, ...]
    attachments: tuple[str, ...]
    source_path: str
    content_hash: str  # compute_content_hash(title, sections)
    ancestor_ids: tuple[str, ...] = ()  # page ids matching ``ancestors`` where known
    date_source: DateSource = "metadata"  # "mtime" = metadata date unparseable, file mtime used
    date_note: str = ""  # why the metadata date was not used (recorded in the run's warnings)

    @property
    def section(self) -> str:
        """Top-level space area: first ancestor below the space home, else the title."""
        return self.ancestors[0] if self.ancestors else self.title

    @property
    def text(self) -> str:
        """All section texts joined, for quick inspection and size checks."""
        return "\n".join(s.text for s in self.sections)


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A page that could not be ingested, and why (shown in the run report)."""

    source_path: str
    reason: str


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of one section, at most ``max_tokens`` model tokens long.

    ``chunk_index`` is deterministic per page (0, 1, 2, ... in reading order), so the point id
    ``uuid5(page_id, chunk_index)`` is stable across runs. ``text`` is what gets embedded:
    the context line "Title > Heading > Subheading" (when the chunker adds it), a newline, then
    the body; ``text[body_start:]`` is the body alone, which equals
    ``section.text[char_span[0]:char_span[1]].strip()``. ``n_tokens`` counts the whole text.
    """

    page_id: str
    chunk_index: int
    heading_path: tuple[str, ...]
    section: str
    text: str
    n_tokens: int
    char_span: tuple[int, int] = (0, 0)  # offsets of the body in its Section.text
    body_start: int = 0  # offset of the body in ``text`` (0 = no context line)

    @property
    def body(self) -> str:
        return self.text[self.body_start :]


def compute_content_hash(title: str, sections: tuple[Section, ...] | list[Section]) -> str:
    """sha256 over the title and the (already normalised) section texts and headings.

    Readers normalise whitespace before building sections, so the hash only changes when the
    words change; it is what makes the pipeline skip unchanged pages.
    """
    h = hashlib.sha256()
    h.update(title.strip().encode("utf-8"))
    for s in sections:
        h.update(b"\x1e")
        h.update("\x1f".join(s.heading_path).encode("utf-8"))
        h.update(b"\x1d")
        h.update(s.text.encode("utf-8"))
    return h.hexdigest()
