"""Shared fixtures: real servers only.

* ``redis_url``: Redis 7 at 127.0.0.1:6379 (DB 13, reserved for tests) when reachable,
  else an embedded Valkey started for the session.
* ``any_redis``: parametrised over the three server kinds, for suites that must pass on
  each (the L2 suite): the system Redis 7, the embedded Valkey, and a Redis Cluster. The
  embedded Valkey is always available; the system Redis param skips, saying why, when
  nothing listens on 6379.
* ``cluster_redis_url``: a private Redis Cluster (3 masters + 3 replicas, Debian's
  ``redis-server``) started once per session on free loopback ports and killed at the end
  (``tests/redis_cluster.py``), or the one ``CTX_TEST_REDIS_CLUSTER_URL`` names
  (``redis+cluster://host:port``). Skips, saying why, only when no ``redis-server`` binary
  exists. Its URL is ``redis+cluster://...``: build test clients with
  :func:`redis_client`, which gives a cluster client for it.
* ``redis_or_cluster``: ``redis_url`` and then the cluster (module scope); a module runs on
  both by overriding ``redis_url`` with it (the service, router and namespace suites).
* ``settings``: ``Settings`` on a per-test temp data dir, pointed at ``redis_url``.
* ``shared_data``: path to ``../shared/data`` or a skip naming the missing folder.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import redis
from redis.cluster import RedisCluster
from redis_cluster import LocalCluster, cluster_binaries, redis_client

from context_app.airflow_local import LocalAirflow as AirflowHome
from context_core.config import Settings, get_settings
from context_core.redis.connection import split_cluster_url

if TYPE_CHECKING:
    from context_core.knowledge.embedding import Encoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The suite embeds with fp32 torch, the path its scores and thresholds were written for, and
# exports no ONNX model; CTX_EMBED_BACKEND=auto (the default) and onnx-int8 are tested with
# explicit settings in tests/test_onnx_encoder.py, on one export per test run.
os.environ.setdefault("CTX_EMBED_BACKEND", "torch")
# The router trusts its last look at thresholds.json & co. for CTX_POLICY_RECHECK_S (1 s by
# default); tests write a calibration and route at once, so they look on every route (the
# bound itself is tested in test_policy_reload.py with an injected clock).
os.environ.setdefault("CTX_POLICY_RECHECK_S", "0")

SYSTEM_REDIS_URL = os.environ.get("CTX_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
CLUSTER_REDIS_URL = os.environ.get("CTX_TEST_REDIS_CLUSTER_URL")
REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS_DIR = str(Path(__file__).resolve().parent)  # for child processes importing helpers
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
T = TypeVar("T")


def is_cluster_url(url: str) -> bool:
    return split_cluster_url(url)[1]


def _reachable(url: str) -> bool:
    try:
        c = redis_client(url, socket_connect_timeout=0.5)
        ok = bool(c.ping())
        c.close()
        return ok
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError):
        return False


@pytest.fixture(scope="session")
def embedded_valkey_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from context_core.redis.connection import RedisProvider

    d = tmp_path_factory.mktemp("valkey")
    provider = RedisProvider(get_settings(data_dir=d, redis_url=None))
    try:
        yield provider.url
    finally:
        provider.close()


@pytest.fixture(scope="session")
def system_redis_url() -> str:
    if not _reachable(SYSTEM_REDIS_URL):
        pytest.skip(f"no Redis answering at {SYSTEM_REDIS_URL} (set CTX_TEST_REDIS_URL)")
    return SYSTEM_REDIS_URL


@pytest.fixture(scope="session")
def default_redis_url(request: pytest.FixtureRequest) -> str:
    """The system Redis when reachable, else the embedded Valkey."""
    if _reachable(SYSTEM_REDIS_URL):
        return SYSTEM_REDIS_URL
    return str(request.getfixturevalue("embedded_valkey_url"))


@pytest.fixture(scope="session")
def redis_url(default_redis_url: str) -> str:
    """The system Redis when reachable, else the embedded Valkey (modules running on the
    cluster too override this with ``redis_or_cluster``)."""
    return default_redis_url


@pytest.fixture(scope="session")
def cluster_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis Cluster: ``CTX_TEST_REDIS_CLUSTER_URL`` when set (it must answer), else a
    private 3-master + 3-replica cluster started now and killed at the session's end."""
    if CLUSTER_REDIS_URL:
        if not is_cluster_url(CLUSTER_REDIS_URL):
            pytest.fail(
                f"CTX_TEST_REDIS_CLUSTER_URL must be redis+cluster://, got {CLUSTER_REDIS_URL}"
            )
        if not _reachable(CLUSTER_REDIS_URL):
            pytest.fail(f"CTX_TEST_REDIS_CLUSTER_URL={CLUSTER_REDIS_URL} does not answer")
        yield CLUSTER_REDIS_URL
        return
    if cluster_binaries() is None:
        pytest.skip(
            "no redis-server/redis-cli binary to start a Redis Cluster (apt install "
            "redis-server, set CTX_REDIS_SERVER, or CTX_TEST_REDIS_CLUSTER_URL)"
        )
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="module", params=["redis", "cluster"])
def redis_or_cluster(request: pytest.FixtureRequest) -> str:
    """``redis_url`` (the system Redis, else the embedded Valkey), then the Redis Cluster: a
    module that overrides ``redis_url`` with this runs all its tests once per deployment kind
    (module scope, so module-scoped services start once per kind)."""
    if request.param == "cluster":
        return str(request.getfixturevalue("cluster_redis_url"))
    return str(request.getfixturevalue("default_redis_url"))


@pytest.fixture(params=["redis7", "valkey", "cluster"])
def any_redis(request: pytest.FixtureRequest) -> str:
    """Each L2 test runs once per real server kind (the cluster's URL is
    ``redis+cluster://``: use :func:`redis_client` for a test's own client)."""
    if request.param == "redis7":
        return str(request.getfixturevalue("system_redis_url"))
    if request.param == "cluster":
        return str(request.getfixturevalue("cluster_redis_url"))
    return str(request.getfixturevalue("embedded_valkey_url"))


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    return get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=redis_url
    )


@pytest.fixture(scope="session")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    """The offline MiniLM encoder, loaded once for the whole run (the model is read-only; the
    query-vector cache it keeps per process is what the service keeps too)."""
    from context_core.knowledge.embedding import load_encoder

    return load_encoder(get_settings(data_dir=tmp_path_factory.mktemp("encoder")))


@pytest.fixture
def session_id() -> str:
    """A fresh session id per test so tests never see each other's keys."""
    return f"t-{uuid.uuid4().hex[:12]}"


@dataclasses.dataclass(frozen=True)
class CrowdedRedis:
    """``any_redis`` plus 20,000 unrelated keys, so anything that SCANs the keyspace shows."""

    url: str
    prefix: str
    n_keys: int

    def scan_calls(self) -> int:
        """Server-wide SCAN calls so far (INFO commandstats ``cmdstat_scan``), summed over
        every master of a cluster."""
        c = redis_client(self.url)
        try:
            if isinstance(c, RedisCluster):
                per_node = c.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
                stats = list(per_node.values())
            else:
                stats = [c.info("commandstats")]
            return sum(int(s.get("cmdstat_scan", {}).get("calls", 0)) for s in stats)
        finally:
            c.close()

    def run_without_scan(self, prepare: Callable[[], Callable[[], T]], attempts: int = 5) -> T:
        """``act = prepare()`` outside the window, then ``act()``, which must add no SCAN.

        The counter is server-wide and the system Redis is shared with other test runs whose
        fixtures SCAN, so a window that saw one is retried with a fresh ``prepare()``. Code
        that scans adds >= 1 call (>= 40 over these 20k keys) in *every* window: it cannot
        pass, however many attempts.
        """
        delta = -1
        for _ in range(attempts):
            act = prepare()
            before = self.scan_calls()
            result = act()
            delta = self.scan_calls() - before
            if delta == 0:
                return result
        raise AssertionError(f"SCAN was sent in each of {attempts} windows (last: {delta} calls)")


@pytest.fixture
def crowded_redis(any_redis: str) -> Iterator[CrowdedRedis]:
    """20k string keys under ``t-crowd-<uuid>:`` (10 min TTL as a safety net), deleted by
    name afterwards: no SCAN in set-up or teardown, so the counter only moves for the test."""
    prefix = f"t-crowd-{uuid.uuid4().hex[:10]}:"
    names = [f"{prefix}{i}" for i in range(20_000)]
    c = redis_client(any_redis)
    try:
        for start in range(0, len(names), 2_000):
            pipe = c.pipeline(transaction=False)
            for name in names[start : start + 2_000]:
                pipe.set(name, "x", ex=600)
            pipe.execute()
        yield CrowdedRedis(any_redis, prefix, len(names))
    finally:
        for start in range(0, len(names), 2_000):
            c.delete(*names[start : start + 2_000])
        c.close()


def cleanup_keys(url: str, pattern: str) -> None:
    """Delete test keys by SCAN (never KEYS *); on a cluster the SCAN walks every master and
    the DEL is split per slot by the client."""
    c = redis_client(url)
    try:
        batch = list(c.scan_iter(match=pattern, count=500))
        if batch:
            c.delete(*batch)
    finally:
        c.close()


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (only in the project workspace)")
    return SHARED_DATA


# --- Airflow ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> AirflowHome:
    """A private AIRFLOW_HOME with a SQLite DB migrated once per session.

    Every DagBag parse and ``dag.test()`` runs in a fresh interpreter (Airflow freezes its
    configuration at import), through the same runner the main job uses.
    """
    home = tmp_path_factory.mktemp("airflow_home")
    return AirflowHome(home=home, dags_folder=REPO_ROOT / "dags").prepare()


class RoundTrips:
    """Records, at the wire, every round trip the Redis clients of this process send while
    active: one entry per packet, the command names in it in order (``[["EVALSHA", "ZADD"],
    ["HGETALL"]]``). Commands are parsed from the RESP arrays themselves, so the count holds
    whatever code path built them. ``trips``: synchronous clients; ``loop_trips``: those of
    them sent by code running on the event loop (:func:`context_core.redis.ops.on_loop`:
    they block the loop, the hot endpoints must send none); ``async_trips``: the
    asynchronous twins' (what code on the loop awaits: the lean client's rounds, or
    ``redis.asyncio``'s packets)."""

    def __init__(self) -> None:
        self.trips: list[list[str]] = []
        self.loop_trips: list[list[str]] = []
        self.async_trips: list[list[str]] = []
        self._orig: Any = None
        self._orig_async: Any = None
        self._orig_lean: Any = None

    def __enter__(self) -> RoundTrips:
        import redis.asyncio.connection as arc
        import redis.connection as rc

        from context_core.concurrency import on_loop_now

        self._orig = orig = rc.AbstractConnection.send_packed_command
        self._orig_async = orig_async = arc.AbstractConnection.send_packed_command
        trips, loop_trips, async_trips = self.trips, self.loop_trips, self.async_trips

        def send(conn: Any, command: Any, check_health: bool = True) -> Any:
            names = _resp_names(_joined(command))
            if not _HANDSHAKE.issuperset(names):  # a new connection's setup is not a trip
                trips.append(names)
                if on_loop_now():
                    loop_trips.append(names)
            return orig(conn, command, check_health)

        async def send_async(conn: Any, command: Any, check_health: bool = True) -> Any:
            names = _resp_names(_joined(command))
            if not _HANDSHAKE.issuperset(names):
                async_trips.append(names)
            return await orig_async(conn, command, check_health)

        from context_core.redis.loop_client import LoopRedis

        self._orig_lean = orig_lean = LoopRedis.execute

        async def lean(client: Any, commands: Any) -> Any:
            async_trips.append([str(words[0]).split()[0].upper() for words, _ in commands])
            return await orig_lean(client, commands)

        rc.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        arc.AbstractConnection.send_packed_command = send_async  # type: ignore[method-assign]
        LoopRedis.execute = lean  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        import redis.asyncio.connection as arc
        import redis.connection as rc

        from context_core.redis.loop_client import LoopRedis

        rc.AbstractConnection.send_packed_command = self._orig  # type: ignore[method-assign]
        arc.AbstractConnection.send_packed_command = self._orig_async  # type: ignore[method-assign]
        LoopRedis.execute = self._orig_lean  # type: ignore[method-assign]

    def names(self) -> list[str]:
        return [n for trip in self.trips for n in trip]

    def clear(self) -> None:
        self.trips.clear()
        self.loop_trips.clear()
        self.async_trips.clear()


#: What a client sends when it opens a connection (not counted as a round trip).
_HANDSHAKE = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT", "READONLY"})


def _joined(command: Any) -> bytes:
    chunks = command if isinstance(command, list | tuple) else [command]
    return b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)


def _resp_names(blob: bytes) -> list[str]:
    """The command name of each RESP array in ``blob``."""
    names: list[str] = []
    pos = 0
    while pos < len(blob):
        assert blob[pos : pos + 1] == b"*", blob[pos : pos + 20]
        end = blob.index(b"\r\n", pos)
        count = int(blob[pos + 1 : end])
        pos = end + 2
        for i in range(count):
            end = blob.index(b"\r\n", pos)
            size = int(blob[pos + 1 : end])
            if i == 0:
                names.append(blob[end + 2 : end + 2 + size].decode().upper())
            pos = end + 2 + size + 2
    return names


@pytest.fixture
def round_trips() -> Iterator[RoundTrips]:
    with RoundTrips() as rt:
        yield rt
