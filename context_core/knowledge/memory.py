"""L3 knowledge memory: curated, long-lived knowledge, never session data.

Two collections: ``knowledge_main`` (SOP/manual chunks, resolved cases, report templates,
written by the weekly refresh) and ``hot_knowledge`` (answers confirmed during sessions, kept
72 h unless merged into main). A search looks at both in one batch and merges them (by cosine
similarity in the dense retrieval mode, by fused rank in hybrid); expired hot points are
filtered out at query time and deleted by :meth:`KnowledgeMemory.sweep_expired` (Qdrant has no
native TTL).

Retrieval modes (``CTX_RETRIEVAL_MODE``): every point carries a sparse BM25 vector
(:mod:`context_core.knowledge.sparse`) next to its dense embedding; ``dense`` ranks by cosine,
``sparse`` by BM25, ``hybrid`` fuses both lists (``CTX_HYBRID_FUSION``: reciprocal rank
fusion, or a weighted sum). In every mode ``Hit.score`` stays the dense cosine, so the
confidence thresholds keep their meaning; ``Hit.sparse_score`` and ``Hit.rank`` add what the
sparse search and the fusion saw. A collection built before sparse vectors answers as dense
until ``ctx add-sparse`` (or the next ``ctx ingest``) adds them.

Hot knowledge is trust-scoped. Every hot point records who wrote it and where: ``written_by``
(the agent id, None for in-process system writes), ``namespace`` (its *scope*, see below) and
``trust = "unreviewed"``. Its ``source`` is always made here (``"hot-<sha>"`` of scope and key),
never taken from the caller: a caller's source survives only as the inert ``claimed_source``,
so no hot answer can pass for an ingested page. Scopes:

* ``"system:local"`` - written in-process without an agent id (operator tools, jobs): every
  reader may see it;
* ``"agent:<id>"`` - the writer's private scope: only that agent sees it (an agent without a
  ``write`` grant on the namespace it asked for lands here);
* ``"<namespace>"`` - a shared namespace the writer holds a ``write`` grant on. A reader sees
  it only when its route declares the namespace with a purpose the reader is granted *and*
  the writer still holds ``write`` there (checked at read time: revoking a grant hides it).

Namespace names cannot contain ``:``, so the two private forms never collide with a real one.

``knowledge_main`` is shared by every organisation of a deployment. Its *curated* points
(ingested pages: no ``namespace``, no ``merged_from``) are for every reader; an answer the
daily merge moved in (:func:`context_core.ingest.hot.merge_hot`) keeps its hot source's
``namespace`` and ``written_by``, and a reader's search on main matches only curated points
and its own scopes (:func:`reader_filter`); the router checks every hit carrying a namespace,
hot or merged, with :func:`hot_visible`.

How hot hits are labelled (never ``confident``) is the router's business; see
:mod:`context_core.routing.router`.

Hard rule: nothing that identifies a session or a user may enter L3. A payload carrying
``session_id``/``user_id``/``sid``/``uid`` (any case or separator, at any depth) is refused with
:class:`SessionDataInKnowledgeError` rather than silently stripped, because such a write is a
bug upstream, not data to clean. Everything else that is written passes the sanitize gateway.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from context_core.concurrency import blocking
from context_core.errors import (
    CollectionNotFoundError,
    InvalidStoreRequestError,
    SessionDataInKnowledgeError,
)
from context_core.knowledge.sparse import SparseEncoder
from context_core.knowledge.store import (
    Filter,
    Hit,
    PointRecord,
    SearchQuery,
    SparseVector,
    Vector,
    VectorStore,
    check_mode,
    search_batch,
)

if TYPE_CHECKING:  # pragma: no cover
    from context_core.access.namespaces import Grant
    from context_core.config import Settings
    from context_core.gateway.sanitize import Gateway
    from context_core.knowledge.embedding import Encoder

__all__ = [
    "FORBIDDEN_KEYS",
    "SYSTEM_SCOPE",
    "UNREVIEWED",
    "AclSource",
    "KnowledgeMemory",
    "find_session_keys",
    "hot_point_id",
    "hot_scopes",
    "hot_source",
    "hot_visible",
    "private_scope",
    "reader_filter",
    "resolve_hot_scope",
    "scoped",
]

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


# --- trust scopes of hot knowledge --------------------------------------------------------------
SYSTEM_SCOPE = "system:local"
UNREVIEWED = "unreviewed"
# Payload fields only this module writes on a hot point; a caller's ``extra`` cannot set them.
_SERVER_FIELDS = frozenset(
    {"written_by", "namespace", "trust", "claimed_source", "merged_from", "merged_at", "subject"}
)


class AclSource(Protocol):
    """The part of :class:`context_core.access.namespaces.NamespaceRegistry` the trust checks
    use."""

    def acl(self, name: str) -> dict[str, Grant]: ...


def private_scope(agent_id: str | None) -> str:
    """The scope only ``agent_id`` sees; no agent id means the in-process system scope."""
    return f"agent:{agent_id}" if agent_id else SYSTEM_SCOPE


def hot_source(scope: str, key: str) -> str:
    """The server-made ``source`` of a hot point: ``"hot-<sha>"`` of its scope and key."""
    digest = hashlib.sha256(f"{scope}\x00{key}".encode()).hexdigest()[:24]
    return f"hot-{digest}"


def resolve_hot_scope(
    written_by: str | None, namespace: str | None, namespaces: AclSource | None
) -> str:
    """Where a write lands: the shared ``namespace`` only when ``written_by`` holds ``write``
    on it (per ``namespaces``); otherwise the writer's private scope (system when anonymous).

    Without a registry nothing can be verified, so the write stays private.
    """
    if not written_by:
        return SYSTEM_SCOPE
    own = private_scope(written_by)
    if not namespace or ":" in namespace:
        return own
    if namespaces is None:
        log.info(
            "hot write by %r asked for namespace %r; no ACL to check: private",
            written_by,
            namespace,
        )
        return own
    try:
        grant = namespaces.acl(namespace).get(written_by)
    except Exception as e:  # an invalid name or an unreachable ACL never widens a write
        log.warning(
            "hot write by %r: ACL of %r unavailable (%s): private", written_by, namespace, e
        )
        return own
    if grant is None or not grant.write:
        log.info("hot write by %r: no write grant on namespace %r: private", written_by, namespace)
        return own
    return namespace


def hot_scopes(reader: str | None, declared: Iterable[str] = ()) -> list[str]:
    """The scopes a search for ``reader`` may look in: system, its own, declared namespaces."""
    out = [SYSTEM_SCOPE]
    if reader:
        out.append(private_scope(reader))
    out += sorted({n for n in declared if n and ":" not in n})
    return out


def reader_filter(scopes: Sequence[str]) -> Filter:
    """The scope filter of a search on ``knowledge_main`` for a reader whose hot scopes are
    ``scopes`` (:func:`hot_scopes`): curated points (no ``namespace`` and no ``merged_from``:
    ingested pages) or an answer merged from one of those scopes. Without it an answer merged
    from org A's shared namespace would reach every reader of the deployment. A merged point
    without a namespace (merged before merges kept it) matches neither clause: nobody can say
    whose it is, so it is hidden (``ctx unscoped-merged`` finds and deletes them). The
    matched hits still pass :func:`hot_visible` (the grants may have changed since the
    merge)."""
    clauses: list[Filter] = [{"namespace": {"empty": True}, "merged_from": {"empty": True}}]
    if scopes:
        clauses.append({"namespace": list(scopes)})
    return {"$or": clauses}


def scoped(payload: Mapping[str, Any]) -> bool:
    """Whether a point is not curated: a hot point or an answer merged from one (it carries a
    ``namespace`` or a ``merged_from``). Such a hit is shown only when :func:`hot_visible`
    says so; without a namespace it never is."""
    return any(payload.get(f) not in (None, "", []) for f in ("namespace", "merged_from"))


def hot_visible(
    payload: Mapping[str, Any],
    reader: str | None,
    declared: Mapping[str, Iterable[str]],
    namespaces: AclSource | None,
    *,
    acl_cache: dict[str, dict[str, Grant]] | None = None,
) -> bool:
    """May ``reader`` see this hot point? ``declared`` maps namespace -> purposes the route
    declares. A shared point needs the reader granted one of those purposes and the writer
    granted ``write``, both in the namespace's current ACL; anything unverifiable is hidden."""
    scope = payload.get("namespace")
    writer = payload.get("written_by") or None
    if not isinstance(scope, str):
        return False  # written before scopes existed: nobody vouches for it
    if scope == SYSTEM_SCOPE:
        return writer is None
    if scope.startswith("agent:"):
        return bool(reader) and writer == reader and scope == private_scope(reader)
    if scope not in declared or writer is None:
        return False
    if writer == reader:
        return True
    if namespaces is None or not reader:
        return False
    cache = acl_cache if acl_cache is not None else {}
    try:
        if scope not in cache:  # a blocking read: on the service's loop, on a thread
            cache[scope] = blocking(namespaces.acl, scope)
    except Exception as e:  # fail closed: an ACL we cannot read shows nothing shared
        log.warning("hot visibility: ACL of namespace %r unavailable: %s", scope, e)
        return False
    acl = cache[scope]
    mine, theirs = acl.get(reader), acl.get(str(writer))
    purposes = list(declared[scope])
    return (
        mine is not None
        and any(mine.allows(p) for p in purposes)
        and theirs is not None
        and theirs.write
    )


class KnowledgeMemory:
    """Search and write L3 through one encoder, one store and the gateway.

    ``clock`` (epoch seconds) is injectable so expiry can be tested without waiting 72 h.
    ``sparse`` makes the lexical vectors (BM25 weights) written next to each dense vector and
    searched in the sparse and hybrid retrieval modes (``CTX_RETRIEVAL_MODE``).
    """

    def __init__(
        self,
        store: VectorStore,
        encoder: Encoder,
        settings: Settings,
        gateway: Gateway,
        *,
        clock: Callable[[], float] = time.time,
        sparse: SparseEncoder | None = None,
    ) -> None:
        self.store = store
        self.encoder = encoder
        # the encoder for collections this process creates; an existing collection is read
        # and written with the one it recorded (sparse_for)
        self.sparse = sparse or SparseEncoder()
        self._sparse_of: dict[str, SparseEncoder] = {}
        self.settings = settings
        self.gateway = gateway
        self.main = settings.collection_main
        self.hot = settings.collection_hot
        self._clock = clock
        self._warned_no_hot = False

    def ensure_collections(self) -> None:
        """Create both collections for this encoder; a different recorded model is an error."""
        for name in (self.main, self.hot):
            self.store.create_collection(
                name, dim=self.encoder.dim, model=self.encoder.name, sparse=self.sparse.name
            )

    def sparse_for(self, collection: str) -> SparseEncoder:
        """The sparse encoder ``collection`` was written with (the tokenizer is part of its
        identity: a query cut differently would share few terms with it); this memory's own
        for a collection without a record. Read once per collection and process."""
        enc = self._sparse_of.get(collection)
        if enc is None:
            try:
                info = self.store.info(collection)
            except Exception:  # unreachable now: decide on the next call
                return self.sparse
            recorded = info.sparse if info is not None else None
            if recorded is None or recorded == self.sparse.name:
                enc = self.sparse
            else:
                enc = SparseEncoder.from_name(recorded)
                log.info(
                    "collection %r keeps its sparse encoder %s (this version writes %s to new "
                    "collections; re-ingest it to move)",
                    collection,
                    recorded,
                    self.sparse.name,
                )
            if recorded is not None:  # none yet: ``ctx add-sparse`` may record one later
                self._sparse_of[collection] = enc
        return enc

    # --- reading ---------------------------------------------------------------------------
    def search(
        self,
        query: str,
        *,
        section: str | None = None,
        limit: int | None = None,
        collection: str | None = None,
        include_hot: bool = True,
        hot_scopes: Sequence[str] | None = None,
        mode: str | None = None,
    ) -> list[Hit]:
        """Top ``limit`` (default ``CTX_L3_TOP_K``) hits: by cosine similarity in the dense
        retrieval mode, by BM25 in sparse, fused in hybrid (``mode`` None: the setting
        ``CTX_RETRIEVAL_MODE``). Every hit's ``score`` is its cosine similarity whatever the
        mode; ``sparse_score`` and ``rank`` say what the sparse search and the fusion made of it.

        ``collection`` names the main collection to search (default ``knowledge_main``);
        unexpired hot points are merged in unless ``include_hot`` is False or the collection
        asked for *is* the hot one. ``section`` filters on the payload field (the router passes
        the device-id prefix, e.g. "PUMP").

        A missing hot collection means "no hot hits" (nothing was confirmed yet, or a scratch
        setup only built main); a missing main collection, or the hot one asked for by name,
        raises :class:`CollectionNotFoundError`.

        ``hot_scopes`` limits hot points to those scopes (see :func:`hot_scopes`) and main to
        curated points and answers merged from those scopes (:func:`reader_filter`); None is
        the operator's unscoped view. The router always passes the reader's scopes, and checks
        each scoped hit with :func:`hot_visible`.
        """
        vector = self.encoder.encode_query(query)
        return self.search_vector(
            vector,
            section=section,
            limit=limit,
            collection=collection,
            include_hot=include_hot,
            hot_scopes=hot_scopes,
            mode=mode,
            query=query,
        )

    @property
    def awaits_on_loop(self) -> bool:
        """True when the store's calls are awaited on the event loop (the edge server's
        client), so a search may run there instead of on a worker thread."""
        return bool(getattr(self.store, "awaits_on_loop", False))

    def search_vector(
        self,
        vector: Vector,
        *,
        section: str | None = None,
        limit: int | None = None,
        collection: str | None = None,
        include_hot: bool = True,
        hot_scopes: Sequence[str] | None = None,
        mode: str | None = None,
        query: str | None = None,
        sparse: SparseVector | None = None,
    ) -> list[Hit]:
        """:meth:`search` for a caller that already holds the query embedding; the sparse and
        hybrid modes need the query's ``sparse`` vector or its text (``query``), else the
        search runs as dense."""
        k = limit if limit is not None else self.settings.l3_top_k
        if k <= 0:
            raise InvalidStoreRequestError(f"search limit must be > 0, got {k}")
        mode = mode or self.settings.retrieval_mode
        fusion = self.settings.hybrid_fusion
        feedback = self.settings.hybrid_feedback
        check_mode(mode, fusion)
        main = collection or self.main
        if mode != "dense" and sparse is None and query is not None:
            sparse = self.sparse_for(main).encode_query(query)
        if sparse is None or not len(sparse):
            mode = "dense"
        base: dict[str, Any] = {"section": section} if section else {}
        queries: list[SearchQuery] = []
        if main != self.hot:
            main_filter: Filter = base
            if hot_scopes is not None:  # a reader: curated points and its scopes' answers
                main_filter = {**base, **reader_filter(hot_scopes)}
            queries.append(
                SearchQuery(
                    main, k, main_filter or None, mode=mode, fusion=fusion, feedback=feedback
                )
            )
        if (include_hot or main == self.hot) and (hot_scopes is None or hot_scopes):
            hot_filter: Filter = {**base, "expires_at": {"gt": self._clock()}}
            if hot_scopes is not None:
                hot_filter = {**hot_filter, "namespace": list(hot_scopes)}
            hot_mode = mode
            if (
                mode != "dense"
                and main != self.hot
                and self.sparse_for(self.hot).name != self.sparse_for(main).name
            ):
                hot_mode = "dense"  # one query vector per batch: its terms fit main only
            # no feedback on the hot collection: a few hundred short answers, where a second
            # dense pass costs as much as on main and its neighbours add little
            queries.append(SearchQuery(self.hot, k, hot_filter, mode=hot_mode, fusion=fusion))
        hits: list[Hit] = []
        # main and hot in one batch (one round trip through the edge server)
        answers = search_batch(
            self.store, vector, queries, sparse=sparse if mode != "dense" else None
        )
        for q, got in zip(queries, answers, strict=True):
            if isinstance(got, Exception):
                hot_missing = isinstance(got, CollectionNotFoundError) and q.name == self.hot
                if hot_missing and main != self.hot:
                    self._no_hot_collection(main)
                    continue
                raise got
            hits.extend(got)
        if mode == "dense":
            hits.sort(key=lambda h: h.score, reverse=True)
        else:  # two fused lists: interleave by rank, ties by cosine
            hits.sort(key=lambda h: (h.rank or k + 1, -h.score))
        return [dataclasses.replace(h, rank=r) for r, h in enumerate(hits[:k], 1)]

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
        source: str = "",
        section: str,
        title: str = "",
        confirmed: bool = False,
        extra: dict[str, Any] | None = None,
        written_by: str | None = None,
        namespace: str | None = None,
        namespaces: AclSource | None = None,
        key: str | None = None,
        subject: str | None = None,
    ) -> str:
        """Store an answer confirmed during a session for ``CTX_HOT_TTL_HOURS`` (72 h).

        Refuses session/user ids anywhere in ``extra``; cleans text and payload through the
        gateway before embedding, so a secret never reaches the vector or the payload.

        Trust: ``written_by`` is the writing agent (None: an in-process system write) and
        ``namespace`` the shared namespace it asks to write under, kept only when
        ``namespaces`` shows a ``write`` grant (:func:`resolve_hot_scope`). The stored
        ``source`` is :func:`hot_source` of that scope and ``key`` (default: ``source``);
        ``source`` itself is the caller's claim, stored as the inert ``claimed_source``. The
        point id covers scope, key and text: another scope can never overwrite this point.
        ``subject`` is the keyed hash of the user whose session confirmed the answer
        (:func:`context_core.access.subjects.subject_id`), stored as ``subject`` so an
        erasure of that user finds the point (and, after the merge, its copy in main).
        """
        if not text.strip():
            raise InvalidStoreRequestError("upsert_hot needs non-empty text")
        extra = {k: v for k, v in (extra or {}).items() if k not in _SERVER_FIELDS}
        refuse_session_data(extra, where=f"hot upsert for source {source!r}")
        scope = resolve_hot_scope(written_by, namespace, namespaces)
        stored_source = hot_source(scope, source if key is None else key)
        where = f"l3:{self.hot}"
        clean_text = self.gateway.clean_text(text, where=where)
        now = self._clock()
        content_hash = hashlib.sha256(clean_text.encode("utf-8")).hexdigest()
        payload: dict[str, Any] = {
            **extra,
            "source": stored_source,
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
        if source and key is None:
            payload["claimed_source"] = source
        payload = self.gateway.clean(payload, where=where)
        # Set after cleaning: server-made values from the authenticated identity, which
        # visibility is matched on; a redaction rewriting them would orphan the point.
        payload.update(
            written_by=written_by or None, namespace=scope, trust=UNREVIEWED, source=stored_source
        )
        if subject:
            payload["subject"] = subject
        refuse_session_data(payload, where=f"hot upsert for source {source!r}")
        pid = hot_point_id(stored_source, content_hash)
        vector = self.encoder.encode([clean_text])[0]
        sparse = self.sparse_for(self.hot).encode_documents([clean_text])[0]
        self.store.upsert(self.hot, [PointRecord(pid, vector, payload, sparse)])
        return pid

    def upsert_chunks(
        self, collection: str, records: Sequence[PointRecord], *, optimize: bool = True
    ) -> int:
        """Bulk write for the ingestion pipeline: refuse session data, clean, upsert, index.

        ``optimize`` builds the HNSW graph afterwards (Qdrant Edge does not do it by itself).
        """
        where = f"l3:{collection}"
        encoder = self.sparse_for(collection)
        cleaned: list[PointRecord] = []
        for r in records:
            refuse_session_data(r.payload, where=f"point {r.id} for {collection!r}")
            payload = self.gateway.clean(r.payload, where=where)
            # the sparse terms come from the cleaned text: a redacted secret leaves no term
            text = payload.get("text")
            sparse = encoder.encode_documents([text])[0] if isinstance(text, str) else None
            cleaned.append(PointRecord(r.id, r.vector, payload, sparse))
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
