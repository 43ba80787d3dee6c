"""The documentation site builds with ``--strict``, and every command it shows is tested.

Two checks, for two ways docs rot:

- ``mkdocs build --strict`` (what ``make docs`` runs) into a temporary directory: a broken
  link, a page missing from the nav, a docstring the API reference cannot render or a marker
  the generator does not know fails the build. The key pages, one API page per module found
  on disk, every ``Settings`` field and every route of the app must be in the output.
- Every command in a ``bash`` / ``console`` / ``shell`` block of ``docs/``, of ``README.md``
  and of ``CHANGELOG.md`` must be run by a test. A ``ctx`` subcommand invoked by a
  test (Typer's ``CliRunner`` or a subprocess, with every ``--option`` the page shows) is found
  automatically; anything else needs an entry in :data:`COVERED` naming the test(s) that run it
  and a string that test's source must contain. An entry that no longer matches a command, or
  whose test is gone, fails too, so the list cannot outlive what it vouches for.

The lifecycle table is generated from the code in the site (``docs/hooks.py``), so it cannot
drift; ``tests/test_readme.py`` runs the README's code example and compares its output.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHELL_LANGS = {"bash", "console", "shell", "sh"}


@dataclass(frozen=True)
class Covered:
    """Commands matching ``pattern`` (a regex, full match on the whitespace-normalised command)
    are run by ``tests``; each test's source contains ``needle``. ``note`` says what the test
    runs when it is not the command verbatim."""

    pattern: str
    tests: tuple[str, ...]
    needle: str
    note: str = ""


CI = ".ci/run"  # a "test" that is CI's own script: the needle must be in it

COVERED: tuple[Covered, ...] = (
    Covered(r"make test", (CI,), "make test", "CI's entry point runs the suite through it"),
    Covered(r"make lint", (CI,), "make lint"),
    Covered(r"make typecheck", (CI,), "make typecheck"),
    Covered(
        r"make docs",
        ("tests/test_docs.py::site",),  # the fixture every build test uses
        "--strict",
        "the same mkdocs build --strict the target runs",
    ),
    Covered(
        r"make run",
        (
            "tests/test_dags.py::test_knowledge_refresh_runs_end_to_end",
            "tests/test_eval_dags.py::test_threshold_calibration_dag_writes_thresholds",
            "tests/test_lifecycle.py::test_scripted_demo_session_runs_every_layer",
            "tests/test_eval_dags.py::test_context_health_report_dag_writes_the_report",
        ),
        "def test_",
        "STAGES ONLY: each of its four stages (refresh DAG, calibration, scripted session, "
        "reports) is run by one of these tests; no test runs `ctx run` end to end",
    ),
    Covered(
        r"ctx session-demo",
        ("tests/test_lifecycle.py::test_scripted_demo_session_runs_every_layer",),
        "run_demo",
        "runs context_app.demo.run_demo, the function the command prints",
    ),
    Covered(
        r"ctx airflow (refresh|up)",
        (
            "tests/test_airflow_deployment.py::test_triggered_refresh_matches_ctx_ingest",
            "tests/test_airflow_deployment.py::test_dags_are_parsed_by_the_dag_processor_into_postgres",
        ),
        "deployed",
        "a real deployment started by context_app.airflow_deploy, which both commands drive",
    ),
    Covered(
        r"ctx eval calibrate-beir \S+ --k \d+",
        ("tests/test_beir.py::test_calibrate_beir_cranfield_subset",),
        "calibrate_beir",
        "evaluation.beir.calibrate_beir on a Cranfield subset (needs ../shared/data)",
    ),
    Covered(
        r"ctx eval compare-retrieval \S+ --modes \S+",
        ("tests/test_retrieval_compare.py::test_compare_retrieval_on_a_cranfield_subset",),
        "compare_retrieval",
        "the comparison the command runs, on a Cranfield subset (needs ../shared/data)",
    ),
    Covered(
        r"ctx eval cer",
        ("tests/test_cer.py::test_compute_cer_reads_trace_files_written_by_the_trace_writer",),
        "compute_cer",
    ),
    Covered(
        r"ctx eval health",
        ("tests/test_health.py::test_health_report_is_idempotent_per_day_and_tracks_growth",),
        "health",
    ),
    Covered(
        r"python -m benchmarks\.service_capacity",
        ("tests/test_bench_service_capacity.py::test_cpu_per_endpoint_and_floors_real",),
        "sc.",
        "the benchmark's CPU phases and floors on a real service, not its campaign steps",
    ),
    Covered(
        r"python -m benchmarks\.loadtest_profiles",
        ("tests/test_bench_loadtest_profiles.py::test_one_real_step_and_drill_run_end_to_end",),
        "lp.main(",
        "one burst step and the slow-l3 drill on real campaigns, printed not written",
    ),
    Covered(
        r"make proto",
        ("tests/test_grpc_stubs.py::test_committed_stubs_match_the_proto",),
        "--grpc_python_out",
        "the same grpc_tools.protoc run on the same .proto, into a temp dir, compared",
    ),
    Covered(
        r"make compose-check",
        ("tests/test_compose.py::test_docker_compose_config_accepts_the_file",),
        '"config"',
        "the docker-compose config the target runs",
    ),
)


# --- the build ---------------------------------------------------------------------------------


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra has it)")
    pytest.importorskip("material", reason="mkdocs-material is not installed (the dev extra)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (the dev extra)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    return out


KEY_PAGES = [
    "index.html",
    "getting-started/index.html",
    "concepts/layers/index.html",
    "concepts/router/index.html",
    "concepts/gateway/index.html",
    "concepts/lifecycle/index.html",
    "agent-api/index.html",
    "operations/airflow/index.html",
    "operations/load-tests/index.html",
    "operations/scale-out/index.html",
    "operations/configuration/index.html",
    "security/index.html",
    "evaluation/index.html",
    "performance/index.html",
    "changelog/index.html",
    "api/index.html",
    "img/calibration_roc.png",
]


def test_site_builds_strict_with_every_key_page(site: Path) -> None:
    missing = [p for p in KEY_PAGES if not (site / p).is_file()]
    assert not missing, missing
    # the hook is a file under docs/, not a page of the site
    assert not list(site.rglob("hooks.py"))


def test_api_reference_has_a_rendered_page_per_module(site: Path) -> None:
    hooks = _hooks()
    modules = [m for p in hooks.PACKAGES for m in hooks.walk_modules(p)]
    assert "context_core.config" in modules and "context_app.service.app" in modules
    missing = [m for m in modules if not (site / "api" / m / "index.html").is_file()]
    assert not missing, missing
    router = (site / "api" / "context_core.routing.router" / "index.html").read_text(
        encoding="utf-8"
    )
    assert "ContextRouter" in router  # mkdocstrings rendered the members, not just a title


def test_configuration_reference_lists_every_setting(site: Path) -> None:
    from context_core.config import Settings

    page = (site / "operations" / "configuration" / "index.html").read_text(encoding="utf-8")
    missing = [n for n in Settings.model_fields if f"CTX_{n.upper()}" not in page]
    assert not missing, missing


def test_every_setting_says_what_it_does() -> None:
    """The configuration reference is generated from the field descriptions: a setting
    without one would be listed with an empty meaning."""
    from context_core.config import Settings

    bare = [f"CTX_{n.upper()}" for n, f in Settings.model_fields.items() if not f.description]
    assert not bare, f"settings without a description in context_core/config.py: {bare}"


def test_agent_api_lists_every_route(site: Path, tmp_path: Path) -> None:
    from context_app.service.app import create_app
    from context_core.config import get_settings

    page = (site / "agent-api" / "index.html").read_text(encoding="utf-8")
    spec = create_app(get_settings(data_dir=tmp_path / "ctx")).openapi()
    missing = [
        f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops
        if f"{m.upper()} {p}" not in page
    ]  # fmt: skip
    assert not missing, missing


def test_changelog_and_performance_are_included(site: Path) -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    newest = re.search(r"^## (\d{4}-\d{2}-\d{2})", changelog, re.M)
    assert newest, "CHANGELOG.md needs dated '## YYYY-MM-DD' sections, newest first"
    dates = re.findall(r"^## (\d{4}-\d{2}-\d{2})", changelog, re.M)
    assert dates == sorted(dates, reverse=True), "CHANGELOG.md: newest first"
    page = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    assert newest.group(1) in page
    perf = (site / "performance" / "index.html").read_text(encoding="utf-8")
    assert "gen:bench" not in perf and "Redis 7" in perf  # the sections were included


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README.md: link {target} (relative to the root)"


# --- every command shown is run by a test -----------------------------------------------------


def _doc_files() -> list[Path]:
    return [*sorted(DOCS.rglob("*.md")), ROOT / "CHANGELOG.md", ROOT / "README.md"]


def shell_commands(text: str) -> list[str]:
    """Commands of the shell blocks in Markdown ``text``: in ``console`` blocks the ``$``
    lines, elsewhere every line; comments dropped, continuations joined, blanks skipped."""
    out: list[str] = []
    for block in re.finditer(r"^```(\w+)[^\n]*\n(.*?)^```", text, re.M | re.S):
        if block.group(1) not in SHELL_LANGS:
            continue
        lines = block.group(2).replace("\\\n", " ").splitlines()
        for line in lines:
            line = line.strip()
            if block.group(1) == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            words = shlex.split(line, comments=True)
            if words:
                out.append(" ".join(words))
    return out


def test_shell_blocks_are_found() -> None:
    cmds = shell_commands("```bash\nmake run   # x\n\nctx a \\\n  --b c\n```\n```text\nno\n```\n")
    assert cmds == ["make run", "ctx a --b c"]
    assert shell_commands("```console\n$ ctx x\noutput\n```\n") == ["ctx x"]


def _ctx_paths() -> set[tuple[str, ...]]:
    """Every ``ctx`` subcommand path, from the Typer app itself."""
    import typer

    from context_app.cli import app

    paths: set[tuple[str, ...]] = set()

    def walk(cmd, prefix: tuple[str, ...]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            paths.add((*prefix, name))
            walk(sub, (*prefix, name))

    walk(typer.main.get_command(app), ())
    return paths


def _test_sources() -> dict[str, str]:
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "tests").glob("test_*.py"))
        if p.name != "test_docs.py"
    }


def auto_covered(command: str, sources: dict[str, str], paths: set[tuple[str, ...]]) -> str | None:
    """The test file that runs ``ctx <subcommand>`` with every option the command shows
    (through ``CliRunner().invoke(app, [...])``, ``[ctx, ...]`` or ``... app()", ...``)."""
    words = command.split()
    if not words or words[0] != "ctx":
        return None
    path: tuple[str, ...] = ()
    for word in words[1:]:
        if (*path, word) not in paths:
            break
        path = (*path, word)
    if not path:
        return None
    options = [w.split("=")[0] for w in words if w.startswith("--")]
    seq = r"\s*,\s*".join(f'"{re.escape(w)}"' for w in path)
    call = re.compile(rf'(?:\[\s*|\bctx\)?\s*,\s*|app\(\)"\s*,\s*){seq}(?!\w)')
    for name, src in sources.items():
        if call.search(src) and all(f'"{o}"' in src for o in options):
            return name
    return None


def _function_source(test: str) -> str:
    file, _, func = test.partition("::")
    path = ROOT / file
    assert path.is_file(), f"{test}: no such file"
    text = path.read_text(encoding="utf-8")
    if not func:
        return text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func:
            return ast.get_source_segment(text, node) or ""
    raise AssertionError(f"{test}: no test function {func!r} in {file}")


def test_covered_entries_name_tests_that_exist_and_contain_their_needle() -> None:
    for entry in COVERED:
        for test in entry.tests:
            assert entry.needle in _function_source(test), (
                f"{test} does not contain {entry.needle!r}: does it still run '{entry.pattern}'?"
            )


def test_every_docs_command_is_run_by_a_test() -> None:
    sources = _test_sources()
    paths = _ctx_paths()
    uncovered: list[str] = []
    used: set[str] = set()
    for doc in _doc_files():
        for command in shell_commands(doc.read_text(encoding="utf-8")):
            entry = next((c for c in COVERED if re.fullmatch(c.pattern, command)), None)
            if entry is not None:
                used.add(entry.pattern)
                continue
            if auto_covered(command, sources, paths) is None:
                uncovered.append(f"{doc.relative_to(ROOT)}: {command}")
    assert not uncovered, (
        "commands shown in the docs that no test runs (write the test, then add it to "
        "COVERED in tests/test_docs.py, or invoke the ctx command with its options in a test):\n"
        + "\n".join(uncovered)
    )
    stale = [c.pattern for c in COVERED if c.pattern not in used]
    assert not stale, f"COVERED entries matching no command in the docs: {stale}"


def test_an_untested_command_fails_the_check() -> None:
    sources = _test_sources()
    paths = _ctx_paths()
    assert auto_covered("ctx ingest some/export --allow-deletes", sources, paths)
    assert auto_covered("ctx ingest some/export --no-such-option", sources, paths) is None
    assert auto_covered("ctx frobnicate", sources, paths) is None
    assert not any(re.fullmatch(c.pattern, "make frobnicate") for c in COVERED)
