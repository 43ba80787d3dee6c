"""Knowledge ingestion: Confluence readers -> pages -> heading-aware token chunks.

Readers yield :class:`Page` (or :class:`Quarantined` with a reason) from an HTML space export
(:func:`read_html_export`) or storage-format XHTML; the pipeline module turns them into points.
"""

from context_core.ingest.confluence import read_html_export
from context_core.ingest.model import Chunk, Page, Quarantined, Section

__all__ = ["Chunk", "Page", "Quarantined", "Section", "read_html_export"]
