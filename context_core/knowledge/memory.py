"""L3 knowledge memory: curated, long-lived knowledge, never session data.

Two collections: ``knowledge_main`` (SOP/manual chunks, resolved cases, report templates,
written by the weekly refresh) and ``hot_knowledge`` (answers confirmed during sessions, kept
72 h unless merged into main). A search looks at both and merges by cosine similarity; expired
hot points are filtered out at query time and deleted by :meth:`KnowledgeMemory.sweep_expired`
(Qdrant has no native TTL).

Hard rule: nothing that identifies a session or a user may enter L3. A payload carrying
``session_id``/``user_id``/``sid``/``uid`` (any case or separator, at any depth) is refused with
:class:`SessionDataInKnowledgeError` rather than silently stripped, because such a write is a
bug upstream, not data to clean. Everything else that is written passes the sanitize gateway.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from context_core.errors import (
    CollectionNotFoundError,
    InvalidStoreRequestError,
    SessionDataInKnowledgeError,
)
from context_core.knowledge.store import Filter, Hit, PointRecord, Vector, VectorStore

if TYPE_CHECKING:  # pragma: no cover
    from context_core.config import Settings
    from context_core.embedding import Encoder
    from context_core.gateway import Gateway

__all__ = ["FORBIDDEN_KEYS", "KnowledgeMemory", "find_session_keys", "hot_point_id"]

log = logging.getLogger(__name__)

# Compared after lower-casing and dropping "_", "-", "." and spaces: "sessionId", "User-ID"...
FORBIDDEN_KEYS = frozenset({"sessionid", "userid", "sid", "uid"})
_HOT_NAMESPACE = uuid.UUID("0e7d3a51-8f2b-4c6e-a1d9-4b3f5e2c7a18")


def _norm_key(key: object) -> str:
    return "".join(ch for ch in str(key).lower() if ch not in "_-. ")


def find_session_keys(value: Any, path: str = "$") -> list[str]:
    """Paths of every session/user id key inside ``value`` (dicts, lists, tuples; any depth)."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            child = f"{path}.{k}"
            if _norm_key(k) in FORBIDDEN_KEYS:
                found.append(child)
            found.extend(find_session_keys(v, child))
    elif isinstance(value, list | tuple | set | frozenset):
        for i, v in enumerate(value):
            found.extend(find_session_keys(v, f"{path}[{i}]"))
    return found


def refuse_session_data(payload: Mapping[str, Any], *, where: str) -> None:
    paths = find_session_keys(payload)
    if paths:
        raise SessionDataInKnowledgeError(
            f"{where}: payload carries session/user identifiers at {', '.join(paths)}; L3 "
            "knowledge memory never stores session data: keep it in L2 (working memory) and "
            "write only the de-personalised knowledge here"
        )


def hot_point_id(source: str, content_hash: str) -> str:
    """Same source + same answer -> same id: re-confirming refreshes the point's expiry."""
    return str(uuid.uuid5(_HOT_NAMESPACE, f"hot:{source}:{content_hash}"))


class KnowledgeMemory:
    """Search and write L3 through one encoder, one store and the gateway.

    ``clock`` (epoch seconds) is injectable so expiry can be tested without waiting 72 h.
    """

    def __init__(
        self,
        store: VectorStore,
        encoder: Encoder,
        settings: Settings,
        gateway: Gateway,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.encoder = encoder
        self.settings = settings
        self.gateway = gateway
        self.main = settings.collection_main
        self.hot = settings.collection_hot
        self._clock = clock
        self._warned_no_hot = False

    def ensure_collections(self) -> None:
        """Create both collections for this encoder; a different recorded model is an error."""
        for name in (self.main, self.hot):
            self.store.create_collection(name, dim=self.encoder.dim, model=self.encoder.name)

    # --- reading ---------------------------------------------------------------------------
    def search(
        self,
        query: str,
        *,
        section: str | None = None,
        limit: int | None = None,
        collection: str | None = None,
        include_hot: bool = True,
    ) -> list[Hit]:
        """Top ``limit`` (default ``CTX_L3_TOP_K``) hits by cosine similarity.

        ``collection`` names the main collection to search (default ``knowledge_main``);
        unexpired hot points are merged in unless ``include_hot`` is False or the collection
        asked for *is* the hot one. ``section`` filters on the payload field (the router passes
        the device-id prefix, e.g. "PUMP").

        A missing hot collection means "no hot hits" (nothing was confirmed yet, or a scratch
        setup only built main); a missing main collection, or the hot one asked for by name,
        raises :class:`CollectionNotFoundError`.
        """
        vector = self.encoder.encode_query(query)
        return self.search_vector(
            vector, section=section, limit=limit, collection=collection, include_hot=include_hot
        )

    def search_vector(
        self,
        vector: Vector,
        *,
        section: str | None = None,
        limit: int | None = None,
        collection: str | None = None,
        include_hot: bool = True,
    ) -> list[Hit]:
        """:meth:`search` for a caller that already holds the query embedding."""
        k = limit if limit is not None else self.settings.l3_top_k
        if k <= 0:
            raise InvalidStoreRequestError(f"search limit must be > 0, got {k}")
        main = collection or self.main
        base: dict[str, Any] = {"section": section} if section else {}
        hits: list[Hit] = []
        if main != self.hot:
            hits.extend(self.store.search(main, vector, limit=k, filter=base or None))
        if include_hot or main == self.hot:
            hot_filter: Filter = {**base, "expires_at": {"gt": self._clock()}}
            try:
                hits.extend(self.store.search(self.hot, vector, limit=k, filter=hot_filter))
            except CollectionNotFoundError:
                if main == self.hot:
                    raise
                self._no_hot_collection(main)
        hits.sort(key=lambda h: h.score, reverse=True)
        return hits[:k]

    def _no_hot_collection(self, main: str) -> None:
        if not self._warned_no_hot:  # once per instance: this is the query hot path
            self._warned_no_hot = True
            log.warning(
                "hot collection %r does not exist; searching %r only (ensure_collections "
                "creates it)",
                self.hot,
                main,
            )

    def stats(self) -> dict[str, int | None]:
        """Points per collection (None = collection absent), for the health report."""
        out: dict[str, int | None] = {}
        for name in (self.main, self.hot):
            info = self.store.info(name)
            out[name] = None if info is None else info.count
        return out

    # --- writing ---------------------------------------------------------------------------
    def upsert_hot(
        self,
        text: str,
        *,
        source: str,
        section: str,
        title: str = "",
        confirmed: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """Store an answer confirmed during a session for ``CTX_HOT_TTL_HOURS`` (72 h).

        Refuses session/user ids anywhere in ``extra``; cleans text and payload through the
        gateway before embedding, so a secret never reaches the vector or the payload.
        """
        if not text.strip():
            raise InvalidStoreRequestError("upsert_hot needs non-empty text")
        extra = dict(extra or {})
        refuse_session_data(extra, where=f"hot upsert for source {source!r}")
        where = f"l3:{self.hot}"
        clean_text = self.gateway.clean_text(text, where=where)
        now = self._clock()
        content_hash = hashlib.sha256(clean_text.encode("utf-8")).hexdigest()
        payload: dict[str, Any] = {
            **extra,
            "source": source,
            "title": title,
            "section": section,
            "heading_path": [title] if title else [],
            "updated_at": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(),
            "updated_at_ts": now,
            "chunk_index": 0,
            "content_hash": content_hash,
            "text": clean_text,
            "model": self.encoder.name,
            "expires_at": now + self.settings.hot_ttl_hours * 3600.0,
            "confirmed": bool(confirmed),
        }
        payload = self.gateway.clean(payload, where=where)
        refuse_session_data(payload, where=f"hot upsert for source {source!r}")
        pid = hot_point_id(source, content_hash)
        vector = self.encoder.encode([clean_text])[0]
        self.store.upsert(self.hot, [PointRecord(pid, vector, payload)])
        return pid

    def upsert_chunks(
        self, collection: str, records: Sequence[PointRecord], *, optimize: bool = True
    ) -> int:
        """Bulk write for the ingestion pipeline: refuse session data, clean, upsert, index.

        ``optimize`` builds the HNSW graph afterwards (Qdrant Edge does not do it by itself).
        """
        where = f"l3:{collection}"
        cleaned: list[PointRecord] = []
        for r in records:
            refuse_session_data(r.payload, where=f"point {r.id} for {collection!r}")
            cleaned.append(PointRecord(r.id, r.vector, self.gateway.clean(r.payload, where=where)))
        self.store.upsert(collection, cleaned)
        if optimize and cleaned:
            self.store.optimize(collection)
        return len(cleaned)

    def sweep_expired(self, now: float | None = None) -> int:
        """Delete hot points whose ``expires_at`` is in the past; returns how many went.

        The count is taken just before the delete; a point expiring in between is deleted
        but not counted (harmless: it is counted by nothing else either).
        """
        cutoff = self._clock() if now is None else now
        expired: Filter = {"expires_at": {"lt": cutoff}}
        n = self.store.count(self.hot, filter=expired)
        if n:
            self.store.delete(self.hot, filter=expired)
        return n
