"""Redis Cluster: detection, slot rules, durable writes, and a failover drill on a real cluster.

The cluster is real (``redis-server`` processes started by ``tests/redis_cluster.py``: 3
masters + 3 replicas). The L2, lifecycle, router, namespace and service suites run on it
through ``any_redis`` / ``redis_or_cluster``; this module covers what is cluster-only:

* the provider recognises a cluster by URL scheme *and* behind a plain ``redis://`` URL (the
  bug this fixes: the first write of a standalone client hit ``MOVED``);
* SCAN through the cluster client walks every master;
* ``CTX_REDIS_MIN_REPLICAS``: a write is acknowledged only when that many replicas have it,
  and fails (503) when they cannot;
* the failover drill (``slow``): the real HTTP service on a private cluster, one master
  SIGKILLed under a session, what the agent sees until its replica is promoted and a
  replica is back, and that nothing acknowledged was lost.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from conftest import cleanup_keys, redis_client
from redis.cluster import RedisCluster
from redis_cluster import LocalCluster, cluster_binaries
from test_service import running_service, service_settings

from context_core.config import get_settings
from context_core.errors import ConfigError, ReplicaAckError
from context_core.gateway.sanitize import Gateway
from context_core.redis.connection import RedisProvider, split_cluster_url
from context_core.working_memory import WorkingMemory


def _node_url(cluster_url: str) -> str:
    """``redis+cluster://h:p/0`` -> ``redis://h:p/0``: one node, no hint that it is a cluster."""
    return split_cluster_url(cluster_url)[0]


# --- detection ---------------------------------------------------------------------------------


def test_provider_detects_a_cluster_by_scheme_and_by_asking_the_node(
    cluster_redis_url: str, default_redis_url: str, tmp_path: Path
) -> None:
    by_scheme = RedisProvider(get_settings(data_dir=tmp_path, redis_url=cluster_redis_url))
    by_asking = RedisProvider(
        get_settings(data_dir=tmp_path, redis_url=_node_url(cluster_redis_url))
    )
    single = RedisProvider(get_settings(data_dir=tmp_path, redis_url=default_redis_url))
    try:
        assert by_scheme.cluster and by_asking.cluster and not single.cluster
        assert isinstance(by_scheme.client(), RedisCluster)
        assert isinstance(by_asking.client(), RedisCluster)
        assert type(single.client()) is redis.Redis
        # the original failure: a standalone client's first write to another master's slot
        # was MOVED. Sessions spread over every master now write and read back.
        wm = WorkingMemory(by_asking.client(), Gateway())
        sids = [f"t-{uuid.uuid4().hex[:12]}" for _ in range(24)]
        masters = set()
        for sid in sids:
            sm = wm.session(sid)
            key = sm.put_api_response("/api", {"sid": sid}, {"ok": sid})
            masters.add(by_asking.client().get_node_from_key(key).name)
            assert sm.get_api_response("/api", {"sid": sid}).value == {"ok": sid}
        assert len(masters) == 3, masters  # the writes really crossed every master
        for sid in sids:
            wm.session(sid).clear()
    finally:
        by_scheme.close()
        by_asking.close()
        single.close()


def test_a_cluster_url_naming_another_db_is_refused(cluster_redis_url: str, tmp_path: Path) -> None:
    url = _node_url(cluster_redis_url).rsplit("/", 1)[0] + "/13"
    provider = RedisProvider(get_settings(data_dir=tmp_path, redis_url=url))
    try:
        with pytest.raises(ConfigError, match="only DB 0"):
            provider.client()
    finally:
        provider.close()


def test_scan_through_the_cluster_client_walks_every_master(cluster_redis_url: str) -> None:
    prefix = f"t-scan-{uuid.uuid4().hex[:8]}:"
    c = redis_client(cluster_redis_url, decode_responses=True)
    try:
        names = [f"{prefix}{i}" for i in range(300)]  # no hash tag: spread over the slots
        pipe = c.pipeline(transaction=False)
        for n in names:
            pipe.set(n, "x", ex=300)
        pipe.execute()
        owners = {c.get_node_from_key(n).name for n in names}
        assert len(owners) == 3
        assert sorted(c.scan_iter(match=prefix + "*", count=100)) == sorted(names)
        cleanup_keys(cluster_redis_url, prefix + "*")  # the tests' own cleanup walks them too
        assert list(c.scan_iter(match=prefix + "*", count=100)) == []
    finally:
        c.close()


def test_the_load_test_sampler_reads_every_master_of_a_cluster(cluster_redis_url: str) -> None:
    """The expired-keys gate counts keys and expiries over the whole cluster, not one node."""
    from loadtests.sampler import Sampler

    def sampler(url: str) -> Sampler:
        return Sampler(
            service_url="http://127.0.0.1:9", redis_url=url, stats=None, run_time=lambda: 0.0,
            target=lambda _t: 0.0, users=lambda: 0,
        )  # fmt: skip

    prefix = f"t-sampler-{uuid.uuid4().hex[:8]}:"
    c = redis_client(cluster_redis_url, decode_responses=True)
    try:
        _, before = sampler(cluster_redis_url)._redis_figures()
        assert before is not None
        names = [f"{prefix}{i}" for i in range(60)]  # spread over the three masters
        for n in names[:50]:
            c.set(n, "x", ex=300)
        for n in names[50:]:
            c.set(n, "x", px=1)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(c.exists(n) for n in names[50:]):
            time.sleep(0.05)
        # by scheme and by asking the node (a plain URL)
        plain = cluster_redis_url.replace("redis+cluster://", "redis://")
        for url in (cluster_redis_url, plain):
            s = sampler(url)
            expired, keys = s._redis_figures()
            assert s._cluster is True
            assert keys is not None and keys >= before + 50
            assert expired is not None and expired >= 10
    finally:
        cleanup_keys(cluster_redis_url, prefix + "*")
        c.close()


def test_the_health_report_counts_l2_over_every_master(cluster_redis_url: str) -> None:
    from evaluation.health import sample_l2

    prefix = f"wm:{{t-health-{uuid.uuid4().hex[:8]}}}:"
    c = redis_client(cluster_redis_url, decode_responses=True)
    try:
        before = sample_l2(c)
        spread = [f"t-health-{uuid.uuid4().hex[:8]}:{i}" for i in range(30)]  # every master
        for n in spread:
            c.set(n, "x", ex=300)
        for i in range(5):
            c.set(f"{prefix}{i}", "x", ex=300)
        after = sample_l2(c)
        assert after.dbsize >= before.dbsize + 35  # one node alone holds about a third
        assert after.wm_keys >= before.wm_keys + 5
        assert after.run_id.count(",") == 2  # one run id per master
    finally:
        cleanup_keys(cluster_redis_url, prefix + "*")
        cleanup_keys(cluster_redis_url, "t-health-*")
        c.close()


# --- durable writes (CTX_REDIS_MIN_REPLICAS) ------------------------------------------------------


def test_min_replicas_waits_for_the_replica_and_fails_without_enough(
    cluster_redis_url: str,
) -> None:
    client = redis_client(cluster_redis_url, decode_responses=True)
    try:
        sid = f"t-{uuid.uuid4().hex[:12]}"
        # generous: on a loaded 2-core box an ack now and then takes ~1 s (the replica's
        # periodic REPLCONF ACK); the wait is a bound, not the usual latency (<1 ms here)
        one = WorkingMemory(client, Gateway(), min_replicas=1, replica_wait_ms=3000)
        key = one.session(sid).put_step_result("s1", {"v": 1})
        # the replica of the key's master has it (read there directly, READONLY)
        nodes = client.cluster_nodes()  # "host:port" -> node_id, flags, master_id, ...
        master_id = nodes[client.get_node_from_key(key).name]["node_id"]
        replicas = [a for a, n in nodes.items() if n["master_id"] == master_id]
        assert replicas, nodes
        host, port = replicas[0].rsplit(":", 1)
        r = redis.Redis(host=host, port=int(port), decode_responses=True)
        try:
            r.execute_command("READONLY")
            assert r.hget(key, "v") == "1"
        finally:
            r.close()
        # each master has one replica: asking for two can never be acknowledged
        two = WorkingMemory(client, Gateway(), min_replicas=2, replica_wait_ms=50)
        t0 = time.monotonic()
        with pytest.raises(ReplicaAckError, match="only 1 of the 2 replicas"):
            two.session(sid).put_step_result("s2", {"v": 2})
        assert time.monotonic() - t0 < 2
        one.session(sid).clear()
    finally:
        client.close()


def test_a_wait_longer_than_the_socket_timeout_is_refused(
    cluster_redis_url: str, tmp_path: Path
) -> None:
    s = get_settings(
        data_dir=tmp_path,
        redis_url=cluster_redis_url,
        redis_min_replicas=1,
        redis_replica_wait_ms=500,
    )
    with pytest.raises(ConfigError, match="below the Redis socket timeout"):
        RedisProvider(s, socket_timeout=0.15)


# --- the failover drill -------------------------------------------------------------------------


@pytest.fixture
def drill_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A private cluster: the drill kills one of its masters, so not the shared one."""
    if cluster_binaries() is None:
        pytest.skip("no redis-server/redis-cli binary for a private Redis Cluster")
    with LocalCluster(tmp_path / "cluster") as cluster:
        yield cluster


class Agent:
    """One agent session over HTTP, as a careful client behaves: an answer of 200 is
    acknowledged; a 503 is retried later with the same state; a 409 ``stale_state`` (an
    event applied though its answer was lost) re-fetches the latest state."""

    def __init__(self, http: httpx.Client, sid: str, t0: float) -> None:
        self.http, self.sid, self.t0 = http, sid, t0
        self.state: str = ""  # sealed
        self.step = 0  # the state's current step (the answers' clear session info)
        self.acked: list[int] = []
        self.log: list[tuple[float, str, int, str]] = []
        self.next_call = 0

    def _record(self, op: str, r: httpx.Response) -> None:
        err = "" if r.status_code == 200 else str(r.json().get("detail", ""))[:90]
        self.log.append((time.monotonic() - self.t0, op, r.status_code, err))

    def start(self) -> None:
        body = {"session_id": self.sid, "user_id": "u-1", "user_query": "check PUMP-0042"}
        r = self.http.post("/v1/sessions", json=body)
        assert r.status_code == 201, r.text
        self.state, self.step = r.json()["state"], r.json()["session"]["step"]

    def write(self) -> int:
        i = self.next_call
        event = {"type": "tool_call", "name": "read_sensor", "args": {"i": i}, "result": {"v": i}}
        r = self.http.post(
            f"/v1/sessions/{self.sid}/events", json={"state": self.state, "event": event}
        )
        self._record(f"write#{i}", r)
        if r.status_code == 200:
            self.state, self.step = r.json()["state"], r.json()["session"]["step"]
            self.acked.append(i)
            self.next_call += 1
        elif r.status_code == 409:
            self.refetch()
        else:
            assert r.status_code == 503, r.text
            assert r.headers.get("Retry-After"), r.headers
        return r.status_code

    def read(self) -> int:
        r = self.http.get(f"/v1/sessions/{self.sid}/state")
        self._record("read", r)
        return r.status_code

    def refetch(self) -> None:
        r = self.http.get(f"/v1/sessions/{self.sid}/state")
        self._record("refetch", r)
        if r.status_code == 200:
            self.state, self.step = r.json()["state"], r.json()["session"]["step"]
            # the event whose answer was lost was applied: continue after it
            self.next_call = max(self.next_call, int(self.step))

    def first(self, status: int, after: float = 0.0, op: str = "") -> float | None:
        return next(
            (t for t, o, s, _ in self.log if s == status and t >= after and o.startswith(op)),
            None,
        )


def _sid_on(cluster: LocalCluster, *, master: int | None, avoid: int | None = None) -> str:
    for _ in range(500):
        sid = f"t-{uuid.uuid4().hex[:12]}"
        port = cluster.master_port_for(f"wm:{{{sid}}}:index")
        if (master is None or port == master) and port != avoid:
            return sid
    raise AssertionError("no session id found on the wanted master")


@pytest.mark.slow
def test_failover_drill_through_the_service(drill_cluster: LocalCluster, tmp_path: Path) -> None:
    """SIGKILL the master holding a session; the agent sees 503 + Retry-After, then reads
    come back once the replica is promoted, then writes once a replica acknowledges again
    (``CTX_REDIS_MIN_REPLICAS=1``), and every acknowledged write is still there.

    What is guaranteed, and what is not: with ``CTX_REDIS_MIN_REPLICAS=1`` a 200 means the
    write reached the master *and* its replica, so losing the master alone loses nothing
    acknowledged (checked below, key by key). Without it (the default) Redis replication is
    asynchronous and the last writes a master acknowledged may be missing after a failover.
    The promoted replica has no replica of its own until the dead master returns, so writes
    to its slots are refused (503) in between: the price of the guarantee. The whole cluster
    refuses writes while the failed master's slots are uncovered (``cluster_state:fail``,
    Redis' default ``cluster-require-full-coverage yes``), so a bystander session on another
    master sees a short 503 window too; it is recorded, not required to be zero.
    """
    cluster = drill_cluster
    settings, keys = service_settings(
        tmp_path,
        cluster.plain_url,  # a plain redis:// URL: the provider must find the cluster itself
        redis_min_replicas=1,
        redis_replica_wait_ms=2000,  # see the min_replicas test: acks are usually < 1 ms
        service_redis_timeout_s=3.0,
        service_redis_connect_timeout_s=0.3,
    )
    seed = int(cluster.plain_url.rsplit(":", 1)[1].split("/")[0])
    sid = _sid_on(cluster, master=None, avoid=seed)  # keep the seed node alive: any works
    victim = cluster.master_port_for(f"wm:{{{sid}}}:index")
    replica = cluster.replica_ports_of(victim)[0]
    bystander_sid = _sid_on(cluster, master=None, avoid=victim)
    assert cluster.master_port_for(f"svc:{{{sid}}}:session") == victim  # one slot per session

    with (
        running_service(settings) as url,
        httpx.Client(base_url=url, headers={"X-API-Key": keys["agent-a"]}, timeout=20) as http,
    ):
        t0 = time.monotonic()
        agent, bystander = Agent(http, sid, t0), Agent(http, bystander_sid, t0)
        agent.start()
        bystander.start()
        for _ in range(5):
            assert agent.write() == 200 and bystander.write() == 200
        assert agent.read() == 200

        # --- the master goes down --------------------------------------------------------
        t_kill = time.monotonic() - t0
        cluster.kill(victim)
        t_promoted = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            agent.write()
            agent.read()
            bystander.write()
            if t_promoted is None and cluster.roles().get(replica) == "master":
                t_promoted = time.monotonic() - t0
            if t_promoted is not None and agent.first(200, after=t_promoted, op="read"):
                break
            time.sleep(0.1)
        assert t_promoted is not None, f"replica {replica} was never promoted: {agent.log}"
        t_read_ok = agent.first(200, after=t_kill, op="read")
        assert t_read_ok is not None, agent.log

        # promoted, but alone: a write cannot be acknowledged by a replica
        for _ in range(3):
            assert agent.write() == 503
            time.sleep(0.1)
        assert "ReplicaAckError" in agent.log[-1][3], agent.log[-1]

        # --- the old master comes back, as the new master's replica ----------------------
        t_restart = time.monotonic() - t0
        cluster.restart(victim)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and agent.write() != 200:
            time.sleep(0.2)
        t_write_ok = agent.first(200, after=t_restart, op="write")
        assert t_write_ok is not None, agent.log[-10:]
        assert cluster.roles()[victim] == "slave" and cluster.roles()[replica] == "master"
        for _ in range(3):
            assert agent.write() == 200
        final = agent.step

    # --- nothing acknowledged was lost ----------------------------------------------------------
    client = redis_client(cluster.url, decode_responses=True)
    try:
        sm = WorkingMemory(client, Gateway()).session(sid)
        for i in agent.acked:
            assert sm.get_api_response("read_sensor", {"i": i}).value == {"v": i}, i
        bm = WorkingMemory(client, Gateway()).session(bystander_sid)
        for i in bystander.acked:
            assert bm.get_api_response("read_sensor", {"i": i}).value == {"v": i}, i
    finally:
        client.close()
    assert final >= len(agent.acked)

    statuses = [(round(t, 2), op, s) for t, op, s, _ in agent.log if t >= t_kill]
    first_503 = agent.first(503, after=t_kill)
    assert first_503 is not None and first_503 < t_read_ok  # the outage was seen, then ended
    by_503 = [t for t, _, s, _ in bystander.log if s == 503]
    print(
        f"\nfailover drill: kill {t_kill:.2f}s, first 503 {first_503:.2f}s, replica promoted "
        f"by {t_promoted:.2f}s, first read 200 {t_read_ok:.2f}s, old master restarted "
        f"{t_restart:.2f}s, first write 200 {t_write_ok:.2f}s; acknowledged writes "
        f"{len(agent.acked)} (all present); bystander 503s {len(by_503)}"
        + (f" ({min(by_503):.2f}-{max(by_503):.2f}s)" if by_503 else "")
        + f"\n  agent 503 reasons: {sorted({d for t, _, s, d in agent.log if s == 503})}"
        + f"\n  agent log after the kill: {statuses}"
    )
