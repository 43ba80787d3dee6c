"""The layer contract (pyproject's ``[tool.importlinter]``, ARCHITECTURE.md) holds, and can fail.

``make lint`` runs ``lint-imports`` in CI; these tests run it too, once on the project and once
on a throw-away tree that breaks each contract, so a contract that no longer catches anything
(a renamed package, a typo in a layer) fails here instead of passing forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _config_text() -> str:
    """The importlinter part of the project's pyproject.toml, verbatim."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    start = text.index("[tool.importlinter]")
    end = text.index("\n[tool.", start + 1)
    return text[start:end]


def _run(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "NO_COLOR": "1"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_config_names_every_top_level_package() -> None:
    conf = tomllib.loads(_config_text())["tool"]["importlinter"]
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert set(conf["root_packages"]) == packages, (
        "every top-level package must sit in a layer; add the new one to "
        "[tool.importlinter] root_packages and to the layers contract"
    )


def test_the_project_keeps_its_layers() -> None:
    done = _run(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _library_parts() -> list[str]:
    """The ``context_core.*`` modules the contracts name (the library's layers)."""
    conf = tomllib.loads(_config_text())["tool"]["importlinter"]
    names: set[str] = set()
    for contract in conf["contracts"]:
        for entry in [*contract.get("layers", []), *contract.get("source_modules", [])]:
            names.update(n.strip() for n in entry.split("|"))
    return sorted(n for n in names if n.startswith("context_core."))


def _tree(tmp: Path, imports: dict[str, str]) -> Path:
    """Four stub packages named like the project's (the library with a stub of each part the
    contracts name), each importing what ``imports`` says (keyed by package, or by a library
    part such as ``context_core.routing``: its ``mod`` module)."""
    for pkg in ("context_app", "evaluation", "loadtests", "context_core", *_library_parts()):
        where = tmp.joinpath(*pkg.split("."))
        where.mkdir()
        (where / "__init__.py").write_text("", encoding="utf-8")
        (where / "mod.py").write_text(imports.get(pkg, ""), encoding="utf-8")
    (tmp / "pyproject.toml").write_text(_config_text(), encoding="utf-8")
    return tmp


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        {
            "context_app": "import evaluation.mod\nimport loadtests.mod\nimport fastapi\n",
            "evaluation": "import context_core.mod\n",
            "loadtests": "import context_core.mod\n",
        },
    )
    done = _run(tree)
    assert done.returncode == 0, done.stdout + done.stderr


def test_library_importing_the_app_is_refused(tmp_path: Path) -> None:
    done = _run(_tree(tmp_path, {"context_core": "import context_app.mod\n"}))
    assert done.returncode == 1, done.stdout
    assert "context_core.mod -> context_app.mod" in done.stdout


def test_evaluation_importing_load_tests_is_refused(tmp_path: Path) -> None:
    done = _run(_tree(tmp_path, {"evaluation": "import loadtests.mod\n"}))
    assert done.returncode == 1, done.stdout
    assert "evaluation.mod -> loadtests.mod" in done.stdout


def test_library_importing_a_web_framework_is_refused(tmp_path: Path) -> None:
    done = _run(_tree(tmp_path, {"context_core": "import fastapi\n"}))
    assert done.returncode == 1, done.stdout
    assert "the library holds no application framework BROKEN" in done.stdout


def test_library_layers_hold() -> None:
    """The stub tree has every part the library's layers contract names."""
    parts = _library_parts()
    assert "context_core.routing" in parts and "context_core.working_memory" in parts


def test_working_memory_importing_the_router_is_refused(tmp_path: Path) -> None:
    done = _run(
        _tree(tmp_path, {"context_core.working_memory": "import context_core.routing.mod\n"})
    )
    assert done.returncode == 1, done.stdout
    assert "the library's packages stand in layers BROKEN" in done.stdout
    assert "context_core.working_memory.mod -> context_core.routing.mod" in done.stdout


def test_routing_next_to_lifecycle_is_refused(tmp_path: Path) -> None:
    done = _run(_tree(tmp_path, {"context_core.routing": "import context_core.lifecycle.mod\n"}))
    assert done.returncode == 1, done.stdout
    assert "the library's packages stand in layers BROKEN" in done.stdout


def test_routing_opening_redis_itself_is_refused(tmp_path: Path) -> None:
    done = _run(_tree(tmp_path, {"context_core.routing": "import redis\n"}))
    assert done.returncode == 1, done.stdout
    assert "Redis is reached through the redis package and the L2 store, never directly BROKEN" in (
        done.stdout
    )


def test_both_images_copy_every_package() -> None:
    """A new top-level package missing from a Dockerfile builds an image that cannot start."""
    packages = tomllib.loads(_config_text())["tool"]["importlinter"]["root_packages"]
    for dockerfile in ("deploy/Dockerfile", "deploy/airflow.Dockerfile"):
        copied = {
            line.split()[-2].rstrip("/").split("/")[-1]
            for line in (ROOT / dockerfile).read_text(encoding="utf-8").splitlines()
            if line.startswith("COPY ")
        }
        missing = set(packages) - copied
        assert not missing, f"{dockerfile} does not COPY {sorted(missing)}"
