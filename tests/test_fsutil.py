"""atomic_write_text / atomic_write_bytes: whole files, plain modes, no temp files left over."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from context_core.fsutil import atomic_write_bytes, atomic_write_text


def test_writes_replace_the_file_and_leave_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "thresholds.json"
    assert atomic_write_text(target, '{"accept": 0.7}\n') == target
    assert target.read_text(encoding="utf-8") == '{"accept": 0.7}\n'
    atomic_write_bytes(target, "密码\r\n".encode())
    assert target.read_bytes() == "密码\r\n".encode()  # bytes as given, no newline translation
    assert sorted(p.name for p in target.parent.iterdir()) == ["thresholds.json"]


def test_mode_is_what_a_plain_open_gives_unless_asked(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("x", encoding="utf-8")
    atomic = atomic_write_text(tmp_path / "atomic.txt", "x")
    assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    private = atomic_write_text(tmp_path / "private.txt", "x", mode=0o600)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_concurrent_writers_each_leave_a_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "history.jsonl"
    bodies = [(f"writer {i}\n" * 2000) for i in range(8)]
    errors: list[BaseException] = []

    def write(body: str) -> None:
        try:
            for _ in range(20):
                atomic_write_text(target, body, durable=False)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_text(encoding="utf-8") in bodies
    assert [p.name for p in tmp_path.iterdir()] == ["history.jsonl"]


def test_a_failed_write_keeps_the_old_content(tmp_path: Path) -> None:
    target = atomic_write_text(tmp_path / "summary.json", "old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(target, "new \udc80", encoding="utf-8")
    with pytest.raises(TypeError):  # fails after the temp file exists: it is removed
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


# ---- JSON-lines files: locked appends, crash-safe filtering ----------------------------------


def test_filter_lines_loses_no_line_a_concurrent_appender_writes(tmp_path: Path) -> None:
    """An appender thread writes 2,000 lines while the file is filtered again and again: every
    line it wrote that the filter keeps is in the file at the end, in order, none torn, and
    only the lines the filter drops are gone; no temporary file is left."""
    from context_core.fsutil import append_line, filter_lines

    path = tmp_path / "audit" / "audit.jsonl"
    for i in range(500):
        append_line(path, f'{{"i": {i}, "drop": {str(i % 2 == 0).lower()}}}')
    written: list[int] = []
    stop = threading.Event()

    def appender() -> None:
        for i in range(500, 2500):
            append_line(path, f'{{"i": {i}, "drop": false}}')
            written.append(i)
        stop.set()

    t = threading.Thread(target=appender)
    t.start()
    removed = 0
    passes = 0
    while not stop.is_set() or passes == 0:
        removed += filter_lines(path, lambda raw: b'"drop": true' not in raw)
        passes += 1
    t.join()
    lines = path.read_bytes().splitlines()
    ids = [int(x.split(b'"i": ')[1].split(b",")[0]) for x in lines]
    assert removed == 250 and passes >= 1
    assert ids == [i for i in range(500) if i % 2] + written
    assert sorted(p.name for p in path.parent.iterdir()) == [".audit.jsonl.lock", "audit.jsonl"]


def test_filter_lines_keeps_a_torn_last_line_and_the_mode(tmp_path: Path) -> None:
    from context_core.fsutil import append_line, filter_lines

    path = tmp_path / "q.jsonl"
    append_line(path, "keep 1", mode=0o600)
    append_line(path, "drop 2")
    with path.open("ab") as fh:
        fh.write(b"keep 3 (being written")
    assert filter_lines(path, lambda raw: not raw.startswith(b"drop")) == 1
    assert path.read_bytes() == b"keep 1\nkeep 3 (being written"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.stat().st_ino
    assert filter_lines(path, lambda raw: True) == 0 and path.stat().st_ino == before
    assert filter_lines(tmp_path / "missing.jsonl", lambda raw: False) == 0
