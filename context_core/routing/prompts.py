"""Prompt binding: a bundle rendered into a prompt whose every field names its layer and key.

One template per intent, Jinja2 in a :class:`~jinja2.sandbox.SandboxedEnvironment` with
:class:`~jinja2.StrictUndefined`. The shipped defaults live in ``context_core/routing/templates``
(``<intent>.j2``, package data); an operator directory (``CTX_PROMPT_TEMPLATES_DIR``) adds
templates or replaces shipped ones by file name.

A field is a call that names its layer and key, so the bindings are read from the template
itself and never listed twice::

    The user's initial request: {{ l1("user_query") }}
    {% set findings = l2("step", field="findings", missing="notice") %}
    Findings of the previous step (L2): {{ findings }}
    Report format (L3): {{ l3("Report Templates", field="report_template", low="notice") }}

``l1(key)``: a session field (``user_query``, ``current_step``, ``last_device_id``,
``last_api_result``, ``trace``, ``user_id``), read from the L1 state itself (the budget may
list L1 fragments by reference, the state is still the agent's). ``l2(kind)`` or
``l2("kind:ident")``: the delivered L2 fragments of that key kind (``step``, ``api``,
``series``, ``contract``, ``pref``). ``l3(key)``: the delivered L3 hits whose title or heading
path contains ``key`` (case-insensitive; ``"*"``: every delivered hit). Keyword arguments,
constants only: ``field`` (the binding's name, default the key), ``missing`` (``omit``,
``notice`` or ``fail``; default ``omit``) and ``low`` (same choices, default ``notice``): what a
field without a value, or with only low-confidence values (L3 hits the calibrated thresholds in
force label below ``confident``; exact L1/L2 reads never are), becomes:

* ``omit``: renders as the empty string, status ``omitted`` (test it: ``{% if x %}``);
* ``notice``: renders with :data:`NOTICE` before it (a missing value as ``(not available)``),
  status ``notice``;
* ``fail``: the route raises :class:`~context_core.errors.PromptBindingError` (409) after its
  trace is written.

What comes back (:class:`RenderedPrompt`, the bundle's ``prompt``): the text, one binding per
field ``{field, layer, key, status, confidence}`` and ``context_used``, the sources the text
holds values of (``L1:session.<field>``, fragment sources). The route's trace record keeps the
bindings with the indexes of the fragments each one bound, which CER's "used" check reads.

Checked when the templates load (:meth:`PromptLibrary.load`; the service refuses to start,
naming file and line): Jinja syntax, calls with non-constant arguments, unknown layers, keys,
policies or keyword arguments, a field name used twice, names the template does not define,
``include``/``import``/``extends`` (templates are self-contained), and a dry render with every
field bound (a sandbox violation in the template's own code shows there).

Values are data, never template source: they are inserted into the output after the template
was compiled, so ``{{ }}``/``{% %}`` in a user's query arrive as those characters, and the
sandbox refuses attribute access such as ``__class__`` in the templates themselves.

Bounds: each field's value is cut at :data:`FIELD_MAX_CHARS` characters, a template holds at
most :data:`MAX_FIELDS` fields and :data:`TEMPLATE_MAX_BYTES` bytes, and the sandbox caps
``range()`` at 100,000 items, so a prompt's size and render time are bounded.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

from context_core.errors import PromptBindingError, PromptTemplateError
from context_core.routing.intents import L1_FIELDS, L2_KINDS

if TYPE_CHECKING:
    from context_core.routing.bundle import Fragment
    from context_core.session.state import SessionState

__all__ = [
    "FIELD_MAX_CHARS",
    "MAX_FIELDS",
    "NOTICE",
    "Binding",
    "FieldSpec",
    "PromptLibrary",
    "PromptTemplate",
    "RenderedPrompt",
]

NOTICE = "for reference only; real-time data decides"
"""What a low-confidence (or missing) value with the ``notice`` policy is prefixed with."""
MISSING_TEXT = "(not available)"
FIELD_MAX_CHARS = 4000
MAX_FIELDS = 32
TEMPLATE_MAX_BYTES = 64 * 1024
SUFFIX = ".j2"

Layer = Literal["l1", "l2", "l3"]
Policy = Literal["omit", "notice", "fail"]
Status = Literal["bound", "notice", "omitted"]
_POLICIES: frozenset[str] = frozenset({"omit", "notice", "fail"})
_LAYERS: frozenset[str] = frozenset({"l1", "l2", "l3"})
_KWARGS = frozenset({"field", "missing", "low"})
_GLOBALS = frozenset({"intent", "step"})
_TRUNCATED = " [truncated]"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a template, as its call declares it."""

    field: str
    layer: Layer
    key: str
    missing: Policy = "omit"
    low: Policy = "notice"
    line: int = 0


@dataclass(frozen=True, slots=True)
class Binding:
    """How one field was bound in one render. ``fragments``: indexes into the delivered
    fragments whose values the text holds (an L1 field is read from the state; its index is
    there when the budget delivered its fragment too)."""

    field: str
    layer: Layer
    key: str
    status: Status
    confidence: float | None
    sources: tuple[str, ...] = ()
    fragments: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "layer": self.layer,
            "key": self.key,
            "status": self.status,
            "confidence": self.confidence,
        }


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """The prompt of one bundle: the wire form is :meth:`to_dict` (``PromptWire``)."""

    intent: str
    template: str
    text: str
    bindings: tuple[Binding, ...]
    context_used: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "intent": self.intent,
            "template": self.template,
            "text": self.text,
            "bindings": [b.to_dict() for b in self.bindings],
            "context_used": list(self.context_used),
        }

    def trace(self) -> dict[str, Any]:
        """The route record's ``prompt``: bindings with fragment indexes, no text (the text
        holds values; the trace holds where they came from)."""
        return {
            "template": self.template,
            "bindings": [
                {
                    "field": b.field,
                    "layer": b.layer,
                    "key": b.key,
                    "status": b.status,
                    "fragments": list(b.fragments),
                }
                for b in self.bindings
            ],
        }


# --- values -----------------------------------------------------------------------------------


def _cut(text: str) -> str:
    if len(text) <= FIELD_MAX_CHARS:
        return text
    return text[: FIELD_MAX_CHARS - len(_TRUNCATED)] + _TRUNCATED


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    # keys sorted: the same value gives the same prompt whichever protocol stored it (a gRPC
    # Struct keeps no key order, a JSON body does)
    return json.dumps(
        value, ensure_ascii=False, separators=(", ", ": "), sort_keys=True, default=str
    )


def _fragment_text(frag: Fragment) -> str:
    content = frag.content
    if frag.layer == "L3" and isinstance(content, Mapping):
        return str(content.get("text", ""))
    if frag.label == "preference" and isinstance(content, Mapping):
        kind = frag.source.rpartition(":")[2]
        return f"{kind}: {_as_text(content.get('value'))}"
    return _as_text(content)


def _l2_match(frag: Fragment, key: str) -> bool:
    """``key`` is ``kind`` or ``kind:ident``; the fragment's source is ``L2:wm:{s}:kind:id``
    or ``L2:pref:{org:uid}:type``."""
    if frag.layer != "L2":
        return False
    src = frag.source.removeprefix("L2:")
    kind, _, ident = key.partition(":")
    if kind == "pref":
        head, _, rest = src.partition(":")
        if head != "pref":
            return False
        return not ident or rest.rpartition(":")[2] == ident
    _, brace, rest = src.partition("}:")
    if not brace:
        return False
    frag_kind, _, frag_ident = rest.partition(":")
    return frag_kind == kind and (not ident or frag_ident == ident)


def _l3_match(frag: Fragment, key: str) -> bool:
    if frag.layer != "L3":
        return False
    if key == "*":
        return True
    content = frag.content if isinstance(frag.content, Mapping) else {}
    names = [str(content.get("title", "")), *(str(h) for h in content.get("heading_path") or ())]
    needle = key.casefold()
    return any(needle in n.casefold() for n in names)


def _l1_value(state: SessionState, key: str) -> Any:
    value: Any = getattr(state, key, None)
    if key == "trace":
        return [
            {"kind": i.kind, "name": i.name, "call_id": i.call_id, "payload": i.payload}
            for i in value or ()
        ] or None
    if key == "last_api_result" and value is not None:
        return {"status": value.status, "data_sha256": value.data_sha256}
    return value


# --- one template -----------------------------------------------------------------------------


class _Render:
    """The field functions of one render: each call records its binding."""

    def __init__(
        self, tpl: PromptTemplate, state: SessionState | None, fragments: Sequence[Fragment]
    ) -> None:
        self.tpl = tpl
        self.state = state
        self.fragments = fragments
        self.bindings: dict[str, Binding] = {}

    def _spec(self, layer: str, key: str, field_name: str | None) -> FieldSpec:
        name = field_name or key
        spec = self.tpl.field_map.get(name)
        if spec is None or spec.layer != layer or spec.key != key:  # pragma: no cover
            raise PromptTemplateError(self.tpl.name, None, f"field {name!r} was not declared")
        return spec

    def _missing(self, spec: FieldSpec, why: str) -> str:
        if spec.missing == "fail":
            raise PromptBindingError(self.tpl.name, spec.field, spec.layer, spec.key, why)
        status: Status = "notice" if spec.missing == "notice" else "omitted"
        self.bindings[spec.field] = Binding(spec.field, spec.layer, spec.key, status, None)
        return MISSING_TEXT if status == "notice" else ""

    def l1(self, key: str, *, field: str | None = None, **_policy: str) -> str:
        spec = self._spec("l1", key, field)
        value = None if self.state is None else _l1_value(self.state, key)
        if value is None or value == "":
            return self._missing(spec, "has no value in the session state")
        source = f"L1:session.{key}"
        delivered = tuple(i for i, f in enumerate(self.fragments) if f.source == source)
        self.bindings[spec.field] = Binding(
            spec.field, "l1", key, "bound", 1.0, (source,), delivered
        )
        return _cut(_as_text(value))

    def _fragments(self, spec: FieldSpec, match: Callable[[Fragment], bool]) -> str:
        hits = [(i, f) for i, f in enumerate(self.fragments) if match(f)]
        if not hits:
            return self._missing(spec, "matched no delivered fragment")
        sure = [(i, f) for i, f in hits if not _low(f)]
        low = [(i, f) for i, f in hits if _low(f)]
        if low and spec.low == "fail":
            why = "holds a low-confidence value" if sure else "has only low-confidence values"
            raise PromptBindingError(self.tpl.name, spec.field, spec.layer, spec.key, why)
        shown = sure + (low if spec.low == "notice" else [])
        if not shown:
            self.bindings[spec.field] = Binding(spec.field, spec.layer, spec.key, "omitted", None)
            return ""
        shown.sort(key=lambda p: p[0])
        parts = [
            f"[{NOTICE}] {_fragment_text(f)}" if _low(f) else _fragment_text(f) for _, f in shown
        ]
        status: Status = "notice" if any(_low(f) for _, f in shown) else "bound"
        self.bindings[spec.field] = Binding(
            spec.field,
            spec.layer,
            spec.key,
            status,
            round(max(float(f.confidence) for _, f in shown), 4),
            tuple(f.source for _, f in shown),
            tuple(i for i, _ in shown),
        )
        return _cut("\n".join(parts))

    def l2(self, key: str, *, field: str | None = None, **_policy: str) -> str:
        spec = self._spec("l2", key, field)
        return self._fragments(spec, lambda f: _l2_match(f, key))

    def l3(self, key: str, *, field: str | None = None, **_policy: str) -> str:
        spec = self._spec("l3", key, field)
        return self._fragments(spec, lambda f: _l3_match(f, key))


def _low(frag: Fragment) -> bool:
    """Low confidence: an L3 hit the thresholds in force did not label ``confident``."""
    return frag.layer == "L3" and frag.label != "confident"


@dataclass(frozen=True)
class PromptTemplate:
    """One compiled template and the fields it declares."""

    name: str
    intent: str
    fields: tuple[FieldSpec, ...]
    compiled: jinja2.Template = field(repr=False)
    field_map: dict[str, FieldSpec] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "field_map", {f.field: f for f in self.fields})

    def render(
        self, state: SessionState | None, fragments: Sequence[Fragment], *, step: int = 0
    ) -> RenderedPrompt:
        """The prompt for ``fragments`` (the delivered ones, bundle order) and L1 ``state``.
        Raises :class:`PromptBindingError` for a ``fail`` field without a usable value."""
        run = _Render(self, state, fragments)
        try:
            text = self.compiled.render(
                l1=run.l1, l2=run.l2, l3=run.l3, intent=self.intent, step=step
            )
        except PromptBindingError:
            raise
        except jinja2.TemplateError as e:  # the sandbox, an undefined name on a rare path
            raise PromptTemplateError(self.name, _template_line(self.name), str(e)) from e
        # a field on a branch that did not run: never shown
        bindings = tuple(
            run.bindings.get(f.field) or Binding(f.field, f.layer, f.key, "omitted", None)
            for f in self.fields
        )
        used = tuple(dict.fromkeys(s for b in bindings for s in b.sources))
        return RenderedPrompt(self.intent, self.name, text, bindings, used)


def _template_line(name: str) -> int | None:
    """The template line of the exception being handled (Jinja rewrites its traceback so a
    frame carries the template's file name and line)."""
    tb: TracebackType | None = sys.exc_info()[2]
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == name:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


# --- loading and checking ---------------------------------------------------------------------


def _environment() -> SandboxedEnvironment:
    return SandboxedEnvironment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # a prompt is text, not HTML
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _const(node: nodes.Node, what: str, name: str, line: int) -> str:
    if isinstance(node, nodes.Const) and isinstance(node.value, str) and node.value:
        return node.value
    raise PromptTemplateError(
        name,
        line,
        f"{what} must be a non-empty string constant (the binding is read from the "
        "template, so it cannot be computed)",
    )


def _field_of(call: nodes.Call, name: str) -> FieldSpec:
    layer = call.node.name  # type: ignore[attr-defined]
    line = call.lineno
    if len(call.args) != 1 or call.dyn_args is not None or call.dyn_kwargs is not None:
        raise PromptTemplateError(
            name,
            line,
            f'{layer}() takes one key, e.g. {layer}("...", field="name", '
            'missing="omit", low="notice")',
        )
    key = _const(call.args[0], f"{layer}()'s key", name, line)
    kw: dict[str, str] = {}
    for k in call.kwargs:
        if k.key not in _KWARGS:
            raise PromptTemplateError(
                name, line, f"{layer}() has no argument {k.key!r}; use {sorted(_KWARGS)}"
            )
        kw[k.key] = _const(k.value, f"{layer}()'s {k.key}", name, line)
    for pol in ("missing", "low"):
        if pol in kw and kw[pol] not in _POLICIES:
            raise PromptTemplateError(
                name, line, f"{pol}={kw[pol]!r} is not a policy; use omit, notice or fail"
            )
    if layer == "l1" and key not in L1_FIELDS:
        raise PromptTemplateError(
            name, line, f"l1({key!r}): no such session field; use one of {sorted(L1_FIELDS)}"
        )
    if layer == "l2" and key.partition(":")[0] not in L2_KINDS:
        raise PromptTemplateError(
            name,
            line,
            f"l2({key!r}): unknown key kind; use one of {sorted(L2_KINDS)}, "
            'optionally with ":<ident>"',
        )
    return FieldSpec(
        field=kw.get("field", key),
        layer=layer,
        key=key,
        missing=kw.get("missing", "omit"),  # type: ignore[arg-type]
        low=kw.get("low", "notice"),  # type: ignore[arg-type]
        line=line,
    )


def _check(ast: nodes.Template, name: str) -> tuple[FieldSpec, ...]:
    for bad in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        raise PromptTemplateError(
            name, bad.lineno, "include/import/extends are not allowed: a template is self-contained"
        )
    fields: list[FieldSpec] = []
    callees: set[int] = set()
    for call in ast.find_all(nodes.Call):
        if isinstance(call.node, nodes.Name) and call.node.name in _LAYERS:
            callees.add(id(call.node))
            spec = _field_of(call, name)
            if any(f.field == spec.field for f in fields):
                raise PromptTemplateError(
                    name,
                    call.lineno,
                    f"field {spec.field!r} is bound twice; give one of "
                    'them another name with field="..."',
                )
            fields.append(spec)
    if len(fields) > MAX_FIELDS:
        raise PromptTemplateError(name, None, f"{len(fields)} fields, at most {MAX_FIELDS}")
    stored = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
    for n in ast.find_all(nodes.Name):
        if n.ctx != "load" or n.name in stored or n.name in _GLOBALS:
            continue
        if n.name in _LAYERS:
            if id(n) not in callees:
                raise PromptTemplateError(
                    name, n.lineno, f'{n.name} is a field function: call it, {n.name}("key")'
                )
            continue
        raise PromptTemplateError(
            name,
            n.lineno,
            f"{n.name!r} is undefined; a template sees only l1(), l2(), l3(), "
            "intent and step (and the names it sets itself)",
        )
    return tuple(fields)


def compile_template(source: str, *, name: str, intent: str) -> PromptTemplate:
    """Parse, check and dry-render one template (``name`` is how errors cite it)."""
    if len(source.encode()) > TEMPLATE_MAX_BYTES:
        raise PromptTemplateError(name, None, f"over {TEMPLATE_MAX_BYTES} bytes")
    env = _environment()
    try:
        ast = env.parse(source, name=name, filename=name)
    except jinja2.TemplateSyntaxError as e:
        raise PromptTemplateError(name, e.lineno, e.message or "syntax error") from e
    fields = _check(ast, name)
    try:
        code = env.compile(ast, name=name, filename=name)
        compiled = env.template_class.from_code(env, code, env.make_globals(None), None)
    except jinja2.TemplateError as e:  # pragma: no cover - parse caught the syntax
        raise PromptTemplateError(name, getattr(e, "lineno", None), str(e)) from e
    tpl = PromptTemplate(name=name, intent=intent, fields=fields, compiled=compiled)
    _dry_run(tpl)
    return tpl


def _dry_run(tpl: PromptTemplate) -> None:
    """Render with every field bound to a placeholder: the template's own code (filters,
    attribute access the sandbox refuses, loops) runs once before any request does."""

    def bound(key: str, *, field: str | None = None, **_: str) -> str:
        return f"<{field or key}>"

    try:
        tpl.compiled.render(l1=bound, l2=bound, l3=bound, intent=tpl.intent, step=1)
    except jinja2.TemplateError as e:
        raise PromptTemplateError(tpl.name, _template_line(tpl.name), str(e)) from e
    except (TypeError, ValueError, ArithmeticError, LookupError) as e:
        raise PromptTemplateError(tpl.name, _template_line(tpl.name), repr(e)) from e


# --- the library ------------------------------------------------------------------------------


def _shipped() -> Iterable[tuple[str, str, str]]:
    """(intent, name, source) of the shipped defaults (package data)."""
    root = resources.files("context_core.routing") / "templates"
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(SUFFIX):
            intent = entry.name.removesuffix(SUFFIX)
            yield intent, f"shipped/{entry.name}", entry.read_text(encoding="utf-8")


def _operator(directory: Path) -> Iterable[tuple[str, str, str]]:
    if not directory.is_dir():
        raise PromptTemplateError(
            str(directory),
            None,
            "CTX_PROMPT_TEMPLATES_DIR is not a directory; point it at the "
            "folder holding <intent>.j2 files, or unset it",
        )
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        name = f"operator/{path.name}"
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise PromptTemplateError(name, None, f"not UTF-8 text ({e.reason})") from e
        yield path.name.removesuffix(SUFFIX), name, source


@dataclass(frozen=True)
class PromptLibrary:
    """Intent -> template. The operator's templates replace shipped ones of the same name."""

    templates: Mapping[str, PromptTemplate]

    @classmethod
    def load(
        cls, operator_dir: Path | None = None, *, intents: Iterable[str] | None = None
    ) -> PromptLibrary:
        """Compile the shipped templates and the operator's; ``intents`` (the registry's
        names) makes a template for an intent nobody registered an error."""
        known = None if intents is None else frozenset(intents)
        found: dict[str, PromptTemplate] = {}
        sources = list(_shipped())
        if operator_dir is not None:
            sources += list(_operator(operator_dir))
        for intent, name, source in sources:
            if known is not None and intent not in known:
                raise PromptTemplateError(
                    name,
                    None,
                    f"names no registered intent {intent!r}; name the file "
                    f"<intent>.j2 with one of {sorted(known)}",
                )
            found[intent] = compile_template(source, name=name, intent=intent)
        return cls(found)

    def get(self, intent: str) -> PromptTemplate | None:
        return self.templates.get(intent)

    def render(
        self, intent: str, state: SessionState | None, fragments: Sequence[Fragment]
    ) -> RenderedPrompt | None:
        """The prompt of a bundle of ``intent`` (its resolved intent); None without a
        template for it."""
        tpl = self.templates.get(intent)
        if tpl is None:
            return None
        step = 0 if state is None else int(state.current_step)
        return tpl.render(state, fragments, step=step)
