"""The edge server: one process owns the Qdrant Edge shards, others use them over a socket.

The VectorStore contract itself runs against ``RemoteEdgeStore`` in
``test_vector_store_contract.py``; this module covers what the wire adds: errors crossing it,
a dead server, several client processes, the socket's mode, the frame cap, the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from context_core.errors import (
    BackendUnavailableError,
    CollectionNotFoundError,
    ConfigError,
    ContextError,
    InvalidStoreRequestError,
    ModelMismatchError,
)
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.edge_server import (
    EdgeServer,
    RemoteEdgeStore,
    protocol,
    start_edge_server,
    stop_edge_server,
)
from context_core.knowledge.store import PointRecord, SearchQuery, point_id

DIM = 16
N = 200
COLL = "kb"


def _vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


VECS = _vectors(N, 7)
QUERIES = _vectors(20, 99)
IDS = [point_id(f"page-{i // 10}", i % 10) for i in range(N)]


def _records() -> list[PointRecord]:
    return [
        PointRecord(IDS[i], VECS[i], {"section": ("PUMP", "FAN")[i % 2], "text": f"chunk {i}"})
        for i in range(N)
    ]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # short: pytest's tmp_path can exceed the 107 bytes a Unix socket path may have
    d = Path(tempfile.mkdtemp(prefix="ctx-edge-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def served(tmp_path: Path, sock_dir: Path) -> Iterator[tuple[EdgeServer, RemoteEdgeStore]]:
    """An in-process server (threads) with a filled collection, and a client."""
    server = EdgeServer(tmp_path / "qdrant", sock_dir / "edge.sock", search_threads=1).start()
    client = RemoteEdgeStore(server.socket_path)
    try:
        client.create_collection(COLL, dim=DIM, model="test-16d")
        client.upsert(COLL, _records())
        yield server, client
    finally:
        client.close()
        server.close()


def _raises(fn: Callable[..., Any], *args: Any, **kw: Any) -> ContextError:
    with pytest.raises(ContextError) as info:
        fn(*args, **kw)
    return info.value


# --- errors over the wire ---------------------------------------------------------------


def test_errors_keep_class_and_message(served: tuple[EdgeServer, RemoteEdgeStore]) -> None:
    server, client = served
    direct: EdgeStore = server.store  # the very store the server answers from
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("search", (QUERIES[0], SearchQuery("nope")), {}),
        ("search", (np.ones(8, dtype=np.float32), SearchQuery(COLL)), {}),
        ("create_collection", (COLL,), {"dim": DIM, "model": "other-model"}),
        ("create_collection", (COLL,), {"dim": 384, "model": "test-16d"}),
        ("upsert", (COLL, [PointRecord("not-a-uuid", VECS[0], {})]), {}),
        ("upsert", (COLL, [PointRecord(IDS[0], None, {})]), {}),
        ("count", (COLL,), {"filter": {"section": {"before": 3}}}),
        ("count", ("missing",), {}),
        ("delete", (COLL,), {}),
        ("search", (QUERIES[0], SearchQuery("../escape")), {}),
    ]
    kinds = set()
    for method, args, kw in cases:
        want = _raises(getattr(direct, method), *args, **kw)
        got = _raises(getattr(client, method), *args, **kw)
        assert type(got) is type(want), (method, args)
        assert str(got) == str(want), (method, args)
        kinds.add(type(got))
    assert kinds == {CollectionNotFoundError, InvalidStoreRequestError, ModelMismatchError}
    # nothing above broke the connection or the data
    assert client.count(COLL) == N


def test_unknown_server_errors_become_backend_unavailable(
    served: tuple[EdgeServer, RemoteEdgeStore],
) -> None:
    _, client = served
    with pytest.raises(InvalidStoreRequestError, match="unknown edge server op 'explode'"):
        client._call("explode", {})
    # a malformed request makes the server raise a plain KeyError: not a platform class
    with pytest.raises(BackendUnavailableError, match=r"failed on search: KeyError: 'vector'"):
        client._call("search", {"name": COLL})
    assert client.count(COLL) == N


def test_wire_round_trip_is_faithful(served: tuple[EdgeServer, RemoteEdgeStore]) -> None:
    server, client = served
    direct: EdgeStore = server.store
    for q in QUERIES[:5]:
        for filt in (None, {"section": "FAN"}, {"section": ["PUMP", "FAN"]}):
            assert client.search(q, SearchQuery(COLL, 5, filter=filt)) == direct.search(
                q, SearchQuery(COLL, 5, filter=filt)
            )
    # float64 lists and float32 rows give the same answer (the wire is float32, like the shard)
    assert client.search(
        QUERIES[0].astype(np.float64).tolist(), SearchQuery(COLL)
    ) == direct.search(QUERIES[0], SearchQuery(COLL))
    assert client.retrieve(COLL, IDS[:3], with_vectors=True) == direct.retrieve(
        COLL, IDS[:3], with_vectors=True
    )
    assert client.optimize(COLL) == direct.index_status(COLL)
    assert client.index_status(COLL) == direct.index_status(COLL)
    with pytest.raises(InvalidStoreRequestError, match="one-dimensional"):
        client.search(QUERIES[:2], SearchQuery(COLL))
    with pytest.raises(InvalidStoreRequestError, match="a filter must be a mapping"):
        client.search(QUERIES[0], SearchQuery(COLL, filter=["section"]))  # type: ignore[arg-type]


def test_small_pages_and_batches(
    served: tuple[EdgeServer, RemoteEdgeStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upserts, retrieves and scroll pages are split at protocol.BATCH; the answers stay."""
    server, client = served
    monkeypatch.setattr(protocol, "BATCH", 7)
    client.create_collection("small", dim=DIM, model="test-16d")
    client.upsert("small", _records()[:50])
    assert server.store.count("small") == 50
    got = client.retrieve("small", [*reversed(IDS[:50]), point_id("missing", 0)])
    assert [r.id for r in got] == list(reversed(IDS[:50]))
    seen = [r.id for r in client.scroll("small", batch=1000)]
    assert sorted(seen) == sorted(IDS[:50])
    assert [r.id for r in client.scroll(COLL)] == [r.id for r in server.store.scroll(COLL)]


def test_threads_share_one_client(served: tuple[EdgeServer, RemoteEdgeStore]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _, client = served

    def ids_for(j: int) -> list[str]:
        return [h.id for h in client.search(QUERIES[j], SearchQuery(COLL, 5))]

    serial = [ids_for(j) for j in range(len(QUERIES))]
    with ThreadPoolExecutor(max_workers=6) as pool:
        threaded = list(pool.map(ids_for, list(range(len(QUERIES))) * 5))
    assert threaded == serial * 5
    assert len(client._idle) <= client.max_idle


# --- the frame cap ------------------------------------------------------------------------


def _read_frame(sock: socket.socket) -> object:
    buf = b""
    while len(buf) < 4:
        buf += sock.recv(4096)
    size = int.from_bytes(buf[:4], "big")
    while len(buf) < 4 + size:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the answer"
        buf += chunk
    return msgspec.msgpack.decode(buf[4 : 4 + size])


def test_oversized_frame_is_refused_and_server_keeps_serving(
    served: tuple[EdgeServer, RemoteEdgeStore],
) -> None:
    server, client = served
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(5)
        raw.connect(str(server.socket_path))
        raw.sendall((protocol.MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"\x00" * 1000)
        answer = _read_frame(raw)
        assert isinstance(answer, dict)
        assert answer["error"]["type"] == "InvalidStoreRequestError"
        assert f"{protocol.MAX_FRAME_BYTES + 1} bytes" in answer["error"]["message"]
        assert "frame cap" in answer["error"]["message"]
        assert raw.recv(1) == b""  # that connection is dropped (its body can't be skipped)
    # garbage inside a well-formed frame is answered, not fatal
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(5)
        raw.connect(str(server.socket_path))
        raw.sendall((3).to_bytes(4, "big") + b"\xc1\xc1\xc1")
        answer = _read_frame(raw)
        assert isinstance(answer, dict)
        assert answer["error"]["type"] == "InvalidStoreRequestError"
    # everyone else is still served
    assert client.count(COLL) == N
    assert RemoteEdgeStore(server.socket_path).search(VECS[3], SearchQuery(COLL, 1))[0].id == IDS[3]


def test_client_splits_big_upserts_and_refuses_one_oversized_point(
    served: tuple[EdgeServer, RemoteEdgeStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = served
    monkeypatch.setattr(protocol, "MAX_FRAME_BYTES", 64 * 1024)  # client and in-process server
    big = [
        PointRecord(point_id("big", i), VECS[i], {"text": "x" * 2000}) for i in range(100)
    ]  # ~200 KB: over the cap in one frame, fine in several
    client.upsert(COLL, big)
    assert client.count(COLL) == N + 100
    with pytest.raises(InvalidStoreRequestError, match=r"over the edge server's frame cap"):
        client.upsert(COLL, [PointRecord(point_id("huge", 0), VECS[0], {"text": "x" * 70_000})])
    assert client.count(COLL) == N + 100
    # an answer over the cap is refused by the server, which then answers the next call
    with pytest.raises(InvalidStoreRequestError, match="the retrieve answer"):
        client.retrieve(COLL, [p.id for p in big], with_vectors=True)
    assert server.store.count(COLL) == N + 100
    assert client.count(COLL) == N + 100


# --- the socket -----------------------------------------------------------------------------


def test_socket_mode_is_0600_even_with_a_permissive_umask(tmp_path: Path, sock_dir: Path) -> None:
    old = os.umask(0)
    try:
        server = EdgeServer(tmp_path / "q", sock_dir / "edge.sock").start()
    finally:
        os.umask(old)
    try:
        mode = os.stat(server.socket_path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
    finally:
        server.close()
    assert not server.socket_path.exists()  # removed on close


def test_live_server_is_not_replaced_stale_socket_is(tmp_path: Path, sock_dir: Path) -> None:
    path = sock_dir / "edge.sock"
    with EdgeServer(tmp_path / "a", path):
        with pytest.raises(BackendUnavailableError, match="already listening on"):
            EdgeServer(tmp_path / "b", path).start()
        with pytest.raises(BackendUnavailableError, match="already owns the Qdrant Edge shards"):
            EdgeServer(tmp_path / "a", sock_dir / "other.sock").start()
        assert RemoteEdgeStore(path).ping()["root"] == str((tmp_path / "a").resolve())
    # a socket file nobody listens on (a crashed server) is replaced
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    assert path.exists()
    with EdgeServer(tmp_path / "b", path):
        assert RemoteEdgeStore(path).ping()["root"] == str((tmp_path / "b").resolve())
    # a regular file is never deleted
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="is not a socket"):
        EdgeServer(tmp_path / "b", path).start()
    assert path.read_text() == "not a socket"
    with pytest.raises(ConfigError, match="longer than the 107 bytes"):
        EdgeServer(tmp_path / "b", sock_dir / ("x" * 120)).start()


# --- a real server process ------------------------------------------------------------------


def _fill_pool(client: RemoteEdgeStore, n: int) -> None:
    """Leave ``n`` connections in the client's pool (n concurrent calls)."""
    import threading

    barrier = threading.Barrier(n)

    def call() -> None:
        conn = client._checkout()
        barrier.wait()
        client._checkin(conn)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(client._idle) >= n


def test_killed_server_names_the_socket_and_restart_recovers(
    tmp_path: Path, sock_dir: Path
) -> None:
    path = sock_dir / "edge.sock"
    proc = start_edge_server(tmp_path / "qdrant", path, 1)
    client = RemoteEdgeStore(path, timeout_s=5)
    try:
        client.create_collection(COLL, dim=DIM, model="test-16d")
        client.upsert(COLL, _records())
        _fill_pool(client, 4)
        # the server dies and a new one takes its socket between two calls: the client's
        # pooled connections all lead to the dead one; the next call reconnects once and works
        proc.kill()
        stop_edge_server(proc)
        proc = start_edge_server(tmp_path / "qdrant", path, 1)
        assert client.count(COLL) == N
        assert [h.id for h in client.search(VECS[7], SearchQuery(COLL, 1))] == [IDS[7]]
        # no server at all: a clear error naming the socket and the fix
        proc.kill()
        stop_edge_server(proc)
        with pytest.raises(BackendUnavailableError) as info:
            client.search(QUERIES[0], SearchQuery(COLL))
        msg = str(info.value)
        assert f"on {path} is unreachable" in msg
        assert "python -m context_core.knowledge.edge_server" in msg
        assert "CTX_EDGE_SOCKET" in msg
        path.unlink()  # and with the socket file gone too
        with pytest.raises(BackendUnavailableError, match=f"on {path} is unreachable"):
            client.count(COLL)
    finally:
        client.close()
        stop_edge_server(proc)


def test_sigterm_flushes_and_removes_the_socket(tmp_path: Path, sock_dir: Path) -> None:
    path = sock_dir / "edge.sock"
    proc = start_edge_server(tmp_path / "qdrant", path, 1)
    try:
        with RemoteEdgeStore(path) as client:
            client.create_collection(COLL, dim=DIM, model="test-16d")
            client.upsert(COLL, _records())
    finally:
        code = stop_edge_server(proc)
    assert code == 0
    assert not path.exists()
    # the shards were closed cleanly: this process can open them now
    with EdgeStore(tmp_path / "qdrant") as direct:
        assert direct.count(COLL) == N
        assert direct.search(VECS[5], SearchQuery(COLL, 1))[0].id == IDS[5]


_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from context_core.knowledge.edge_server import RemoteEdgeStore
    from context_core.knowledge.store import SearchQuery

    sock, sync, queries, rounds, me = sys.argv[1:6]
    rounds, peer = int(rounds), str(1 - int(me))

    def mark(name):
        open(os.path.join(sync, name), "w").close()

    def wait(name, what):
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(sync, name)):
            if time.time() > deadline:
                sys.exit(f"timed out waiting for {what}")
            time.sleep(0.005)

    qs = np.load(queries)
    client = RemoteEdgeStore(sock)
    client.ping()  # connected before the start signal
    mark("ready-" + me)
    wait("go", "the start signal")
    t0 = time.time()
    out = []
    for i in range(rounds):
        out.append([[h.id for h in client.search(q, SearchQuery("kb", 5))] for q in qs])
        if i == 0:  # rendezvous: the peer must be served while this client stays connected
            mark("first-" + me)
            wait("first-" + peer, "the other client's first round (server not concurrent?)")
    t1 = time.time()
    print(json.dumps({"t0": t0, "t1": t1, "ids": out}))
    """
)


def test_two_client_processes_search_concurrently(tmp_path: Path, sock_dir: Path) -> None:
    path = sock_dir / "edge.sock"
    proc = start_edge_server(tmp_path / "qdrant", path, 1)
    try:
        with RemoteEdgeStore(path) as client:
            client.create_collection(COLL, dim=DIM, model="test-16d")
            client.upsert(COLL, _records())
            expected = [[h.id for h in client.search(q, SearchQuery(COLL, 5))] for q in QUERIES]
        np.save(tmp_path / "q.npy", QUERIES)
        sync = tmp_path / "sync"
        sync.mkdir()
        rounds = 15
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _CHILD,
                    str(path),
                    str(sync),
                    str(tmp_path / "q.npy"),
                    str(rounds),
                    str(me),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for me in range(2)
        ]
        deadline = time.time() + 60  # both connected before either starts (slow imports)
        while not all((sync / f"ready-{me}").exists() for me in range(2)):
            assert time.time() < deadline, "a client did not connect within 60 s"
            assert all(c.poll() is None for c in children), "a client exited before connecting"
            time.sleep(0.01)
        (sync / "go").touch()
        results = []
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err
            results.append(json.loads(out))
    finally:
        stop_edge_server(proc)
    for r in results:
        assert r["ids"] == [expected] * rounds
    a, b = results
    assert a["t0"] < b["t1"] and b["t0"] < a["t1"], "the two clients did not overlap in time"


# --- wiring -------------------------------------------------------------------------------


def test_open_store_uses_the_socket_when_set(
    tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from context_core.config import get_settings
    from context_core.knowledge import open_store

    monkeypatch.setenv("CTX_EDGE_SOCKET", str(sock_dir / "edge.sock"))
    settings = get_settings(data_dir=tmp_path / "ctx")
    assert settings.edge_socket == sock_dir / "edge.sock"
    store = open_store(settings)
    try:
        assert isinstance(store, RemoteEdgeStore)
        assert store.socket_path == sock_dir / "edge.sock"
        with EdgeServer(settings.qdrant_dir, sock_dir / "edge.sock"):
            store.create_collection(COLL, dim=DIM, model="test-16d")
            assert store.info(COLL) is not None
    finally:
        store.close()
    # CTX_QDRANT_URL still wins
    from context_core.knowledge.qdrant_server import QdrantServerStore

    server = open_store(get_settings(data_dir=tmp_path / "ctx", qdrant_url=":memory:"))
    try:
        assert isinstance(server, QdrantServerStore)
    finally:
        server.close()


def test_cli_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "context_core.knowledge.edge_server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for word in ("--root", "--socket", "--search-threads", "CTX_EDGE_SOCKET", "SIGTERM"):
        assert word in out
    for word in ("--hnsw-ef", "CTX_QDRANT_HNSW_EF", "--oversampling", "CTX_QDRANT_OVERSAMPLING"):
        assert word in out


def test_cli_refuses_search_settings_out_of_range(tmp_path: Path, sock_dir: Path) -> None:
    base = [sys.executable, "-m", "context_core.knowledge.edge_server", "--root", str(tmp_path)]
    base += ["--socket", str(sock_dir / "edge.sock"), "--search-threads", "1"]
    for flag, value, words in (
        ("--oversampling", "0.5", "--oversampling must be between 1 and 16"),
        ("--hnsw-ef", "0", "--hnsw-ef must be between 1 and 4096"),
    ):
        done = subprocess.run([*base, flag, value], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, done.stderr


def test_the_server_searches_with_its_oversampling(tmp_path: Path, sock_dir: Path) -> None:
    with EdgeServer(tmp_path / "q", sock_dir / "edge.sock", hnsw_ef=64, oversampling=5.0) as s:
        assert (s.store.hnsw_ef, s.store.oversampling) == (64, 5.0)


def test_start_failure_shows_the_server_log(tmp_path: Path, sock_dir: Path) -> None:
    path = sock_dir / "edge.sock"
    path.write_text("occupied")
    with pytest.raises(BackendUnavailableError, match=r"exited with code 1[\s\S]*not a socket"):
        start_edge_server(tmp_path / "qdrant", path, 1, timeout_s=30)


def test_search_batch_answers_each_query_like_a_search_in_one_round_trip(
    served: tuple[EdgeServer, RemoteEdgeStore],
) -> None:
    from context_core.knowledge.store import search_batch

    server, client = served
    direct: EdgeStore = server.store
    queries = [
        SearchQuery(COLL, 4, {"section": "FAN"}),
        SearchQuery("no_such_collection", 3),
        SearchQuery(COLL, 2, None, exact=True),
    ]
    calls: list[str] = []
    real_call = client._call

    def counting(op: str, args: dict[str, Any], **kw: Any) -> Any:
        calls.append(op)
        return real_call(op, args, **kw)

    client._call = counting  # type: ignore[method-assign]
    got = search_batch(client, QUERIES[0], queries)
    assert calls == ["search_batch"]  # main + hot of a route: one round trip
    assert got[0] == direct.search(QUERIES[0], SearchQuery(COLL, 4, filter={"section": "FAN"}))
    assert isinstance(got[1], CollectionNotFoundError) and "no_such_collection" in str(got[1])
    assert got[2] == direct.search(QUERIES[0], SearchQuery(COLL, 2, exact=True))
    # a store without its own batch is searched query by query, with the same answers
    assert search_batch(direct, QUERIES[0], [queries[0], queries[2]]) == [got[0], got[2]]


def test_hybrid_search_batch_is_proxied_in_one_round_trip(
    served: tuple[EdgeServer, RemoteEdgeStore],
) -> None:
    """Sparse vectors travel both ways; the route's main + hot hybrid searches stay one call."""
    from context_core.knowledge.sparse import SparseEncoder
    from context_core.knowledge.store import search_batch

    server, client = served
    direct: EdgeStore = server.store
    enc = SparseEncoder()
    words = ["pump", "seal", "fan", "belt", "bearing", "oil", "filter", "valve", "motor"]
    texts = [" ".join(words[(i * k) % len(words)] for k in range(1, 5)) for i in range(N)]
    sparse = enc.encode_documents(texts)
    client.create_collection("hyb", dim=DIM, model="test-16d", sparse=enc.name)
    client.upsert(
        "hyb",
        [PointRecord(IDS[i], VECS[i], {"text": texts[i]}, sparse[i]) for i in range(N)],
    )
    info = client.info("hyb")
    assert info is not None and info.sparse == enc.name
    (rec,) = client.retrieve("hyb", [IDS[3]], with_vectors=True)
    assert rec.sparse is not None and rec.sparse.indices == sparse[3].indices
    assert rec.sparse.values == pytest.approx(sparse[3].values, rel=1e-6)

    sq = enc.encode_query("pump seal leak")
    queries = [
        SearchQuery("hyb", 4, mode="hybrid"),
        SearchQuery(COLL, 3, mode="hybrid"),  # dense-only: answers as dense
        SearchQuery("hyb", 3, mode="sparse", fusion="weighted"),
    ]
    calls: list[str] = []
    real_call = client._call

    def counting(op: str, args: dict[str, Any], **kw: Any) -> Any:
        calls.append(op)
        return real_call(op, args, **kw)

    client._call = counting  # type: ignore[method-assign]
    got = search_batch(client, QUERIES[0], queries, sparse=sq)
    assert calls == ["search_batch"]
    assert got[0] == direct.search(QUERIES[0], SearchQuery("hyb", 4, mode="hybrid"), sparse=sq)
    assert got[1] == direct.search(QUERIES[0], SearchQuery(COLL, 3))
    assert got[2] == direct.search(QUERIES[0], SearchQuery("hyb", 3, mode="sparse"), sparse=sq)
    hits = got[0]
    assert isinstance(hits, list) and [h.rank for h in hits] == [1, 2, 3, 4]
    assert all(h.sparse_score is not None for h in hits)

    # a dense-only collection gains sparse vectors through the proxy too
    client.enable_sparse(COLL, enc.name)
    client.set_sparse(COLL, [(IDS[i], sparse[i]) for i in range(N)])
    assert client.search(
        QUERIES[0], SearchQuery(COLL, 3, mode="sparse"), sparse=sq
    ) == direct.search(QUERIES[0], SearchQuery(COLL, 3, mode="sparse"), sparse=sq)


# --- on the event loop (context_core.concurrency): the same calls, awaited ----------------------


def _on_a_loop(fn: Callable[..., Any], *args: Any) -> Any:
    import asyncio

    from context_core.concurrency import on_loop

    return asyncio.run(on_loop(fn, *args))


def test_calls_on_the_loop_answer_like_blocking_ones_without_the_blocking_pool(
    served: tuple[EdgeServer, RemoteEdgeStore],
) -> None:
    _, client = served
    blocking = [[h.id for h in client.search(q, SearchQuery(COLL, 3))] for q in QUERIES[:5]]

    def searches() -> list[list[str]]:
        return [[h.id for h in client.search(q, SearchQuery(COLL, 3))] for q in QUERIES[:5]]

    idle_before = len(client._idle)
    assert _on_a_loop(searches) == blocking
    assert len(client._idle) == idle_before  # the blocking pool was not used
    assert client._loop_idle, "the loop's connection is kept for the next call"
    # a second loop (a test's asyncio.run, a restarted service loop) cannot use the first's
    assert _on_a_loop(lambda: client.count(COLL)) == N
    assert len(client._loop_idle) == 1
    # errors keep their class over the awaited path too
    with pytest.raises(CollectionNotFoundError):
        _on_a_loop(client.count, "nope")


def test_on_the_loop_a_hung_server_times_out_and_a_dead_one_is_named(sock_dir: Path) -> None:
    path = sock_dir / "hung.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)  # accepts (the kernel does) and never answers
    client = RemoteEdgeStore(path, timeout_s=0.3)
    try:
        t0 = time.perf_counter()
        with pytest.raises(BackendUnavailableError, match=r"did not answer count within 0\.3 s"):
            _on_a_loop(client.count, COLL)
        assert time.perf_counter() - t0 < 2.0
        assert not client._loop_idle  # the timed-out connection is not reused
    finally:
        listener.close()
    path.unlink()
    with pytest.raises(BackendUnavailableError, match=f"on {path} is unreachable"):
        _on_a_loop(client.count, COLL)
    client.close()


def test_on_the_loop_a_restarted_server_is_reached_by_reconnecting_once(
    tmp_path: Path, sock_dir: Path
) -> None:
    import asyncio

    from context_core.concurrency import on_loop

    path = sock_dir / "edge.sock"
    proc = start_edge_server(tmp_path / "qdrant", path, 1)
    client = RemoteEdgeStore(path, timeout_s=5)

    async def main() -> tuple[int, int]:
        await on_loop(client.create_collection, COLL, dim=DIM, model="test-16d")
        await on_loop(client.upsert, COLL, _records())
        first = await on_loop(client.count, COLL)
        return first, len(client._loop_idle)

    try:
        loop = asyncio.new_event_loop()
        try:
            first, pooled = loop.run_until_complete(main())
            assert (first, pooled) == (N, 1)
            proc.kill()  # the pooled connection now leads to a dead server
            stop_edge_server(proc)
            proc = start_edge_server(tmp_path / "qdrant", path, 1)
            assert loop.run_until_complete(on_loop(client.count, COLL)) == N
        finally:
            loop.close()
    finally:
        client.close()
        stop_edge_server(proc)


def test_sparse_vectors_cross_the_socket_exactly_and_bad_ones_are_named() -> None:
    from context_core.knowledge.store import SparseVector

    good = SparseVector((0, 7, 0xFFFFFFFF), (0.5, 1.25, 3.0))
    assert protocol.sparse_in(protocol.sparse_out(good)) == good
    assert protocol.sparse_in(protocol.sparse_out(SparseVector((), ()))) == SparseVector((), ())
    numpy_ints = SparseVector(tuple(np.array([3, 9], dtype=np.int64)), (1.0, 2.0))
    assert protocol.sparse_in(protocol.sparse_out(numpy_ints)) == SparseVector((3, 9), (1.0, 2.0))
    for bad in ((-1, 2), (1, 0x1_0000_0000), (1, 2**70), ("a", 2)):
        with pytest.raises(InvalidStoreRequestError, match=r"sparse vector|uint32"):
            protocol.sparse_out(SparseVector(bad, (1.0, 2.0)))
