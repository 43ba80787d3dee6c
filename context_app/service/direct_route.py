"""A route class that runs the hot endpoints without FastAPI's generic dependency solver.

FastAPI's request handler solves every request's dependencies through one generic walker
(sub-dependency caching, security scopes, the ``email`` parser for the content type, an
endpoint-context lookup for error messages). For the service's endpoints that walk was a
good part of what FastAPI cost per request (``solve_dependencies``: 70-140 us of a 0.5-1.7 ms
request, measured in-process), for a handful of parameters that are always the same kinds:
the services, the calling agent, the body size, the request, path parameters and one JSON
body model.

:class:`DirectRoute` is an :class:`~fastapi.routing.APIRoute` (routing, OpenAPI and
``response_model`` are unchanged) whose handler fills those parameters itself, with FastAPI's
own validators (the path parameters' fields, the body field) and the dependency functions of
:mod:`.http_deps` themselves. It only ever takes the path where everything succeeds:
anything else (no or unknown API key, a path parameter or body that fails validation, a body
that is not ``application/json`` or not JSON at all) goes to FastAPI's own handler, which
runs from the start and answers exactly as it always did (the 401, the 422 naming the
field). Nothing has happened by then: the fast path has only read and validated.

A route qualifies when its endpoint is a coroutine function returning a
:class:`~starlette.responses.Response` (so there is no response serialisation to mirror) and
every parameter is one of the kinds above; any other route keeps FastAPI's handler. So does
every route while ``app.dependency_overrides`` is set (an override must be honoured).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException
from fastapi._compat import field_annotation_is_sequence
from fastapi.params import Form
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from context_app.service import http_deps

__all__ = ["DirectRoute", "direct_plan", "direct_routes_first"]

Step = tuple[str, str]  # (parameter name, kind)

#: dependency functions the direct path calls itself, by the kind of value they give
_DEPENDENCIES: dict[Any, str] = {
    http_deps.services: "svc",
    http_deps.agent: "who",
    http_deps.body_bytes: "nbytes",
}


def direct_plan(route: APIRoute) -> list[Step] | None:
    """The parameters of ``route``'s endpoint in the order FastAPI solves them (dependencies,
    path parameters, the body), or None when the route does not qualify (see the module)."""
    d = route.dependant
    call = d.call
    if call is None or not d.is_coroutine_callable:
        return None
    try:
        returns = typing.get_type_hints(call).get("return")
    except Exception:  # an annotation that does not resolve: leave the route alone
        return None
    if returns is not Response:
        return None
    if d.query_params or d.header_params or d.cookie_params:
        return None
    if (
        d.websocket_param_name
        or d.http_connection_param_name
        or d.response_param_name
        or d.background_tasks_param_name
        or d.security_scopes_param_name
    ):
        return None
    steps: list[Step] = []
    for sub in d.dependencies:
        kind = _DEPENDENCIES.get(sub.call)
        if kind is None or sub.name is None:
            return None
        steps.append((sub.name, kind))
    if d.request_param_name:
        steps.append((d.request_param_name, "request"))
    if d.path_params:
        steps.append(("", "path"))
    if d.body_params:
        body = route.body_field
        if (
            len(d.body_params) != 1
            or body is None
            or route._embed_body_fields
            or isinstance(body.field_info, Form)
            or _json_validator(body) is None
        ):
            return None
        steps.append((body.name, "body"))
    return steps


class _Fallback(Exception):
    """The direct path declines: FastAPI's handler answers instead."""


def _json_validator(field: Any) -> Callable[[bytes], Any] | None:
    """The body's value from its raw bytes, as FastAPI's handler gets it (``json.loads``, then
    the body field's validator), raising where FastAPI would refuse it; None for a FastAPI
    whose body field has no TypeAdapter (the route then keeps FastAPI's handler).

    The field's own TypeAdapter in pydantic's JSON mode: one pass in Rust instead of
    ``json.loads`` and a second walk. The two agree on every body both take
    (tests/test_direct_route.py compares them); where JSON mode is stricter (a lone surrogate
    escape, a byte-order mark) it raises, and FastAPI's handler answers as it always did."""
    adapter = getattr(field, "_type_adapter", None)
    validate = getattr(adapter, "validate_json", None)
    return validate if callable(validate) else None


def _path_validators(fields: Any) -> list[tuple[str, str, Callable[[Any], Any]]] | None:
    """Per path parameter: its name, the key it comes under in the path and its field's own
    TypeAdapter validator, looked up once when the route is built (FastAPI's
    ``request_params_to_args`` works the field's annotation out again on every request:
    about a third of the direct path's own CPU on the session endpoints). A failure raises (a
    ``ValidationError``), so FastAPI's handler answers with its 422, as it always did. None
    when a field has no TypeAdapter or is not a plain scalar (the route keeps FastAPI's
    handler)."""
    checks: list[tuple[str, str, Callable[[Any], Any]]] = []
    for f in fields:
        adapter = getattr(f, "_type_adapter", None)
        validate = getattr(adapter, "validate_python", None)
        alias = getattr(f, "alias", None) or f.name
        if not callable(validate) or field_annotation_is_sequence(f.field_info.annotation):
            return None
        checks.append((f.name, alias, functools.partial(validate, from_attributes=True)))
    return checks


class DirectRoute(APIRoute):
    """An APIRoute whose handler skips FastAPI's dependency solver when it can (see the
    module); FastAPI's own handler answers everything else."""

    direct: bool = False  # set when the handler is built: the route takes the direct path

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        standard = super().get_route_handler()
        steps = direct_plan(self)
        self.direct = steps is not None
        if steps is None:
            return standard
        call = self.dependant.call
        assert call is not None
        path_fields = self.dependant.path_params
        body_field = self.body_field
        overrides = self.dependency_overrides_provider
        body_value = _json_validator(body_field) if body_field is not None else None
        path_checks = _path_validators(path_fields)
        if path_checks is None:
            self.direct = False
            return standard

        async def solve(request: Request) -> dict[str, Any]:
            values: dict[str, Any] = {}
            svc: Any = None
            for name, kind in steps:
                if kind == "svc":
                    svc = values[name] = await http_deps.services(request)
                elif kind == "who":
                    if svc is None:
                        svc = await http_deps.services(request)
                    key = await http_deps.API_KEY(request)
                    values[name] = await http_deps.agent(key, svc)
                elif kind == "nbytes":
                    values[name] = await http_deps.body_bytes(request)
                elif kind == "request":
                    values[name] = request
                elif kind == "path":
                    params = request.path_params
                    for pname, alias, check in path_checks:
                        raw_value = params.get(alias)
                        if raw_value is None:
                            raise _Fallback
                        values[pname] = check(raw_value)
                else:  # the body
                    raw = await request.body()
                    if not raw or request.headers.get("content-type") != "application/json":
                        raise _Fallback  # FastAPI's content-type rules decide
                    assert body_value is not None
                    values[name] = body_value(raw)
            return values

        async def handler(request: Request) -> Response:
            if overrides is not None and getattr(overrides, "dependency_overrides", None):
                return await standard(request)
            try:
                values = await solve(request)
            except (_Fallback, HTTPException, ValueError):  # ValidationError is a ValueError
                # nothing has run yet: FastAPI's handler answers from the start (401, 422)
                return await standard(request)
            response = await call(**values)
            if not isinstance(response, Response):  # direct_plan checked the annotation
                raise TypeError(
                    f"{self.path}: endpoint returned {type(response).__name__}, not a Response"
                )
            return response

        return handler


def direct_routes_first(routes: list[Any]) -> None:
    """Move the routes that take the direct path to the front of ``routes``, in place, in
    their own order (the router tries routes in order: a hot request stopped matching a dozen
    other paths first). Only the search order changes: no request matches two of the
    service's routes (tests/test_direct_route.py checks every route's path), so each request
    reaches the route it reached before. The OpenAPI document is built from the routes' list:
    ``create_app`` puts them back in declared order while it generates it."""
    direct = [r for r in routes if getattr(r, "direct", False)]
    rest = [r for r in routes if not getattr(r, "direct", False)]
    routes[:] = direct + rest
