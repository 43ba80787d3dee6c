"""L3 knowledge memory: a vector-store seam (Qdrant Edge or server) and KnowledgeMemory on top.

Layers, each importing only those below it: :mod:`.store` (types, filters, the
:class:`VectorStore` protocol, :class:`SearchQuery`), the backends (:mod:`.edge`,
:mod:`.server`, :mod:`.edge_server`), :mod:`.open` (:func:`open_store`, which picks one). The
backends are imported lazily by :func:`open_store`, so importing this package pulls in neither
``qdrant_edge`` nor ``qdrant_client``.
"""

from typing import TYPE_CHECKING

from context_core.knowledge.open import open_store
from context_core.knowledge.store import (
    CollectionInfo,
    Hit,
    PointRecord,
    SearchQuery,
    VectorStore,
    point_id,
)

if TYPE_CHECKING:  # the real class for type checkers; loaded lazily at run time
    from context_core.knowledge.memory import KnowledgeMemory

__all__ = [
    "CollectionInfo",
    "Hit",
    "KnowledgeMemory",
    "PointRecord",
    "SearchQuery",
    "VectorStore",
    "open_store",
    "point_id",
]


def __getattr__(name: str) -> object:
    # KnowledgeMemory needs the gateway; keep `import context_core.knowledge` light and
    # independent of it until the class is actually used.
    if name == "KnowledgeMemory":
        from context_core.knowledge.memory import KnowledgeMemory

        return KnowledgeMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
