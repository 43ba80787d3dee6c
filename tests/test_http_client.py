"""The load generator's keep-alive HTTP/1.1 client against a scripted server on real sockets.

Each test server answers whatever the test scripts: well-formed answers of every framing the
client reads, a connection closed while idle, a server that hangs, and answers that are not
HTTP. What is checked: the bodies arrive whole, a request is retried only when the server
cannot have run it, every wait is bounded, and malformed answers are named.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pytest

from loadtests.http_client import MAX_HEAD, KeepAliveConnection, ProtocolError, service_endpoint

Handler = Callable[[socket.socket, "Server"], None]


class Server:
    """A loopback server running ``handler`` for each accepted connection (own thread)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[bytes] = []  # every complete request head + body, in order
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn, suppress(OSError):
            self.handler(conn, self)

    def read_request(self, conn: socket.socket) -> bytes | None:
        """One whole request (head and Content-Length body), or None at EOF."""
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return None
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += conn.recv(65536)
        req = head + b"\r\n\r\n" + rest[:length]
        self.requests.append(req)
        return req

    def close(self) -> None:
        self.sock.close()


@contextmanager
def serving(handler: Handler) -> Iterator[Server]:
    srv = Server(handler)
    try:
        yield srv
    finally:
        srv.close()


def keep_alive(answer: bytes, n: int = 100) -> Handler:
    def handler(conn: socket.socket, srv: Server) -> None:
        for _ in range(n):
            if srv.read_request(conn) is None:
                return
            conn.sendall(answer)

    return handler


def ok_json(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + b"content-length: %d\r\n" % len(body)
        + extra
        + b"\r\n"
        + body
    )


def test_keep_alive_reuses_one_connection_and_sends_the_body() -> None:
    with serving(keep_alive(ok_json(b'{"a":1}'))) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port)
        for i in range(5):
            r = c.request("POST", f"/v1/x/{i}", b'{"n":%d}' % i, b"X-API-Key: k\r\n")
            assert (r.status, r.body, r.header("Content-Type")) == (
                200,
                b'{"a":1}',
                "application/json",
            )
        c.close()
    assert c.connects == 1
    assert len(srv.requests) == 5
    first = srv.requests[0]
    assert first.startswith(b"POST /v1/x/0 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{srv.port}\r\n".encode() in first
    assert b"X-API-Key: k\r\n" in first and b"Content-Length: 7\r\n" in first
    assert first.endswith(b'\r\n\r\n{"n":0}')


def test_a_body_split_over_many_packets_arrives_whole() -> None:
    body = b"x" * 200_000

    def handler(conn: socket.socket, srv: Server) -> None:
        srv.read_request(conn)
        wire = ok_json(body)
        for i in range(0, len(wire), 7_001):
            conn.sendall(wire[i : i + 7_001])
            time.sleep(0.0005)

    with serving(handler) as srv:
        r = KeepAliveConnection("127.0.0.1", srv.port).request("GET", "/big")
    assert r.body == body


def test_chunked_and_read_to_close_bodies() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\nx-trailer: t\r\n\r\n"
    )
    with serving(keep_alive(chunked)) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port)
        assert c.request("GET", "/c").body == b"Wikipedia"
        assert c.request("GET", "/c").body == b"Wikipedia"  # the connection stays usable
        assert c.connects == 1

    def to_close(conn: socket.socket, srv: Server) -> None:
        srv.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        conn.shutdown(socket.SHUT_WR)

    with serving(to_close) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port)
        assert c.request("GET", "/").body == b"all of it"
        assert c.request("GET", "/").body == b"all of it"  # a new connection
        assert c.connects == 2


def test_connection_close_and_interim_answers() -> None:
    with serving(keep_alive(ok_json(b"{}", b"connection: close\r\n"), n=1)) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port)
        c.request("GET", "/")
        c.request("GET", "/")
        assert c.connects == 2  # the server said close: not reused
    answer = b"HTTP/1.1 100 Continue\r\n\r\n" + ok_json(b'{"ok":true}')
    with serving(keep_alive(answer)) as srv:
        r = KeepAliveConnection("127.0.0.1", srv.port).request("POST", "/", b"{}")
        assert (r.status, r.body) == (200, b'{"ok":true}')


def test_an_idle_connection_the_server_closed_is_retried_once_on_a_new_one() -> None:
    """uvicorn closes a keep-alive connection after 5 s idle: the next request finds it
    closed before any byte of an answer, so the server never ran it; sent again, it runs
    exactly once."""
    with serving(keep_alive(ok_json(b"{}"), n=1)) as srv:  # one answer per connection, then close
        c = KeepAliveConnection("127.0.0.1", srv.port)
        c.request("POST", "/first", b"{}")
        time.sleep(0.05)  # the server has closed its end by now
        r = c.request("POST", "/second", b"{}")
        assert r.status == 200
    assert c.connects == 2
    assert [q.split(b" ")[1] for q in srv.requests] == [b"/first", b"/second"]


def test_an_answer_cut_off_midway_is_an_error_and_never_resent() -> None:
    def handler(conn: socket.socket, srv: Server) -> None:
        srv.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")

    with serving(handler) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port)
        with pytest.raises(ConnectionError, match="closed the connection"):
            c.request("POST", "/once", b"{}")
        time.sleep(0.05)
    assert len(srv.requests) == 1  # the server ran it: not sent again


def test_a_server_that_never_answers_times_out() -> None:
    def hang(conn: socket.socket, srv: Server) -> None:
        srv.read_request(conn)
        time.sleep(2.0)

    with serving(hang) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port, network_timeout=0.3)
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError):
            c.request("GET", "/")
        assert time.perf_counter() - t0 < 1.5


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nabcde", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999\r\n\r\n", "over the"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nx: " + b"a" * (MAX_HEAD + 10), "response head longer"),
    ],
)
def test_answers_that_are_not_http_are_named(answer: bytes, reason: str) -> None:
    def handler(conn: socket.socket, srv: Server) -> None:
        srv.read_request(conn)
        conn.sendall(answer)
        time.sleep(0.5)

    with serving(handler) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port, network_timeout=2.0)
        with pytest.raises(ProtocolError, match=reason):
            c.request("GET", "/")
        assert c._sock is None  # dropped: the next request starts clean


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="timeouts must be positive"):
        KeepAliveConnection("127.0.0.1", 1, network_timeout=0)
    c = KeepAliveConnection("127.0.0.1", 1)
    with pytest.raises(ValueError, match="request path"):
        c.request("GET", "/a b")
    with pytest.raises(ValueError, match="request path"):
        c.request("GET", "/a\r\nX-Injected: 1")
    with pytest.raises(ConnectionRefusedError):
        KeepAliveConnection("127.0.0.1", _closed_port()).request("GET", "/")


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_service_endpoint_reads_locusts_host() -> None:
    assert service_endpoint("http://127.0.0.1:8080") == ("127.0.0.1", 8080, "")
    assert service_endpoint("http://svc/ctx/") == ("svc", 80, "/ctx")
    for bad, why in [
        (None, "no service URL"),
        ("", "no service URL"),
        ("https://svc:8443", "plain HTTP"),
        ("svc:8080", "plain HTTP"),
        ("http://svc:99999", "--host"),
    ]:
        with pytest.raises(ValueError, match=why):
            service_endpoint(bad)


def test_endless_interim_answers_and_stray_bytes_are_named() -> None:
    with serving(keep_alive(b"HTTP/1.1 100 Continue\r\n\r\n" * 50)) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port, network_timeout=2.0)
        with pytest.raises(ProtocolError, match="interim"):
            c.request("POST", "/", b"{}")
    # an answer longer than its Content-Length: the next exchange would read the rest
    with serving(keep_alive(ok_json(b"{}") + b"stray")) as srv:
        c = KeepAliveConnection("127.0.0.1", srv.port, network_timeout=2.0)
        assert c.request("GET", "/").body == b"{}"
        time.sleep(0.05)
        with pytest.raises(ProtocolError, match="5 unexpected bytes"):
            c.request("GET", "/")
        assert c.request("GET", "/").body == b"{}"  # a new connection, in step again
        assert c.connects == 2
