"""The files of a Confluence HTML export (a folder or a .zip), listed and read with hard bounds.

An export is untrusted input: a zip can hold a member that inflates to gigabytes from a few
kilobytes, name members ``../../etc/cron.d/x``, or lie in its headers. So this module:

* lists members without reading them, and reads each one only when the caller asks for it
  (one zip member in memory at a time; the ZipFile stays open for the whole iteration);
* reads through a stream, at most ``cap + 1`` bytes, counting the bytes actually produced:
  a member is over ``max_page_bytes`` when more bytes arrive than allowed, whatever its header
  claims (a header that already admits to being too big is refused without reading);
* counts every byte read from the export against ``max_export_bytes``; once that is spent,
  every later file is refused unread;
* refuses member names shaped for zip-slip (``..`` components, absolute paths, drive letters,
  backslashes): they are never extracted anyway, but they are never read either, and the
  report says why.

Refusals are reasons (strings), not exceptions: the reader turns them into ``Quarantined``
records so one hostile member never stops the good pages. Only an export that cannot be
opened at all raises :class:`IngestError`.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO

from context_core.errors import IngestError

__all__ = ["Export", "Member", "open_export", "read_capped", "unsafe_member_name"]

_CHUNK = 1024 * 1024
_PAGE_SUFFIXES = (".html", ".htm")
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True, slots=True)
class Member:
    """One file of the export, not yet read.

    ``name`` is relative to the export's root folder (the one holding index.html);
    ``display`` is what reports show (a file path, or ``<zip>!/<member>``); ``size`` is what
    the file system or the zip header declares (a hint only: reads are counted, not trusted);
    ``refused`` is set when the member must never be read.
    """

    name: str
    display: str
    mtime: float
    size: int | None
    refused: str | None = None
    ref: zipfile.ZipInfo | Path | None = None


def unsafe_member_name(name: str) -> str | None:
    """Why a zip member name is a zip-slip shape (None when it is an ordinary relative path).

    A backslash is refused outright rather than interpreted: on Windows it is a separator
    (``..\\..\\x``), elsewhere an ordinary character, and a genuine Confluence export never
    writes one.
    """
    if "\\" in name:
        return "backslash in the name"
    if "\x00" in name:
        return "NUL byte in the name"
    if name.startswith("/"):
        return "absolute path"
    if _DRIVE.match(name):
        return "drive-letter path"
    if ".." in name.split("/"):
        return "'..' path component"
    return None


def read_capped(stream: IO[bytes], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``stream``, read in chunks.

    Returning one byte more than allowed is how callers learn the source is too big without
    ever holding more than the cap (plus a byte) in memory: a zip member that inflates to
    1 GiB costs ``limit + 1`` bytes here, never its full size.
    """
    buf = bytearray()
    while len(buf) <= limit:
        chunk = stream.read(min(_CHUNK, limit + 1 - len(buf)))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def _declared_size(info: zipfile.ZipInfo) -> int | None:
    """The uncompressed size the zip header claims (a separate function so tests can make the
    reader ignore headers and prove the counted, streamed path holds on its own)."""
    return info.file_size


class Export:
    """An open export: its index.html (if any), its page files, and a byte budget.

    Use as a context manager (the zip stays open until it exits). :meth:`read` returns the
    bytes of a member or a refusal reason; it never raises for one bad member.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_page_bytes: int,
        max_export_bytes: int,
    ) -> None:
        self.path = path
        self.max_page_bytes = max_page_bytes
        self.max_export_bytes = max_export_bytes
        self.bytes_read = 0
        self.index: Member | None = None
        self.pages: list[Member] = []  # page files (and refused members), by name
        self._zip: zipfile.ZipFile | None = None
        if not path.exists():
            raise IngestError(f"export path {path} does not exist; pass a folder or .zip export")
        try:
            if path.is_file() and zipfile.is_zipfile(path):
                self._list_zip()
            elif path.is_dir():
                self._list_folder()
            else:
                raise IngestError(f"{path} is neither a folder nor a .zip Confluence export")
        except OSError as e:
            self.close()
            raise IngestError(f"cannot list export {path}: {e}") from e
        except BaseException:
            self.close()
            raise
        if not self.pages and self.index is None:
            self.close()
            raise IngestError(f"no .html pages in {path}; is this a Confluence HTML export?")

    # --- listing ---------------------------------------------------------------------------
    def _list_folder(self) -> None:
        base = self.path
        if not (base / "index.html").is_file():
            found = sorted(self.path.glob("*/index.html"))
            if len(found) == 1:
                base = found[0].parent
            else:
                names = [
                    p.relative_to(self.path).as_posix()
                    for pattern in ("*.htm*", "*/*.htm*")
                    for p in self.path.glob(pattern)
                    if p.suffix.lower() in _PAGE_SUFFIXES
                ]
                base = self.path / _single_page_dir(names)
        root = base.resolve()
        index = base / "index.html"
        if index.is_file():
            self.index = self._folder_member(index, root)
        for p in sorted(base.iterdir()):
            if p.name == "index.html" or p.suffix.lower() not in _PAGE_SUFFIXES:
                continue
            if p.is_file():
                self.pages.append(self._folder_member(p, root))

    @staticmethod
    def _folder_member(p: Path, root: Path) -> Member:
        refused = None
        if p.is_symlink() and not p.resolve().is_relative_to(root):
            refused = "symlink pointing outside the export; refused, never read"
        st = p.stat()
        return Member(p.name, str(p), st.st_mtime, st.st_size, refused, p)

    def _list_zip(self) -> None:
        try:
            zf = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise IngestError(f"cannot read zip export {self.path}: {e}") from e
        self._zip = zf
        safe: list[zipfile.ZipInfo] = []
        refused: list[Member] = []
        for info in zf.infolist():
            if info.is_dir():
                continue
            why = unsafe_member_name(info.filename)
            if why is None:
                safe.append(info)
                continue
            refused.append(
                Member(
                    info.filename,
                    f"{self.path}!/{info.filename}",
                    _zip_mtime(info),
                    None,
                    f"unsafe member name {info.filename!r} ({why}: a zip-slip shape); "
                    "refused, never read",
                )
            )
        indexes = sorted(
            (i for i in safe if i.filename.rsplit("/", 1)[-1] == "index.html"),
            key=lambda i: (i.filename.count("/"), i.filename),
        )
        if indexes:
            prefix = indexes[0].filename[: -len("index.html")]
            self.index = self._zip_member(indexes[0], "index.html")
        else:
            prefix = _single_page_dir(
                [i.filename for i in safe if i.filename.lower().endswith(_PAGE_SUFFIXES)]
            )
        pages = list(refused)
        for info in safe:
            rest = info.filename[len(prefix) :]
            if not info.filename.startswith(prefix) or "/" in rest or rest == "index.html":
                continue
            if rest.lower().endswith(_PAGE_SUFFIXES):
                pages.append(self._zip_member(info, rest))
        self.pages = sorted(pages, key=lambda m: m.display)

    def _zip_member(self, info: zipfile.ZipInfo, name: str) -> Member:
        return Member(
            name,
            f"{self.path}!/{info.filename}",
            _zip_mtime(info),
            _declared_size(info),
            None,
            info,
        )

    # --- reading ---------------------------------------------------------------------------
    def read(self, m: Member) -> bytes | str:
        """The member's bytes, or why it is refused (size caps, unsafe name, corrupt data)."""
        if m.refused:
            return m.refused
        remaining = self.max_export_bytes - self.bytes_read
        if remaining <= 0:
            return self._export_reason()
        if m.size is not None and m.size > self.max_page_bytes:
            kind = " uncompressed" if self._zip is not None else ""
            return (
                f"page is {m.size} bytes{kind}, over max_page_bytes={self.max_page_bytes} "
                "(raise CTX_MAX_PAGE_BYTES to ingest it)"
            )
        if m.size is not None and m.size > remaining:
            return self._export_reason(m.size)
        limit = min(self.max_page_bytes, remaining)
        try:
            data = self._read_raw(m, limit)
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:
            return f"corrupt zip member: {e}"
        except (RuntimeError, NotImplementedError) as e:  # encrypted / unknown compression
            return f"unreadable zip member: {e}"
        except OSError as e:
            return f"unreadable file: {e}"
        self.bytes_read += len(data)
        if len(data) > self.max_page_bytes:
            return (
                f"page is over max_page_bytes={self.max_page_bytes} "
                "(uncompressed; raise CTX_MAX_PAGE_BYTES to ingest it)"
            )
        if len(data) > remaining:
            return self._export_reason()
        return data

    def _read_raw(self, m: Member, limit: int) -> bytes:
        if isinstance(m.ref, zipfile.ZipInfo):
            assert self._zip is not None
            with self._zip.open(m.ref) as stream:
                return read_capped(stream, limit)
        with open(str(m.ref if m.ref is not None else m.display), "rb") as f:
            return read_capped(f, limit)

    def _export_reason(self, size: int | None = None) -> str:
        this = f"; this file alone is {size} bytes" if size is not None else ""
        return (
            f"export is over max_export_bytes={self.max_export_bytes} "
            f"({self.bytes_read} bytes already read{this}; raise CTX_MAX_EXPORT_BYTES to "
            "ingest the rest)"
        )

    # --- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None

    def __enter__(self) -> Export:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _single_page_dir(names: list[str]) -> str:
    """Where the pages of an export without index.html are: the root ("") when any page is
    there, else the one folder holding them (the export was zipped or copied with its folder),
    else the root. Returned as a prefix ending in "/" (or "")."""
    dirs = {n.rsplit("/", 1)[0] + "/" if "/" in n else "" for n in names}
    if "" in dirs or not dirs:
        return ""
    shallowest = min(d.count("/") for d in dirs)
    top = {d for d in dirs if d.count("/") == shallowest}
    return top.pop() if len(top) == 1 and shallowest == 1 else ""


def _zip_mtime(info: zipfile.ZipInfo) -> float:
    try:
        return datetime(*info.date_time, tzinfo=UTC).timestamp()
    except ValueError:  # a hostile header can carry month 0 or day 0
        return 0.0


def open_export(
    path: Path | str, *, max_page_bytes: int, max_export_bytes: int = 2 * 1024**3
) -> Export:
    """List a folder or zip export (reads no file content). Raises IngestError when the path
    does not exist, is neither a folder nor a zip, or holds no .html at all."""
    return Export(Path(path), max_page_bytes=max_page_bytes, max_export_bytes=max_export_bytes)
