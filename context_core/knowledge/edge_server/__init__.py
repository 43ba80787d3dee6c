"""One process owns the Qdrant Edge shards; the others reach them over a Unix socket.

A Qdrant Edge shard directory can be opened by one process only (its WAL is locked; a second
``EdgeShard.load`` fails with "Can't init WAL: WouldBlock") and the binding has no read-only
follower. A service with several worker processes therefore runs one :class:`EdgeServer`,
which holds an :class:`~context_core.knowledge.edge.EdgeStore` on the data dir, and gives
every worker a :class:`RemoteEdgeStore`: the same
:class:`~context_core.knowledge.store.VectorStore` protocol, the same answers and the same
error classes (the contract suite runs unchanged against it). ``CTX_EDGE_SOCKET`` makes
:func:`~context_core.knowledge.open.open_store` return one.

Run the server::

    python -m context_core.knowledge.edge_server --root .ctx/qdrant --socket /run/ctx/edge.sock

Modules: :mod:`.protocol` (framing, the msgpack codec, values on the wire), :mod:`.server`
(:class:`EdgeServer`, the serving loop and its operations), :mod:`.client`
(:class:`RemoteEdgeStore`), :mod:`.process` (:func:`start_edge_server`,
:func:`stop_edge_server` and the command line). Each imports only those before it.

The server keeps no per-client state: ``scroll`` returns one page and the offset to pass back
(the Edge scroll cursor is the id of the next point), so a client can iterate lazily and a
restarted server loses nothing. Every operation is idempotent (upserts by id, deletes, creates
and drops are), so a client that finds its connection dead reconnects once and re-sends.
"""

from context_core.knowledge.edge_server.client import RemoteEdgeStore
from context_core.knowledge.edge_server.process import main, start_edge_server, stop_edge_server
from context_core.knowledge.edge_server.protocol import MAX_FRAME_BYTES, PROTOCOL_VERSION
from context_core.knowledge.edge_server.server import EdgeServer

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "EdgeServer",
    "RemoteEdgeStore",
    "main",
    "start_edge_server",
    "stop_edge_server",
]
