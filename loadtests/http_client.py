"""The load generator's HTTP/1.1 client: one keep-alive connection per simulated agent.

Locust's ``FastHttpUser`` goes through geventhttpclient's user-agent layer on every request
(a cookie jar, URL parsing and joining, header objects merged twice, a liveness ``select``
on the pooled socket): about 0.27 CPU-ms per request here, against 0.06 for this client on
the same loop (the campaign's generator shares the service's two cores, so every CPU-ms it
spends is one the service under test does not get). An agent needs much less: one
connection, requests whose head it builds itself, and answers the context service gives
(``Content-Length`` bodies; ``chunked`` and read-to-close are understood too).

Under Locust the process is monkey-patched by gevent, so the plain ``socket`` calls here yield
to the other users. Nothing here imports Locust.

Bounded, and loud when the server misbehaves: a response head over :data:`MAX_HEAD` bytes, a
body over :data:`MAX_BODY`, a malformed status line or length raise :class:`ProtocolError`;
the socket timeout (``network_timeout``) bounds every wait. A request sent on a kept-alive
connection that the server had already closed (uvicorn closes idle ones after 5 s) is sent
once more on a new connection, as browsers and urllib3 do: the server closed it without
reading the request, so nothing ran twice. A connection that fails any other way is
dropped, and the error goes to the caller.
"""

from __future__ import annotations

import socket
import urllib.parse
from dataclasses import dataclass

__all__ = [
    "MAX_BODY",
    "MAX_HEAD",
    "KeepAliveConnection",
    "ProtocolError",
    "Response",
    "service_endpoint",
]

#: Largest response head accepted (status line and headers).
MAX_HEAD = 64 * 1024
#: Largest response body accepted.
MAX_BODY = 32 * 1024 * 1024
#: Interim (1xx) answers accepted before the final one.
MAX_INTERIM = 8
_RECV = 65536


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 this client can read (the reason says why)."""


class _ClosedError(ConnectionError):
    """The peer closed the connection before a complete response."""


@dataclass(frozen=True, slots=True)
class Response:
    """Status, headers (lower-cased names, as sent values) and body of one answer."""

    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


class KeepAliveConnection:
    """One persistent HTTP/1.1 connection to ``host:port`` (opened on first use).

    Not shared between greenlets or threads: each agent owns one.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connection_timeout: float = 5.0,
        network_timeout: float = 10.0,
    ) -> None:
        if connection_timeout <= 0 or network_timeout <= 0:
            raise ValueError(
                f"timeouts must be positive: connection_timeout={connection_timeout}, "
                f"network_timeout={network_timeout}"
            )
        self.host, self.port = host, port
        self.connection_timeout = connection_timeout
        self.network_timeout = network_timeout
        self._host_header = f"Host: {host}:{port}\r\n".encode("latin-1")
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._got_bytes = False  # any byte of the current answer arrived
        self.connects = 0  # connections opened (tests and the curious)

    # --- the connection ----------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.connection_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.network_timeout)
        self._sock = sock
        self._buf.clear()
        self.connects += 1
        return sock

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._buf.clear()
        if sock is not None:
            sock.close()

    # --- one exchange ------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: bytes = b"",
    ) -> Response:
        """Send one request and read its whole answer.

        ``headers``: further header lines, already encoded, each ending in CRLF (``Host`` and,
        with a body, ``Content-Length`` are added here). Raises ``OSError`` (``TimeoutError``
        included) or :class:`ProtocolError`; the connection is closed then, and the next
        request opens a new one.
        """
        if not path.startswith("/") or any(c in path for c in " \r\n"):
            raise ValueError(f"request path must start with / and hold no space or CR/LF: {path!r}")
        if self._buf:  # the server sent more than its last answer: the stream is out of step
            n = len(self._buf)
            self.close()
            raise ProtocolError(f"{n} unexpected bytes after the previous answer")
        head = bytearray(f"{method} {path} HTTP/1.1\r\n".encode("latin-1"))
        head += self._host_header
        head += headers
        if body is not None:
            head += b"Content-Length: %d\r\n" % len(body)
        head += b"\r\n"
        if body:
            head += body
        payload = bytes(head)
        for attempt in (0, 1):
            reused = self._sock is not None
            sock = self._sock if self._sock is not None else self._connect()
            self._got_bytes = False
            try:
                sock.sendall(payload)
                return self._read_response(method, sock)
            except (_ClosedError, ConnectionResetError, BrokenPipeError):
                self.close()
                # a kept-alive connection the server had closed: the request never ran
                if reused and attempt == 0 and not self._got_bytes:
                    continue
                raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _fill(self, sock: socket.socket) -> None:
        data = sock.recv(_RECV)
        if not data:
            raise _ClosedError("the server closed the connection before a complete response")
        self._got_bytes = True
        self._buf += data

    def _read_response(self, method: str, sock: socket.socket) -> Response:
        for _ in range(MAX_INTERIM + 1):
            status, headers = self._read_head(sock)
            if not 100 <= status < 200:  # else an interim answer (100 Continue): more follows
                return self._read_body(method, sock, status, headers)
        raise ProtocolError(f"more than {MAX_INTERIM} interim (1xx) answers to one request")

    def _read_head(self, sock: socket.socket) -> tuple[int, dict[str, str]]:
        buf = self._buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > MAX_HEAD:
                raise ProtocolError(f"response head longer than {MAX_HEAD} bytes")
            self._fill(sock)
        if end > MAX_HEAD:
            raise ProtocolError(f"response head longer than {MAX_HEAD} bytes")
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        del buf[: end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ProtocolError(f"malformed header line: {line[:80]!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return status, headers

    def _read_body(
        self, method: str, sock: socket.socket, status: int, headers: dict[str, str]
    ) -> Response:
        conn_tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._read_chunked(sock)
        elif "content-length" in headers:
            body = self._read_exact(sock, _length(headers["content-length"]))
        else:  # no length: the body runs to the end of the connection
            body = self._read_to_close(sock)
            conn_tokens.add("close")
        if "close" in conn_tokens:
            self.close()
        return Response(status, headers, body)

    def _read_exact(self, sock: socket.socket, n: int) -> bytes:
        if n > MAX_BODY:
            raise ProtocolError(f"response body of {n} bytes is over the {MAX_BODY}-byte limit")
        buf = self._buf
        while len(buf) < n:
            self._fill(sock)
        body = bytes(buf[:n])
        del buf[:n]
        return body

    def _read_line(self, sock: socket.socket) -> bytes:
        buf = self._buf
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > MAX_HEAD:
                raise ProtocolError("chunk header line too long")
            self._fill(sock)
        line = bytes(buf[:end])
        del buf[: end + 2]
        return line

    def _read_chunked(self, sock: socket.socket) -> bytes:
        out = bytearray()
        while True:
            size_text = self._read_line(sock).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            if size < 0 or len(out) + size > MAX_BODY:
                raise ProtocolError(f"chunked body over the {MAX_BODY}-byte limit")
            if size == 0:
                while self._read_line(sock):  # trailers, up to the empty line
                    pass
                return bytes(out)
            out += self._read_exact(sock, size)
            if self._read_exact(sock, 2) != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")

    def _read_to_close(self, sock: socket.socket) -> bytes:
        buf = self._buf
        while True:
            data = sock.recv(_RECV)
            if not data:
                body = bytes(buf)
                buf.clear()
                return body
            buf += data
            if len(buf) > MAX_BODY:
                raise ProtocolError(f"response body over the {MAX_BODY}-byte limit")


def _length(text: str) -> int:
    values = {v.strip() for v in text.split(",")}
    if len(values) != 1 or not (v := values.pop()).isdigit():
        raise ProtocolError(f"bad Content-Length {text[:40]!r}")
    return int(v)


def service_endpoint(host: str | None) -> tuple[str, int, str]:
    """(host name, port, path prefix) of Locust's ``--host`` (``http://HOST[:PORT][/PREFIX]``);
    ValueError naming the option otherwise."""
    if not host:
        raise ValueError("no service URL: pass --host http://HOST:PORT (the context service)")
    url = urllib.parse.urlsplit(host)
    if url.scheme != "http" or not url.hostname:
        raise ValueError(
            f"--host {host!r}: the load generator speaks plain HTTP to the service, give "
            "http://HOST[:PORT] (put TLS in front of the service, not in the campaign)"
        )
    try:
        port = url.port or 80
    except ValueError as e:
        raise ValueError(f"--host {host!r}: {e}") from None
    return url.hostname, port, url.path.rstrip("/")
