"""MkDocs hooks: the pages and tables that are generated from the code at build time.

Why generated: a hand-written copy of a settings table, an endpoint list or a module index goes
stale the day someone adds a field or moves a module. Everything here is read from the code (or
from ``reports/benchmarks.md``, which ``make bench`` rewrites) each time the site is built, so
``mkdocs build --strict`` fails instead of publishing something out of date.

- **API reference** (``api/<dotted.module.name>/``): one page per module, found by walking
  the package directories of ``context_core``, ``context_app``, ``evaluation`` and
  ``loadtests`` on disk (no import), each page a mkdocstrings ``::: module`` directive;
  the nav section is built from the same walk. Moving or renaming a module needs no docs edit.
- **Markers** in hand-written pages, replaced by :func:`on_page_markdown`:

  ``<!-- gen:settings -->``      the ``Settings`` fields of ``context_core.config``
  ``<!-- gen:endpoints -->``     the HTTP routes, from the FastAPI app's OpenAPI document
  ``<!-- gen:errors -->``        the error classes of ``context_core.errors`` and their answers
  ``<!-- gen:lifecycle -->``     the lifecycle effects table,
  ``context_core.lifecycle.manager.EFFECTS``
  ``<!-- gen:bench NAME -->``    section NAME of ``reports/benchmarks.md``

  An unknown marker, or one whose source cannot be read, stops the build.

Only the standard library and the project are imported; nothing is fetched over the network.
"""

from __future__ import annotations

import inspect
import re
import tempfile
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("context_core", "context_app", "evaluation", "loadtests")
API_DIR = "api"
API_NAV_TITLE = "API reference"
MARKER = re.compile(r"<!-- gen:(?P<kind>[a-z]+)(?: (?P<arg>[\w-]+))? -->")


# --- API reference: modules found on disk ----------------------------------------------------


def walk_modules(package: str, root: Path = ROOT) -> list[str]:
    """Dotted names of ``package`` and every module below it, sorted, packages before their
    modules. Private modules (``_x.py``), ``__main__`` and directories that are not packages
    (no ``__init__.py``: data folders) are left out."""
    base = root / package
    names: list[str] = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        if any(
            not (root.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))
        ):
            continue  # inside a directory that is not a package
        if parts[-1] == "__init__":
            parts = parts[:-1]
        elif parts[-1].startswith("_"):
            continue
        if any(p.startswith("_") for p in parts[1:]):
            continue
        names.append(".".join(parts))
    return sorted(set(names), key=lambda n: n.split("."))


def page_of(module: str) -> str:
    """``a.b.c`` -> ``api/a.b.c.md``: flat, named by the dotted name, so a module called
    ``index`` cannot collide with its package's page and a page's URL is the import path."""
    return f"{API_DIR}/{module}.md"


def _is_package(module: str) -> bool:
    return (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()


def _nav_tree(modules: list[str], prefix: str) -> list[Any]:
    """Nav entries of package ``prefix``: its own page, then its modules and subpackages."""
    entries: list[Any] = [page_of(prefix)]
    depth = prefix.count(".") + 1
    children = [m for m in modules if m.startswith(prefix + ".") and m.count(".") == depth]
    for child in children:
        short = child.rsplit(".", 1)[1]
        if _is_package(child):
            entries.append({short: _nav_tree(modules, child)})
        else:
            entries.append({short: page_of(child)})
    return entries


def api_nav() -> list[Any]:
    nav: list[Any] = [f"{API_DIR}/index.md"]
    for package in PACKAGES:
        nav.append({package: _nav_tree(walk_modules(package), package)})
    return nav


def _api_index() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings at build time: every module of the four packages, found",
        "by walking their directories, so a moved or renamed module appears here under its new",
        "name with no docs edit. The layers are the import contract of `pyproject.toml`:",
        "`context_app` above `evaluation` and `loadtests`, all three above `context_core`.",
        "",
        "| package | modules |",
        "|---|---|",
    ]
    for package in PACKAGES:
        mods = walk_modules(package)
        lines.append(f"| [`{package}`]({package}.md) | {len(mods)} |")
    return "\n".join(lines) + "\n"


def _module_page(module: str) -> str:
    # the page title is the dotted name; the heading of the object itself is hidden (the
    # title already says it) and its members start one level below
    return f"# `{module}`\n\n::: {module}\n    options:\n      show_root_heading: false\n"


def on_config(config: Any) -> Any:
    """Replace the nav's ``API reference`` entry by the tree of modules found on disk."""
    nav = config.get("nav") or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and API_NAV_TITLE in item:
            nav[i] = {API_NAV_TITLE: api_nav()}
            break
    else:
        raise ValueError(f"mkdocs.yml: the nav needs an entry '{API_NAV_TITLE}' (any value)")
    return config


def on_files(files: Any, config: Any) -> Any:
    """Add the API pages (virtual files; nothing is written into docs/)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, f"{API_DIR}/index.md", content=_api_index()))
    for package in PACKAGES:
        for module in walk_modules(package):
            files.append(File.generated(config, page_of(module), content=_module_page(module)))
    return files


# --- tables read from the code ----------------------------------------------------------------


def _cell(text: object) -> str:
    """One Markdown table cell: no newlines, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())


def _rst_to_md(text: str) -> str:
    """The docstrings' reST inline markup as Markdown: ``x`` -> `x`, :func:`x` -> `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in rest) + " (optional)"
    name = getattr(annotation, "__name__", str(annotation))
    return {"str": "string", "SecretStr": "secret", "Path": "path", "bool": "boolean"}.get(
        name, name
    )


def _constraints(metadata: list[Any]) -> str:
    out = []
    for m in metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(m, attr, None)
            if value is not None:
                out.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value}")
        pattern = getattr(m, "pattern", None)
        if pattern:
            out.append(f"matches `{pattern}`")
    return ", ".join(out)


def _default(name: str, value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and name.endswith("bytes") and value >= 1024:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"`{value}` ({value // size} {unit})"
    if isinstance(value, Path):
        return f"`./{value}`" if not value.is_absolute() and str(value) != "." else f"`{value}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def _settings_sections(settings_cls: type) -> dict[str, str]:
    """Field -> the ``# --- section ---`` comment above it in the class body."""
    section = "General"
    out: dict[str, str] = {}
    for line in inspect.getsource(settings_cls).splitlines():
        head = re.match(r"\s*# -{3} (.+?) -*$", line)
        if head:
            section = head.group(1).strip()
            continue
        field = re.match(r"    (\w+)\s*:", line)
        if field:
            out[field.group(1)] = section
    return out


def settings_reference() -> str:
    """The ``Settings`` fields as tables, one per section of the class."""
    from context_core.config import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    sections = _settings_sections(Settings)
    by_section: dict[str, list[str]] = {}
    for name, field in Settings.model_fields.items():
        rules = _constraints(list(field.metadata))
        kind = _type_name(field.annotation) + (f"; {rules}" if rules else "")
        desc = _rst_to_md(field.description or "") or "*(no description in `Settings`)*"
        row = (
            f"| `{prefix}{name.upper()}` | {_cell(kind)} | "
            f"{_cell(_default(name, field.get_default(call_default_factory=True)))} | "
            f"{_cell(desc)} |"
        )
        by_section.setdefault(sections.get(name, "General"), []).append(row)
    out = [
        f"{len(Settings.model_fields)} settings, read from `{prefix}*` environment variables.",
        "",
    ]
    for section, rows in by_section.items():
        title = section[0].upper() + section[1:]
        out += [f"### {title}", "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        out += [*rows, ""]
    return "\n".join(out)


def endpoints_reference() -> str:
    """The routes of the real app, from its OpenAPI document (no Redis, no model: the app's
    backends are built in its lifespan, which is not entered here)."""
    from context_app.service.app import create_app
    from context_core.config import get_settings

    with tempfile.TemporaryDirectory() as tmp:
        spec = create_app(get_settings(data_dir=Path(tmp))).openapi()
    by_tag: dict[str, list[str]] = {}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            what = _rst_to_md(_first_paragraph(op.get("description")) or op.get("summary", ""))
            codes = ", ".join(sorted(op.get("responses", {})))
            row = f"| `{method.upper()} {path}` | {_cell(what)} | {codes} |"
            by_tag.setdefault((op.get("tags") or ["other"])[0], []).append(row)
    out = [
        f"{spec['info']['title']} {spec['info']['version']}: {spec['info'].get('summary', '')}",
        "",
    ]
    for tag, rows in by_tag.items():
        out += [f"### {tag}", "", "| endpoint | what it does | statuses |", "|---|---|---|"]
        out += [*rows, ""]
    return "\n".join(out)


def errors_reference() -> str:
    """Every error class with the HTTP status and ``error`` code the service answers it with."""
    from context_core import errors

    rows = ["| class | HTTP | `error` | when |", "|---|---|---|---|"]
    classes = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, errors.ContextError)
    ]
    for cls in classes:
        doc = _rst_to_md(_first_paragraph(cls.__doc__))
        rows.append(f"| `{cls.__name__}` | {cls.http_status} | `{cls.error_code}` | {_cell(doc)} |")
    return "\n".join(rows) + "\n"


def lifecycle_table() -> str:
    from context_core.lifecycle.manager import EFFECTS

    rows = [
        "| event | L1 (session state) | L2 (working memory) | L3 (knowledge) |",
        "|---|---|---|---|",
    ]
    for e in EFFECTS.values():
        rows.append(f"| `{e.event.value}` | {_cell(e.l1)} | {_cell(e.l2)} | {_cell(e.l3)} |")
    return "\n".join(rows) + "\n"


def bench_section(name: str) -> str:
    """Section ``name`` of reports/benchmarks.md without its own title, headings one level
    down (the page gives each section its title and command)."""
    text = (ROOT / "reports" / "benchmarks.md").read_text(encoding="utf-8")
    found = re.search(
        rf"<!-- bench:{re.escape(name)} -->\n(.*?)<!-- /bench:{re.escape(name)} -->", text, re.S
    )
    if not found:
        raise ValueError(f"reports/benchmarks.md has no section <!-- bench:{name} -->")
    body = re.sub(r"\A\s*## .*\n", "", found.group(1))
    return re.sub(r"^(#{2,5}) ", r"#\1 ", body, flags=re.M)


def render_marker(kind: str, arg: str | None) -> str:
    if kind == "settings":
        return settings_reference()
    if kind == "endpoints":
        return endpoints_reference()
    if kind == "errors":
        return errors_reference()
    if kind == "lifecycle":
        return lifecycle_table()
    if kind == "bench" and arg:
        return bench_section(arg)
    raise ValueError(f"unknown docs marker <!-- gen:{kind} {arg or ''} -->")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(lambda m: render_marker(m.group("kind"), m.group("arg")), markdown)
