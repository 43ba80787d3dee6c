"""A client for ClamAV's daemon (``clamd``): ``PING``, ``VERSION`` and ``INSTREAM`` scans.

The protocol is small enough to speak directly (no client package): connect to clamd's
socket (``unix:///run/clamav/clamd.ctl`` or ``tcp://127.0.0.1:3310``), send a
NUL-terminated command with the ``z`` prefix, read one NUL-terminated reply. ``zINSTREAM``
is followed by the data in chunks, each a 4-byte big-endian length and that many bytes,
ended by a zero length; clamd answers ``stream: OK``, ``stream: <signature> FOUND`` or
``<message> ERROR`` (for instance ``INSTREAM size limit exceeded. ERROR`` past its
``StreamMaxLength``). One connection per command: clamd closes it after the reply.

Fail closed: anything but a clear ``OK`` or ``FOUND`` (connection refused, a timeout, a
torn or unknown reply) raises :class:`ScannerUnavailableError`, so a caller can never mistake
"not scanned" for "clean". ``timeout_s`` bounds every socket operation *and* the whole
command (a clamd that trickles bytes still ends in a timeout).
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from context_core import defaults
from context_core.errors import (
    ScannerLimitError,
    ScannerUnavailableError,
)

__all__ = [
    "ClamdScanner",
    "ScanVerdict",
    "Scanner",
    "ScannerLimitError",
    "ScannerUnavailableError",
    "parse_clamd_url",
]

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
MAX_REPLY_BYTES = 64 * 1024
_FOUND = re.compile(r"^stream: (?P<sig>.+) FOUND$")


@dataclass(frozen=True, slots=True)
class ScanVerdict:
    """One scan: ``signature`` names what was found (None = clean); ``engine`` is clamd's
    VERSION answer when it was asked, for the record."""

    signature: str | None
    engine: str = ""

    @property
    def clean(self) -> bool:
        return self.signature is None


class Scanner(Protocol):
    """What an upload needs from a scanner (:class:`ClamdScanner`, or a test double)."""

    def scan(self, data: bytes) -> ScanVerdict: ...


def parse_clamd_url(url: str) -> tuple[int, Any]:
    """``(address family, address)`` of ``unix:///path/clamd.sock`` or ``tcp://host:port``
    (port 3310 when omitted). A bare absolute path is a Unix socket too."""
    if url.startswith("/"):
        return socket.AF_UNIX, url
    parts = urlsplit(url)
    if parts.scheme == "unix":
        path = unquote(parts.netloc + parts.path)
        if not path:
            raise ValueError(f"clamd URL {url!r} names no socket path (unix:///path/clamd.sock)")
        return socket.AF_UNIX, path
    if parts.scheme == "tcp":
        if not parts.hostname:
            raise ValueError(f"clamd URL {url!r} names no host (tcp://127.0.0.1:3310)")
        return socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET, (
            parts.hostname,
            parts.port or 3310,
        )
    raise ValueError(
        f"clamd URL {url!r}: use unix:///path/clamd.sock or tcp://host:port (CTX_CLAMD_URL)"
    )


class ClamdScanner:
    """Scans bytes with a running clamd; one short-lived connection per command.

    ``url`` as :func:`parse_clamd_url` takes it; ``timeout_s`` bounds each whole command.
    Thread-safe (no shared connection).
    """

    def __init__(self, url: str, *, timeout_s: float = defaults.CLAMD_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0 (CTX_CLAMD_TIMEOUT_S)")
        self.url = url
        self.family, self.address = parse_clamd_url(url)
        self.timeout_s = float(timeout_s)

    def __repr__(self) -> str:
        return f"ClamdScanner({self.url!r}, timeout_s={self.timeout_s})"

    # --- commands ----------------------------------------------------------------------
    def ping(self) -> bool:
        """True when clamd answers PONG; raises :class:`ScannerUnavailableError` otherwise."""
        reply = self._command(b"zPING\0")
        if reply != "PONG":
            raise ScannerUnavailableError(f"the malware scanner answered PING with {reply[:80]!r}")
        return True

    def version(self) -> str:
        """clamd's VERSION line, e.g. ``ClamAV 1.4.6/27470/Mon Dec  1 09:00:00 2026``."""
        return self._command(b"zVERSION\0")

    def scan(self, data: bytes) -> ScanVerdict:
        """Stream ``data`` to clamd (``zINSTREAM``) and return its verdict.

        Raises :class:`ScannerLimitError` when clamd refuses the size, and
        :class:`ScannerUnavailableError` for every other failure: no verdict, no pass.
        """
        reply = self._command(b"zINSTREAM\0", data)
        if reply == "stream: OK":
            return ScanVerdict(None)
        m = _FOUND.match(reply)
        if m:
            return ScanVerdict(m.group("sig").strip())
        if "size limit" in reply.lower():
            raise ScannerLimitError(
                f"the file ({len(data)} bytes) is over the scanner's stream limit (clamd's "
                "StreamMaxLength); raise it in clamd.conf or lower CTX_UPLOAD_MAX_BYTES"
            )
        log.warning("clamd at %s could not scan %d bytes: %r", self.url, len(data), reply[:200])
        raise ScannerUnavailableError(
            f"the malware scanner could not scan the file: {reply[:200]!r}"
        )

    # --- transport ---------------------------------------------------------------------
    def _command(self, command: bytes, payload: bytes | None = None) -> str:
        """One command's reply; a failure is logged with the address (the error the client
        sees does not name it)."""
        try:
            return self._exchange(command, payload)
        except ScannerUnavailableError as e:
            log.warning("clamd at %s: %s", self.url, e)
            raise

    def _exchange(self, command: bytes, payload: bytes | None) -> str:
        deadline = time.monotonic() + self.timeout_s

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            return remaining

        send_error: OSError | None = None
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            try:
                sock.settimeout(left())
                sock.connect(self.address)
                sock.settimeout(left())
                sock.sendall(command)
                if payload is not None:
                    try:
                        self._stream(sock, payload, left)
                    except (BrokenPipeError, ConnectionResetError) as e:
                        # clamd stops reading past StreamMaxLength and says so: read that
                        send_error = e
                reply = self._read_reply(sock, left)
            except TimeoutError:
                raise ScannerUnavailableError(
                    f"the malware scanner (clamd) did not answer within {self.timeout_s:g} s "
                    "(CTX_CLAMD_TIMEOUT_S)"
                ) from None
            except OSError as e:
                raise ScannerUnavailableError(
                    f"the malware scanner (clamd) is unreachable ({type(e).__name__}); check "
                    "CTX_CLAMD_URL and that clamd runs"
                ) from e
        finally:
            sock.close()
        if not reply and send_error is not None:
            raise ScannerUnavailableError(
                "the malware scanner (clamd) closed the connection mid-stream "
                f"({type(send_error).__name__})"
            )
        if not reply:
            raise ScannerUnavailableError("the malware scanner (clamd) closed without an answer")
        return reply

    @staticmethod
    def _stream(sock: socket.socket, data: bytes, left: Any) -> None:
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            piece = view[start : start + CHUNK_BYTES]
            sock.settimeout(left())
            sock.sendall(struct.pack(">I", len(piece)))
            sock.sendall(piece)
        sock.settimeout(left())
        sock.sendall(struct.pack(">I", 0))

    @staticmethod
    def _read_reply(sock: socket.socket, left: Any) -> str:
        buf = bytearray()
        while b"\0" not in buf and len(buf) < MAX_REPLY_BYTES:
            sock.settimeout(left())
            try:
                got = sock.recv(4096)
            except ConnectionResetError:
                break
            if not got:
                break
            buf += got
        return bytes(buf).split(b"\0", 1)[0].decode("utf-8", "replace").strip()
