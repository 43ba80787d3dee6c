"""Every module imports cleanly, without I/O at import time.

Each package is imported in its own interpreter: Locust monkey-patches the standard library
(gevent) on import, and Airflow reads its config on import; neither may leak into this process.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str) -> list[str]:
    pkg_dir = ROOT / package.replace(".", "/")
    names = [package]
    for info in pkgutil.walk_packages([str(pkg_dir)], prefix=f"{package}."):
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("package", ["context_core", "evaluation", "loadtests"])
def test_every_module_imports(package: str, tmp_path: Path) -> None:
    modules = _modules(package)
    assert len(modules) >= 2, f"{package} has no modules"
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=tmp_path,  # no stray files written into the repo at import time
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert list(tmp_path.iterdir()) == [], "importing wrote files into the working directory"
