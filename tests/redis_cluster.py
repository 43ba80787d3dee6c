"""A private Redis Cluster on loopback ports, for tests, drills and benchmarks.

:class:`LocalCluster` starts ``masters * (1 + replicas)`` real ``redis-server`` processes
(cluster mode, no persistence, ``--cluster-node-timeout`` low so a failover takes about a
second or two), joins them with ``redis-cli --cluster create ... --cluster-yes``, waits
until every node reports ``cluster_state:ok`` and every replica's link to its master is up,
and kills them on :meth:`LocalCluster.stop`. It can also kill, pause and restart one node
(the failover drill), and tell which master holds a key.

Used by ``tests/conftest.py`` (the session-wide ``cluster_redis_url`` fixture) and
``tests/test_redis_cluster.py``; from a shell::

    python tests/redis_cluster.py /tmp/ctx-cluster     # prints the URL; Ctrl-C/SIGTERM stop it

The binary is ``$CTX_REDIS_SERVER`` or ``redis-server`` on ``PATH`` (Debian's
``/usr/bin/redis-server``); ``redis-cli`` is looked up next to it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

__all__ = ["ClusterNodeProc", "LocalCluster", "cluster_binaries", "redis_client"]


def redis_client(url: str, **kwargs: Any) -> Any:
    """A test's own client for ``url``: a ``RedisCluster`` for ``redis+cluster://`` /
    ``rediss+cluster://`` URLs, else a plain ``redis.Redis``. Typed ``Any``: the two answer
    the same command methods."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("redis+cluster", "rediss+cluster"):
        return RedisCluster.from_url(f"{scheme.split('+')[0]}://{rest}", **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def cluster_binaries() -> tuple[str, str] | None:
    """``(redis-server, redis-cli)`` paths, or ``None`` when either is missing."""
    server = os.environ.get("CTX_REDIS_SERVER") or shutil.which("redis-server")
    if not server or not os.access(server, os.X_OK):
        return None
    cli = str(Path(server).with_name("redis-cli"))
    if not os.access(cli, os.X_OK):
        found = shutil.which("redis-cli")
        if not found:
            return None
        cli = found
    return server, cli


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(n: int) -> list[int]:
    """``n`` ports whose cluster bus port (+10000) is free as well."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    out: list[int] = []
    while len(out) < n:
        p = rng.randrange(20_000, 55_000)
        if p in out or p + 10_000 in out or p - 10_000 in out:
            continue
        if _port_free(p) and _port_free(p + 10_000):
            out.append(p)
    return out


@dataclass
class ClusterNodeProc:
    """One redis-server process of the cluster (its directory keeps ``nodes.conf``)."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    def client(self, **kw: object) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, socket_timeout=2, **kw
        )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    """See the module doc. ``start()`` / ``stop()``, or use it as a context manager."""

    workdir: Path
    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    nodes: list[ClusterNodeProc] = field(default_factory=list)
    _binaries: tuple[str, str] | None = None

    # --- lifetime ----------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        binaries = cluster_binaries()
        if binaries is None:
            raise FileNotFoundError("no redis-server/redis-cli binary (set CTX_REDIS_SERVER)")
        self._binaries = binaries
        total = self.masters * (1 + self.replicas)
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for port in _free_ports(total):
                node = ClusterNodeProc(port, self.workdir / str(port))
                node.workdir.mkdir(parents=True, exist_ok=True)
                self.nodes.append(node)
                self._spawn(node)
            for node in self.nodes:
                self._wait_ping(node, deadline=time.monotonic() + 15)
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            create = [binaries[1], "--cluster", "create", *addrs]
            create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            out = subprocess.run(create, capture_output=True, text=True, timeout=60, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, node: ClusterNodeProc) -> None:
        assert self._binaries is not None
        args = [self._binaries[0], "--port", str(node.port), "--bind", "127.0.0.1"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        args += ["--save", "", "--appendonly", "no", "--dir", str(node.workdir)]
        args += ["--protected-mode", "no", "--daemonize", "no"]
        with (node.workdir / "server.log").open("ab") as log:
            node.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    @staticmethod
    def _wait_ping(node: ClusterNodeProc, *, deadline: float) -> None:
        while True:
            try:
                c = node.client()
                try:
                    if c.ping():
                        return
                finally:
                    c.close()
            except (redis.RedisError, OSError):
                pass
            if node.proc is not None and node.proc.poll() is not None:
                log = (node.workdir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on {node.port} died at start:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on {node.port} did not answer PING")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill every node (SIGKILL: no persistence to flush) and wait for them."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
                node.proc.kill()
        for node in self.nodes:
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=10)
                node.proc = None

    def __enter__(self) -> LocalCluster:
        return self.start() if not self.nodes else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- state -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``redis+cluster://`` URL of a live node (any node is a valid seed)."""
        node = next((n for n in self.nodes if n.alive), self.nodes[0])
        return f"redis+cluster://127.0.0.1:{node.port}/0"

    @property
    def plain_url(self) -> str:
        """``redis://`` URL of a live node: the provider must detect the cluster by itself."""
        node = next((n for n in self.nodes if n.alive), self.nodes[0])
        return f"redis://127.0.0.1:{node.port}/0"

    def node(self, port: int) -> ClusterNodeProc:
        return next(n for n in self.nodes if n.port == port)

    def roles(self) -> dict[int, str]:
        """``port -> "master" | "slave"`` of every live node, as each node reports itself."""
        out: dict[int, str] = {}
        for n in self.nodes:
            if not n.alive:
                continue
            c = n.client(decode_responses=True)
            try:
                out[n.port] = str(c.info("replication")["role"])
            except (redis.RedisError, OSError):
                pass
            finally:
                c.close()
        return out

    def master_port_for(self, key: str) -> int:
        """Port of the master currently serving ``key``'s slot (asked of the cluster)."""
        c = self.client()
        try:
            node = c.get_node_from_key(key)
            assert node is not None
            return int(node.port)
        finally:
            c.close()

    def replica_ports_of(self, master_port: int) -> list[int]:
        c = self.node(master_port).client(decode_responses=True)
        try:
            info = c.info("replication")
        finally:
            c.close()
        return [
            int(v["port"]) for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()
        ]

    def client(self, **kw: object) -> RedisCluster:
        node = next(n for n in self.nodes if n.alive)
        kw.setdefault("socket_connect_timeout", 1.0)
        kw.setdefault("socket_timeout", 2.0)
        return RedisCluster(host="127.0.0.1", port=node.port, **kw)  # type: ignore[arg-type]

    def healthy(self) -> tuple[bool, str]:
        """Every live node says ``cluster_state:ok`` and knows all slots; every replica's link
        is up and it has caught up with its master's offset."""
        live = [n for n in self.nodes if n.alive]
        if not live:
            return False, "no live node"
        for n in live:
            c = n.client(decode_responses=True)
            try:
                info = c.cluster("info")
                if info.get("cluster_state") != "ok":
                    return False, f"{n.port}: cluster_state={info.get('cluster_state')}"
                if int(info.get("cluster_slots_ok", 0)) != 16384:
                    return False, f"{n.port}: slots_ok={info.get('cluster_slots_ok')}"
                rep = c.info("replication")
                if rep.get("role") == "slave" and rep.get("master_link_status") != "up":
                    return False, f"{n.port}: master link {rep.get('master_link_status')}"
            except (redis.RedisError, OSError) as e:
                return False, f"{n.port}: {type(e).__name__}: {e}"
            finally:
                c.close()
        return True, "ok"

    def wait_healthy(self, timeout_s: float = 60.0) -> float:
        """Block until :meth:`healthy`; returns the seconds waited."""
        t0 = time.monotonic()
        why = ""
        while time.monotonic() - t0 < timeout_s:
            ok, why = self.healthy()
            if ok:
                return time.monotonic() - t0
            time.sleep(0.1)
        raise TimeoutError(f"cluster not healthy after {timeout_s:.0f} s: {why}")

    # --- faults ------------------------------------------------------------------------------
    def kill(self, port: int) -> None:
        """SIGKILL one node (a crashed host: no goodbye to the cluster, nothing flushed)."""
        node = self.node(port)
        assert node.proc is not None
        node.proc.kill()
        node.proc.wait(timeout=10)
        node.proc = None

    def restart(self, port: int) -> None:
        """Start a killed node again on its port and directory: its ``nodes.conf`` makes it
        rejoin, and a master whose slots were taken over comes back as a replica."""
        node = self.node(port)
        assert node.proc is None, f"node {port} is still running"
        self._spawn(node)
        self._wait_ping(node, deadline=time.monotonic() + 15)


def _main() -> None:  # pragma: no cover - manual use
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ctx-redis-cluster")
    # SIGTERM (and SIGINT, ignored in background jobs of a script) stop the nodes too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    cluster = LocalCluster(workdir).start()
    print(cluster.url, flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":  # pragma: no cover
    _main()
