"""The intent registry: which context each kind of agent step needs, as data.

The router never branches on intent names; it reads an :class:`IntentSpec` and loads what the
spec lists. Adding a step type is adding a row (in code or from a JSON file via
:meth:`IntentRegistry.from_dict`), not editing the router.

Templates (``"{prev_step}"``, ``"{device}.vibration"``, ``"{user_query} report template"``) are
filled from the session state and the request parameters:

==================  ==========================================================
``session_id``      L1 session id
``step``            L1 ``current_step``; ``prev_step`` is ``step - 1``
``device``          ``params["device"]`` else L1 ``last_device_id``
``device_prefix``   ``params["section"]`` else L1 ``device_prefix`` (e.g. ``PUMP``)
``user_query``      L1 ``user_query``
any other name      ``params[name]`` (``endpoint`` for ``api`` keys, for example)
==================  ==========================================================

L2 keys: ``("step", "{prev_step}")`` is a step result, ``("api", "{endpoint}")`` a cached tool
response whose parameters are ``params["api_params"]`` (hashed with the endpoint, as L2 does),
``("series", "{device}.vibration")`` a sensor time series, ``("contract", "current")`` the
versioned task contract, ``("pref", "<type>")`` one of the session user's structured
preferences (``pref:{<user id>}:<type>``) and ``("pref", "*")`` all of them (one fragment each,
relevance = the preference's confidence). L2 idents may not contain ``:`` (working memory
refuses them), hence the dot in series names.

Budget: ``max_fragments`` (None = the router's, ``CTX_BUNDLE_MAX_FRAGMENTS``) caps the
fragments a bundle of this intent delivers; the rest are listed by reference (priority in
:mod:`context_core.routing.bundle`). It may not be below the number of required keys.

Required vs optional, the rule used by the built-ins: a key is **required** when the step can
not produce a correct output without it (comparing vibration needs the series; a report needs
the previous step's findings). A required miss raises ``ContextMissError`` after the trace is
written. Everything merely helpful (a cached API response that can be re-fetched, the task
contract, shared baselines) is **optional**: a miss is traced and the route goes on. The
trace record names the required keys in ``l2.required``; CER judges loading on those alone
(an optional miss is reported as information, not as a failed step).

L3 sections: ``l3_sections`` lists section filters (templates); one search per section with the
same query embedding, hits merged by score. A template that fills to "" means "no filter".
``generate_report`` searches the device's section *and* ``Report Templates`` (where the
export keeps the report template, outside any device area).

Unknown intents use the ``default`` spec (user query + L1 + a general L3 search), so a new step
type degrades to "generic context" instead of failing the agent; the trace still records the
intent name the agent asked for, so unknown intents show up in the health report.
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from context_core.errors import ConfigError

__all__ = [
    "ALL_PREFERENCES",
    "BUILTIN_INTENTS",
    "DEFAULT_INTENT",
    "IntentRegistry",
    "IntentSpec",
    "L2KeySpec",
    "NsKeySpec",
    "TemplateParamError",
    "fill",
    "template_fields",
]

DEFAULT_INTENT = "default"
L1_FIELDS = frozenset(
    {"user_query", "current_step", "last_device_id", "last_api_result", "trace", "user_id"}
)
L2_KINDS = frozenset({"step", "api", "series", "contract", "pref"})
ALL_PREFERENCES = "*"
DEFAULT_L1_FIELDS = ("user_query", "current_step", "last_device_id")


class TemplateParamError(KeyError):
    """A template names a value that neither the session state nor the params provide."""

    def __init__(self, template: str, name: str) -> None:
        self.template = template
        self.name = name
        super().__init__(name)

    def __str__(self) -> str:
        return (
            f"template {self.template!r} needs {self.name!r}: pass params={{{self.name!r}: ...}} "
            "or set it in the session state"
        )


@dataclass(frozen=True, slots=True)
class L2KeySpec:
    """One working-memory key an intent loads. ``ident`` is a template."""

    kind: str
    ident: str
    required: bool = False

    def __post_init__(self) -> None:
        if self.kind not in L2_KINDS:
            raise ConfigError(f"L2 key kind {self.kind!r} unknown; use one of {sorted(L2_KINDS)}")


@dataclass(frozen=True, slots=True)
class NsKeySpec:
    """One shared-namespace key an intent reads, with the purpose it declares to the ACL.

    A denied read is traced and left out; with ``required=True`` the route re-raises the
    :class:`AccessDeniedError` after writing the trace. An absent key is traced as requested
    but not found, never an error (shared context is a bonus, not a precondition).
    """

    namespace: str
    key: str
    purpose: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class IntentSpec:
    """What one kind of step needs from each layer."""

    name: str
    l1_fields: tuple[str, ...] = DEFAULT_L1_FIELDS
    l2_keys: tuple[L2KeySpec, ...] = ()
    l3: bool = False
    l3_query: str = "{user_query}"
    l3_sections: tuple[str, ...] = ("{device_prefix}",)
    namespaces: tuple[NsKeySpec, ...] = ()
    description: str = ""
    max_fragments: int | None = None

    def __post_init__(self) -> None:
        unknown = [f for f in self.l1_fields if f not in L1_FIELDS]
        if unknown:
            raise ConfigError(
                f"intent {self.name!r}: unknown L1 field(s) {unknown}; use {sorted(L1_FIELDS)}"
            )
        # Accept the compact tuple form ("step", "{prev_step}", True) in data files.
        keys = tuple(k if isinstance(k, L2KeySpec) else L2KeySpec(*k) for k in self.l2_keys)
        object.__setattr__(self, "l2_keys", keys)
        ns = tuple(n if isinstance(n, NsKeySpec) else NsKeySpec(*n) for n in self.namespaces)
        object.__setattr__(self, "namespaces", ns)
        cap = self.max_fragments
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ConfigError(
                    f"intent {self.name!r}: max_fragments must be a positive integer or "
                    f"null, got {cap!r}"
                )
            if cap < len(self.required_keys):
                raise ConfigError(
                    f"intent {self.name!r}: max_fragments={cap} is below its "
                    f"{len(self.required_keys)} required L2 keys; required keys are always "
                    "delivered, so raise max_fragments or make keys optional"
                )

    @property
    def required_keys(self) -> tuple[L2KeySpec, ...]:
        return tuple(k for k in self.l2_keys if k.required)


BUILTIN_INTENTS: tuple[IntentSpec, ...] = (
    IntentSpec(
        name="fetch_sensor_data",
        description="Read a device's sensors; whatever is already in L2 saves a call.",
        l1_fields=("user_query", "current_step", "last_device_id"),
        l2_keys=(L2KeySpec("series", "{device}.vibration"), L2KeySpec("contract", "current")),
        l3=False,
    ),
    IntentSpec(
        name="call_api",
        description="Call a tool API; a fresh cached response for the same parameters wins.",
        l1_fields=("user_query", "current_step", "last_api_result", "trace"),
        l2_keys=(L2KeySpec("api", "{endpoint}"), L2KeySpec("contract", "current")),
        l3=False,
    ),
    IntentSpec(
        name="compare_vibration",
        description="Compare live vibration with limits from the manuals and fleet baselines.",
        l1_fields=("user_query", "current_step", "last_device_id"),
        l2_keys=(
            L2KeySpec("series", "{device}.vibration", required=True),
            L2KeySpec("step", "{prev_step}"),
        ),
        l3=True,
        l3_query="{device_prefix} vibration limits and assessment",
        namespaces=(NsKeySpec("fleet", "baseline:{device_prefix}", "diagnostics"),),
    ),
    IntentSpec(
        name="generate_report",
        description="Write the report: previous findings, the contract, the report template.",
        l1_fields=("user_query", "current_step", "last_device_id", "last_api_result"),
        l2_keys=(
            L2KeySpec("step", "{prev_step}", required=True),
            L2KeySpec("contract", "current"),
            L2KeySpec("pref", ALL_PREFERENCES),
        ),
        l3=True,
        l3_query="maintenance work report template {device_prefix}",
        l3_sections=("{device_prefix}", "Report Templates"),
        namespaces=(NsKeySpec("fleet", "baseline:{device_prefix}", "reporting"),),
    ),
    IntentSpec(
        name="preferences",
        description="The user's structured preferences (units, report language, ...), "
        "most confident first.",
        l1_fields=("user_query", "current_step"),
        l2_keys=(L2KeySpec("pref", ALL_PREFERENCES),),
        l3=False,
    ),
    IntentSpec(
        name=DEFAULT_INTENT,
        description="Fallback for intents nobody registered: L1 and a general L3 search.",
        l1_fields=("user_query", "current_step", "last_device_id"),
        l3=True,
        l3_query="{user_query}",
    ),
)


@dataclass
class IntentRegistry:
    """Name -> :class:`IntentSpec`. ``get`` falls back to ``default`` for unknown names."""

    specs: dict[str, IntentSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if DEFAULT_INTENT not in self.specs:
            self.specs[DEFAULT_INTENT] = next(
                s for s in BUILTIN_INTENTS if s.name == DEFAULT_INTENT
            )

    @classmethod
    def builtin(cls) -> IntentRegistry:
        return cls({s.name: s for s in BUILTIN_INTENTS})

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Mapping[str, Any]], *, with_builtins: bool = True
    ) -> IntentRegistry:
        """Build from plain data, e.g. ``json.load`` of ``{"name": {"l3": true, ...}}``."""
        reg = cls.builtin() if with_builtins else cls()
        for name, raw in data.items():
            try:
                spec = IntentSpec(
                    name=name,
                    l1_fields=tuple(raw.get("l1_fields", DEFAULT_L1_FIELDS)),
                    l2_keys=tuple(tuple(k) for k in raw.get("l2_keys", ())),  # type: ignore[misc]
                    l3=bool(raw.get("l3", False)),
                    l3_query=str(raw.get("l3_query", "{user_query}")),
                    l3_sections=tuple(raw.get("l3_sections", ("{device_prefix}",))),
                    namespaces=tuple(tuple(n) for n in raw.get("namespaces", ())),  # type: ignore[misc]
                    description=str(raw.get("description", "")),
                    max_fragments=raw.get("max_fragments"),
                )
            except TypeError as e:
                raise ConfigError(f"intent {name!r} is malformed: {e}") from e
            reg.register(spec)
        return reg

    def register(self, spec: IntentSpec) -> None:
        self.specs[spec.name] = spec

    def get(self, name: str) -> IntentSpec:
        return self.specs.get(name) or self.specs[DEFAULT_INTENT]

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def __iter__(self) -> Iterator[IntentSpec]:
        return iter(self.specs.values())

    def names(self) -> list[str]:
        return sorted(self.specs)


_FORMATTER = string.Formatter()


def template_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in _FORMATTER.parse(template) if f]


def fill(template: str, values: Mapping[str, Any]) -> str:
    """``str.format`` with a :class:`TemplateParamError` naming the missing value."""
    for name in template_fields(template):
        if values.get(name) in (None, ""):
            raise TemplateParamError(template, name)
    return template.format_map(values)
