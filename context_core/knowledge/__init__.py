"""L3 knowledge memory: a vector-store seam (Qdrant Edge or server) and KnowledgeMemory on top.

Backends are imported lazily by :func:`open_store`, so importing this package pulls in neither
``qdrant_edge`` nor ``qdrant_client``.
"""

from typing import TYPE_CHECKING

from context_core.knowledge.store import (
    CollectionInfo,
    Hit,
    PointRecord,
    VectorStore,
    open_store,
    point_id,
)

if TYPE_CHECKING:  # the real class for type checkers; loaded lazily at run time
    from context_core.knowledge.memory import KnowledgeMemory

__all__ = [
    "CollectionInfo",
    "Hit",
    "KnowledgeMemory",
    "PointRecord",
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
