"""Choosing the L3 backend: :func:`open_store`, above the backends it chooses from.

:mod:`.store` holds the types and the protocol every backend imports; the backends
(:mod:`.edge`, :mod:`.server`, :mod:`.edge_server`) sit on top of it, and this module on top
of them, so nothing imports its own importers. The backends are imported when chosen: opening
one store pulls in neither of the other drivers (``qdrant_edge``, ``qdrant_client``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from context_core.config import Settings
    from context_core.knowledge.store import VectorStore

__all__ = ["open_store"]


def open_store(settings: Settings) -> VectorStore:
    """``CTX_QDRANT_URL`` set -> a Qdrant server/cluster; ``CTX_EDGE_SOCKET`` set -> the Edge
    shards served by an edge server process (several workers); otherwise embedded Qdrant Edge
    (one process per data dir)."""
    if settings.qdrant_url:
        from context_core.knowledge.qdrant_server import QdrantServerStore

        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return QdrantServerStore.connect(
            settings.qdrant_url,
            api_key=key,
            shards=settings.qdrant_shards,
            replication=settings.qdrant_replication,
            write_consistency=settings.qdrant_write_consistency,
        )
    if settings.edge_socket is not None:
        from context_core.knowledge.edge_server.client import RemoteEdgeStore

        return RemoteEdgeStore(settings.edge_socket)
    from context_core.knowledge.edge import EdgeStore

    return EdgeStore(
        settings.qdrant_dir,
        search_threads=settings.qdrant_search_threads or None,
        hnsw_ef=settings.qdrant_hnsw_ef,
        oversampling=settings.qdrant_oversampling,
    )
