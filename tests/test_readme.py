"""The README's code example runs as shown and prints what the README says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> tuple[str, str]:
    text = README.read_text(encoding="utf-8")
    m = re.search(r"^```python\n(.*?)^```\n\n```text\n(.*?)^```", text, re.M | re.S)
    assert m, "README.md: the code example (a python block followed by its text output) is gone"
    return m.group(1), m.group(2)


def test_readme_example_prints_what_the_readme_shows(redis_url: str, tmp_path: Path) -> None:
    code, shown = _example()
    env = {
        **os.environ,
        "CTX_REDIS_URL": redis_url,
        "CTX_DATA_DIR": str(tmp_path / "ctx"),
        "CTX_REPORTS_DIR": str(tmp_path / "reports"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == shown.splitlines()
