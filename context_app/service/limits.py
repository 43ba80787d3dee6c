"""Wire limits of the HTTP API, checked without recursion.

Hostile input is deep, long or malformed; each of those used to reach a recursive parser
(Python's ``json`` decodes nested arrays by recursion, the gateway walks values by recursion)
and come back as a 500 or a reset connection. Two checks stop it first, both in linear time
and with no recursion at all:

* :func:`raw_body_problem` runs on the raw request body in the body-size middleware, before
  any JSON parsing: the body must be UTF-8 and nest at most :data:`MAX_BODY_DEPTH` brackets
  (free-form depth plus the API's own envelope). It names the object keys on the way to the
  first too-deep bracket, so the 422 says which field it was.
* :func:`check_json` validates one free-form field (tool args and results, contract fields,
  ``api_params`` ...) after parsing: at most :data:`MAX_JSON_DEPTH` levels, counting the
  nesting of strings that hold JSON themselves (the gateway parses those too),
  :data:`MAX_CONTAINER_ITEMS` items per object/array, :data:`MAX_JSON_NODES` values in all,
  strings of at most :data:`MAX_STRING_CHARS` characters and no lone UTF-16 surrogate
  (``"\\ud800"`` is valid JSON but not encodable text; nothing downstream could store it).

Errors are pydantic's, so the service's usual 422 body names the field (``loc``), the limit
(``limit``) and where inside the value it was hit (``msg``); the input is never echoed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic_core import PydanticCustomError

from context_core.session.wire import check_unicode  # the wire state's check too: one definition

__all__ = [
    "MAX_BODY_DEPTH",
    "MAX_CONTAINER_ITEMS",
    "MAX_JSON_DEPTH",
    "MAX_JSON_NODES",
    "MAX_STRING_CHARS",
    "check_json",
    "check_text",
    "check_unicode",
    "raw_body_problem",
    "safe_key",
    "text_json_depth",
]

MAX_JSON_DEPTH = 32
"""Deepest nesting of one free-form field (``[[1]]`` is 2)."""

MAX_BODY_DEPTH = MAX_JSON_DEPTH + 8
"""Deepest nesting of a whole request body: a free-form field plus the API's envelope."""

MAX_CONTAINER_ITEMS = 10_000
"""Most items one object or array of a free-form field may hold."""

MAX_JSON_NODES = 100_000
"""Most values (containers, keys' values, items) in one free-form field."""

MAX_STRING_CHARS = 256 * 1024
"""Longest string (or object key) in a free-form field, in characters."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_RAW_TOKENS = re.compile(rb'[\[\]{}:"]')
# A string literal, escapes honoured; possessive (no backtracking), and an unterminated one
# runs to the end of the input, so every match consumes what it scanned: linear overall.
_RAW_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.S)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_TEXT_TOKENS = re.compile(r'[\[\]{}"]')
_TEXT_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.S)
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,31}\Z")
_LOOKS_LIKE_JSON = '{["'


def safe_key(key: str) -> str:
    """An object key as it may appear in an error: short plain names that the redaction
    rules leave alone; anything else (it could be data, even a secret) becomes ``?``."""
    from context_core.gateway.redaction import redact_text

    if _PLAIN_KEY.match(key) and redact_text(key)[0] == key:
        return key
    return "?"


def _surrogate_at(text: str) -> int:
    if text.isascii():
        return -1
    m = _SURROGATE.search(text)
    return -1 if m is None else m.start()


def check_text(value: str) -> str:
    """A typed string field: :func:`check_unicode`, and in text the gateway would parse as
    JSON, no nesting deeper than :data:`MAX_JSON_DEPTH`."""
    check_unicode(value)
    if len(value) >= 2 and value.lstrip()[:1] in _LOOKS_LIKE_JSON:
        depth = text_json_depth(value, MAX_JSON_DEPTH)
        if depth > MAX_JSON_DEPTH:
            raise PydanticCustomError(
                "json_too_deep",
                "string holds JSON nested more than {limit} levels deep",
                {"limit": MAX_JSON_DEPTH},
            )
    return value


# --- raw body ---------------------------------------------------------------------------------


def _max_bracket_depth(body: bytes, enough: int) -> int:
    """Deepest bracket nesting outside string literals, at C speed: strings removed by one
    regex pass, brackets kept, running depth by a cumulative sum."""
    if body.count(b"[") + body.count(b"{") <= enough:
        return 0  # cannot nest deeper than it has brackets
    brackets = _RAW_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= enough:
        return 0
    import numpy as np

    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == 0x5B) | (codes == 0x7B), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max())


def raw_body_problem(body: bytes, max_depth: int = MAX_BODY_DEPTH) -> dict[str, Any] | None:
    """``None`` for a body that is UTF-8 and nests at most ``max_depth`` brackets, else one
    error in pydantic's shape (``loc``/``msg``/``type``/``ctx``). One pass, no recursion,
    stops at the first bracket too deep; string contents are skipped, escapes honoured."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return {
            "type": "json_invalid",
            "loc": ("body", e.start),
            "msg": f"request body is not valid UTF-8 (byte {e.start}); send UTF-8 JSON",
        }
    if _max_bracket_depth(body, max_depth) <= max_depth:
        return None
    # Too deep: walk again, slowly, only to name the keys on the way to the deep bracket.
    # per open container: (start, end) of the key being filled, rendered only on error
    keys: list[tuple[int, int] | None] = []
    last_str = (0, 0)
    pos = 0
    search, string_at = _RAW_TOKENS.search, _RAW_STRING.match
    while True:
        m = search(body, pos)
        if m is None:
            return None
        i = m.start()
        c = body[i]
        pos = i + 1
        if c == 0x22:  # a string: jump to its end (escapes honoured) in one C-level match
            s = string_at(body, i)
            if s is None:
                return None  # unterminated: the JSON parser reports it
            pos = s.end()
            last_str = (i + 1, pos - 1)
        elif c == 0x3A:  # ':' after a string: that string was the key
            if keys:
                keys[-1] = last_str
        elif c == 0x5B or c == 0x7B:
            keys.append(None)
            if len(keys) > max_depth:
                names = [
                    safe_key(body[a : min(b, a + 64)].decode("utf-8", "replace"))
                    for a, b in (k for k in keys if k is not None)
                ]
                return {
                    "type": "json_too_deep",
                    "loc": ("body", *names[:3]),
                    "msg": f"JSON nested deeper than {max_depth} levels (at byte {i}); "
                    "flatten the value",
                    "ctx": {"limit": max_depth},
                }
        elif keys:
            keys.pop()


# --- one free-form value ----------------------------------------------------------------------


def text_json_depth(text: str, stop_above: int) -> int:
    """How deep the gateway could find ``text`` nested if it parses it as JSON (it does for
    text starting with ``{``, ``[`` or ``"``), string literals that hold JSON included.

    Brackets inside string literals only count when that literal itself looks like JSON, as
    the gateway sees it; they count from the literal's own depth, as :func:`check_json` counts
    a string's inner depth from the string's, so the L1 trace payload made from a value that
    passed :func:`check_json` measures the same here. Linear per level; stops as soon as the
    depth passes ``stop_above``.
    """
    deepest = 0
    work: list[tuple[str, int]] = [(text, 0)]
    while work:
        current, base = work.pop()
        stripped = current.strip()
        if len(stripped) < 2 or stripped[0] not in _LOOKS_LIKE_JSON:
            continue
        depth = base
        pos = 0
        while True:
            m = _TEXT_TOKENS.search(stripped, pos)
            if m is None:
                break
            i = m.start()
            c = stripped[i]
            pos = i + 1
            if c == '"':
                lit = _TEXT_STRING.match(stripped, i)
                if lit is None:
                    break  # unterminated: not JSON, the gateway treats it as plain text
                pos = lit.end()
                literal = lit.group(0)
                if "[" in literal or "{" in literal or '\\"' in literal:
                    try:
                        decoded = json.loads(literal)
                    except ValueError:
                        decoded = None
                    if isinstance(decoded, str):
                        work.append((decoded, depth))
            elif c in "[{":
                depth += 1
                if depth > deepest:
                    deepest = depth
                    if deepest > stop_above:
                        return deepest
            elif depth > base:
                depth -= 1
    return deepest


_Parts = tuple[Any, str | int] | None  # (parent, segment) chain, rendered only on error


def _path(parts: _Parts) -> str:
    segs: list[str | int] = []
    while parts is not None:
        parts, seg = parts
        segs.append(seg)
    out = ["$"]
    for p in reversed(segs):
        out.append(f"[{p}]" if isinstance(p, int) else f".{safe_key(p)}")
    return "".join(out)


def _too(kind: str, what: str, limit: int, parts: _Parts) -> PydanticCustomError:
    return PydanticCustomError(
        kind,
        "{what} at {path}; the limit is {limit}",
        {"what": what, "path": _path(parts), "limit": limit},
    )


def _check_string(s: str, parts: _Parts, depth: int, what: str) -> None:
    if len(s) > MAX_STRING_CHARS:
        what = f"{what} of {len(s)} characters"
        raise _too("json_string_too_long", what, MAX_STRING_CHARS, parts)
    pos = _surrogate_at(s)
    if pos >= 0:
        raise PydanticCustomError(
            "string_surrogate",
            "{what} at {path} holds a lone UTF-16 surrogate at character {position}; send "
            "valid Unicode text",
            {"what": what, "path": _path(parts), "position": pos},
        )
    if len(s) >= 2 and s.lstrip()[:1] in _LOOKS_LIKE_JSON:
        inner = text_json_depth(s, MAX_JSON_DEPTH - depth)
        if depth + inner > MAX_JSON_DEPTH:
            raise _too(
                "json_too_deep",
                f"a string holding JSON nested {depth + inner} levels deep",
                MAX_JSON_DEPTH,
                parts,
            )


def check_json(value: Any) -> Any:
    """Validate one parsed free-form JSON value against the limits above (iteratively)."""
    nodes = 0
    stack: list[tuple[Any, int, _Parts]] = [(value, 0, None)]
    while stack:
        v, depth, parts = stack.pop()
        nodes += 1
        if nodes > MAX_JSON_NODES:
            raise _too("json_too_large", "too many values", MAX_JSON_NODES, parts)
        if isinstance(v, str):
            _check_string(v, parts, depth, "a string")
        elif isinstance(v, dict | list):
            if depth + 1 > MAX_JSON_DEPTH:
                raise _too("json_too_deep", "JSON nested too deep", MAX_JSON_DEPTH, parts)
            if len(v) > MAX_CONTAINER_ITEMS:
                kind = "an object" if isinstance(v, dict) else "an array"
                raise _too(
                    "json_too_large", f"{kind} of {len(v)} items", MAX_CONTAINER_ITEMS, parts
                )
            if isinstance(v, dict):
                for k, item in v.items():
                    key = str(k)
                    _check_string(key, (parts, key), depth + 1, "a key")
                    stack.append((item, depth + 1, (parts, key)))
            else:
                stack.extend((item, depth + 1, (parts, i)) for i, item in enumerate(v))
    return value
