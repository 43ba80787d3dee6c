"""The data inventory names every writer: a new Redis key family, file-writing module, L3
payload field, PostgreSQL table or collection without an entry fails here.

The scanners read the source (``ast``), so they see writers no test exercises; each is shown
to catch a planted writer (``test_scanner_catches_*``). ``tests/test_data_lifecycle.py``
checks the same at run time: after planting data through every write path, every Redis key,
file and payload field it finds must match an entry.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from context_core.config import Settings
from context_core.governance.inventory import INVENTORY, render_table

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("context_core", "context_app", "evaluation", "loadtests", "benchmarks", "dags")

# Strings shaped like a key family that are not Redis keys (each with why).
NOT_KEYS = {
    "baseline": "a namespace *entry* name template (routing/intents.py), under ns:{<name>}:kv:",
    "admin": "the Airflow admin user's name pair in the deployment's login (airflow_deploy.py)",
    "audit": "the suffix of cmp:{org:<org>}:audit:user:* in a SCAN pattern (compliance.py)",
    "bundles": "the suffix of wm:{<sid>}:bundles:recent (working_memory/keys.py)",
    "hot": "a log/feedback label (ingest/hot.py)",
    "system": "the system trust scope `system:local` (an L3 payload value)",
    "xlink": "an SVG attribute name (gateway/output.py)",
}
_FAMILY = re.compile(r"^([a-z][a-z_]*):(\{|[a-z_]+)")
_WRITE_CALLS = {
    "write_text",
    "write_bytes",
    "atomic_write_text",
    "atomic_write_bytes",
    "savefig",
    "to_csv",
    "to_parquet",
    "copy2",
    "copyfile",
    "copytree",
    "fdopen",
}


def _modules(root: Path, packages: tuple[str, ...]) -> list[tuple[str, Path]]:
    out = []
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            rel = p.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append((".".join(parts), p))
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            ids.add(id(body[0].value))
    return ids


def _constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant):
            for t in n.targets:
                if isinstance(t, ast.Name) and isinstance(n.value.value, str):
                    out[t.id] = n.value.value
    return out


def key_families(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Family -> modules: string literals and f-strings that start like ``<family>:{`` or
    ``<family>:<word>`` (a module constant as the f-string's head is resolved)."""
    found: dict[str, set[str]] = {}
    for mod, path in _modules(root, packages):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs, consts = _docstrings(tree), _constants(tree)
        for n in ast.walk(tree):
            text = None
            if isinstance(n, ast.JoinedStr) and n.values:
                head = n.values[0]
                if isinstance(head, ast.Constant):
                    text = str(head.value)
                elif (
                    isinstance(head, ast.FormattedValue)
                    and isinstance(head.value, ast.Name)
                    and head.value.id in consts
                    and len(n.values) > 1
                    and isinstance(n.values[1], ast.Constant)
                ):
                    text = consts[head.value.id] + str(n.values[1].value) + "x"
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                text = n.value
            if text and (m := _FAMILY.match(text)):
                found.setdefault(m.group(1), set()).add(mod)
    return found


def _mode(call: ast.Call, index: int) -> str | None:
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    if len(call.args) > index and isinstance(call.args[index], ast.Constant):
        return str(call.args[index].value)
    return None


def file_writers(root: Path, packages: tuple[str, ...]) -> set[str]:
    """Modules that write files: the write helpers above, ``open`` with a w/a/x mode,
    ``os.open`` with O_WRONLY/O_RDWR/O_CREAT."""
    out = set()
    for mod, path in _modules(root, packages):
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in _WRITE_CALLS:
                out.add(mod)
            elif name == "open":
                is_os = isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "os"
                if is_os:
                    flags = ast.dump(n)
                    if any(x in flags for x in ("O_WRONLY", "O_RDWR", "O_CREAT")):
                        out.add(mod)
                    continue
                mode = _mode(n, 0 if isinstance(f, ast.Attribute) else 1)
                if mode and any(c in mode for c in "wax+"):
                    out.add(mod)
    return out


def payload_fields(root: Path) -> set[str]:
    """Keys of the L3 payloads built in knowledge/ and ingest/: dict literals bound to
    ``payload``, ``payload[...] =``, ``payload.update(k=...)``, and ``ChunkPayload``'s fields."""
    from context_core.ingest.refresh_plan import ChunkPayload

    out = {f.name for f in dataclasses.fields(ChunkPayload)}
    for _, path in _modules(root, ("context_core/knowledge", "context_core/ingest")):
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            target, value = None, None
            if isinstance(n, ast.AnnAssign):
                target, value = n.target, n.value
            elif isinstance(n, ast.Assign) and len(n.targets) == 1:
                target, value = n.targets[0], n.value
            if (
                isinstance(target, ast.Name)
                and target.id == "payload"
                and isinstance(value, ast.Dict)
            ):
                out |= {k.value for k in value.keys if isinstance(k, ast.Constant)}
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id == "payload"
                and isinstance(target.slice, ast.Constant)
            ):
                out.add(str(target.slice.value))
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "update"
                and getattr(n.func.value, "id", "") == "payload"
            ):
                out |= {kw.arg for kw in n.keywords if kw.arg}
    return out


def pg_tables(root: Path) -> set[str]:
    tables = set()
    for _, path in _modules(root, ("context_core", "context_app")):
        text = path.read_text(encoding="utf-8")
        tables |= set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?[\w{}]+\.(\w+)", text))
    return tables


# --- the repository's writers all have an entry ---------------------------------------------------


def _declared(attr: str) -> set[str]:
    return {x for e in INVENTORY for x in getattr(e, attr)}


def test_every_redis_key_family_has_an_entry() -> None:
    found = key_families(ROOT, PACKAGES)
    assert {"wm", "pref", "cmp", "svc", "ns", "ctx", "embcache"} <= set(found)  # scanner works
    missing = {f: sorted(m) for f, m in found.items() if f not in _declared("families")}
    missing = {f: m for f, m in missing.items() if f not in NOT_KEYS}
    assert not missing, f"Redis key families without an inventory entry: {missing}"


def test_every_file_writing_module_has_an_entry() -> None:
    writers = file_writers(ROOT, PACKAGES)
    assert {"context_core.traces", "context_core.ingest.upload"} <= writers  # scanner works
    # modules that only write where a caller tells them (tests, atomic-write helpers) count too:
    missing = sorted(writers - _declared("writers"))
    assert not missing, f"modules writing files without an inventory entry: {missing}"


def test_every_declared_writer_exists() -> None:
    modules = {m for m, _ in _modules(ROOT, PACKAGES)}
    stale = sorted(_declared("writers") - modules)
    assert not stale, f"inventory names modules that do not exist: {stale}"


def test_every_l3_payload_field_and_collection_has_an_entry() -> None:
    fields = payload_fields(ROOT)
    assert {"text", "subject", "written_by", "merged_from"} <= fields  # scanner works
    missing = sorted(fields - _declared("fields"))
    assert not missing, f"L3 payload fields without an inventory entry: {missing}"
    collections = {
        f.removeprefix("collection_") for f in Settings.model_fields if f.startswith("collection_")
    }
    assert collections == _declared("collections")


def test_every_postgres_table_has_an_entry() -> None:
    tables = pg_tables(ROOT)
    assert {"compliance_profiles", "compliance_audit"} <= tables
    assert tables <= _declared("tables"), sorted(tables - _declared("tables"))


def test_docs_show_the_inventory_table() -> None:
    page = (ROOT / "docs" / "data-lifecycle.md").read_text(encoding="utf-8")
    assert render_table() in page, "regenerate: python -m context_core.governance.inventory"


# --- the scanners catch a new writer ----------------------------------------------------------


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    pkg = tmp_path / "context_core" / "newthing"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""A new part."""\n')
    (pkg / "store.py").write_text(
        "import os\n"
        'PREFIX = "rem"\n'
        "def key(uid):\n"
        '    return f"memo:{{{uid}}}:notes"\n'
        "def other(uid):\n"
        '    return f"{PREFIX}:{uid}"\n'
        "def save(path, text):\n"
        '    with open(path, "a") as fh:\n'
        "        fh.write(text)\n"
        "def save2(path):\n"
        "    return os.open(path, os.O_WRONLY | os.O_CREAT)\n"
        "def reader(path):\n"
        "    return open(path).read()\n"
    )
    (pkg / "points.py").write_text(
        "def build(text):\n"
        '    payload = {"text": text, "author_email": "x"}\n'
        '    payload["mood"] = 1\n'
        "    return payload\n"
    )
    return tmp_path


def test_scanner_catches_a_new_key_family(planted: Path) -> None:
    found = key_families(planted, ("context_core",))
    assert set(found) == {"memo", "rem"}
    assert not set(found) & _declared("families")  # so the real test would fail


def test_scanner_catches_a_new_file_writer(planted: Path) -> None:
    assert file_writers(planted, ("context_core",)) == {"context_core.newthing.store"}


def test_scanner_catches_a_new_payload_field(planted: Path) -> None:
    (planted / "context_core" / "knowledge").mkdir()
    (planted / "context_core" / "ingest").mkdir()
    new = payload_fields(planted) - payload_fields(ROOT)
    assert new == set()  # the planted module is outside knowledge/ingest
    dest = planted / "context_core" / "ingest" / "points.py"
    (planted / "context_core" / "newthing" / "points.py").rename(dest)
    assert payload_fields(planted) - _declared("fields") == {"author_email", "mood"}
