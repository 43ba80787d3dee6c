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
