"""Knowledge ingestion: Confluence readers -> pages -> heading-aware token chunks.

Readers yield :class:`Page` (or :class:`Quarantined` with a reason) from an HTML space export
(:func:`read_html_export`) or storage-format XHTML (:func:`parse_storage_page`);
:func:`chunk_page` cuts pages into model-token-bounded :class:`Chunk` s for embedding.
"""

from context_core.ingest.chunking import chunk_page
from context_core.ingest.confluence import read_html_export
from context_core.ingest.model import Chunk, Page, Quarantined, Section
from context_core.ingest.storage import parse_storage_page

__all__ = [
    "Chunk",
    "Page",
    "Quarantined",
    "Section",
    "chunk_page",
    "parse_storage_page",
    "read_html_export",
]
