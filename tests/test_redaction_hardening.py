"""Issue 10 hardening of the gateway and its redaction rules: linear time on hostile shapes,
no recursion on input depth, lone surrogates, secrets that used to survive, audit paths that
used to keep secret-looking keys, idempotence, window-wise scanning of long values.

Fake secrets are assembled at run time so no credential-looking literal sits in the repo.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import logging
import string
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from context_core.access.auth import KEY_PREFIX, new_key
from context_core.errors import InputTooDeepError
from context_core.gateway.patterns import SCAN_OVERLAP, SCAN_WINDOW, is_secret_key
from context_core.gateway.redaction import redact_text
from context_core.gateway.sanitize import REDACTED, Gateway, install_log_redaction

# ---- fake secrets --------------------------------------------------------------------------
STRIPE = "sk_" + "live_" + "Ab3" * 8
GHP = "gh" + "p_" + "x1Y2" * 6
JWT = "ey" + "JhbGciOiJIUzI1NiJ9" + ".ey" + "JzdWIiOiIxMjM0In0" + ".dBjftJeZ4CVPmB92K27uhb_wW1gF"
SK_PROJ = "sk-" + "proj-" + "Qa1Zx2Wc3Ev4Rb5Tn6Ym7Uk8"
SK_ANT = "sk-" + "ant-api03-" + "Hh7Jj8Kk9Ll0Mm1Nn2Bb3Vv4"
GOOGLE = "AI" + "za" + "Sy" + "D4f5G6h7J8k9L0z1X2c3V4b5N6m7Q8wEr"  # 39 characters
GITLAB = "gl" + "pat-" + "Zx9Cv8Bn7Mq6Wr5Ty4Ui"
HF = "hf" + "_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
SLACK_PATH = "T0" + "1ABCDEF2/B0" + "3GHIJKL4/" + "Xy12Zw34Vu56Ts78Rq90PoNm"
SLACK_HOOK = "https://hooks.slack.com/services/" + SLACK_PATH
PGP = (
    "-----BEGIN PGP " + "PRIVATE KEY BLOCK-----\n\n"
    "lQOYBGV7xQ8BCAC9Zk2pQe4Rr7\nWm1Xv0Yt3Ub6Nc9Ld2Ha5Jf8\n=Kq3T\n"
    "-----END PGP " + "PRIVATE KEY BLOCK-----"
)
ID_SPACED = "110101 19900307 1234"  # 6-8-4 groups with a real birth date (checksum not needed)


def gw(**kw: Any) -> Gateway:
    return Gateway(**kw)


def rendered(g: Gateway, out: Any) -> str:
    """Everything that could be stored or logged: the data and the audit trail."""
    return (
        json.dumps(out, ensure_ascii=False, default=repr)
        + repr(out)
        + "".join(r.to_json() + repr(r) for r in g.recent_audit)
    )


# ---- 1. linear time ------------------------------------------------------------------------
SIZE = 256 * 1024


def _rep(unit: str, size: int = SIZE) -> str:
    return (unit * (size // len(unit) + 1))[:size]


MIXED_UNITS = ("eyJ", "a.", "tokens=", "sk-", "@", "0123456789", "-----BEGIN ", '{"a":[')
SHAPES: dict[str, Callable[[int], str]] = {
    "eyJ": lambda n: _rep("eyJ", n),
    "a.": lambda n: _rep("a.", n),
    "tokens=": lambda n: _rep("tokens=", n),
    "sk-": lambda n: _rep("sk-", n),
    "@": lambda n: _rep("@", n),
    "digit run": lambda n: _rep("0123456789", n),
    "digit groups": lambda n: _rep("13 1234 ", n),
    "-----BEGIN ": lambda n: _rep("-----BEGIN ", n),
    "json-ish brackets": lambda n: _rep('{"a":[', n),
    "balanced deep json": lambda n: "[" * (n // 2) + "]" * (n // 2),
    "a://": lambda n: _rep("a://", n),
    "password=": lambda n: _rep("password=", n),
    "Bearer ": lambda n: _rep("Bearer ", n),
    "passed=": lambda n: _rep("passed=", n),
    "base64 words": lambda n: _rep("dGhpcyBpcyBqdXN0IHRleHQ= ", n),
    # the cue-word rule and the look-alike path (tests/test_secret_kinds.py)
    "key ": lambda n: _rep("key ", n),
    "key=": lambda n: _rep("key=", n),
    "password is ": lambda n: _rep("password is ", n),
    "cyrillic password: ": lambda n: _rep("p\u0430ssw\u043erd: x ", n),
    "cue + long runs": lambda n: _rep("secret key is " + "Zq8xW3pL" * 500 + " ", n),
    "telegram anchor": lambda n: _rep("12345678:", n),
    "mixed": lambda n: "".join(_rep(u, n // 8) for u in MIXED_UNITS),
}


def _clean_time(g: Gateway, body: str) -> float:
    t0 = time.perf_counter()
    # balanced deep JSON text is refused, which is also an answer in time
    with contextlib.suppress(InputTooDeepError):
        g.clean({"result": body}, where="redos")
    return time.perf_counter() - t0


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_adversarial_shape_completes_quickly(shape: str) -> None:
    # Catastrophic backtracking takes seconds to hours on these: 2 s is a generous bound for
    # a few milliseconds of work, so this guard does not flake on a busy machine.
    body = SHAPES[shape](SIZE)
    assert len(body) >= SIZE - 8
    assert _clean_time(gw(), body) < 2.0


@pytest.mark.parametrize("shape", ["eyJ", "tokens=", "key=", "cyrillic password: "])
def test_historically_bad_shapes_scale_linearly(shape: str) -> None:
    # n against 4n: linear is 4x, quadratic 16x. The two sizes are timed interleaved and the
    # best of five kept, so a burst of load from a neighbour on a shared machine (which once
    # made a 3 ms run take 13 ms in a 2x comparison) cannot pass for a quadratic blow-up.
    g = gw()
    small, big = SHAPES[shape](SIZE), SHAPES[shape](4 * SIZE)
    t1 = t2 = float("inf")
    for _ in range(5):
        t1 = min(t1, _clean_time(g, small))
        t2 = min(t2, _clean_time(g, big))
    assert t2 < 10 * t1, (t1, t2)


def test_reported_cases() -> None:
    t0 = time.perf_counter()
    assert redact_text("eyJ" * 40000) == ("eyJ" * 40000, [])  # was 5.8 s (16 s in the service)
    assert time.perf_counter() - t0 < 1.0
    assert redact_text("tokens=" * 1100)[1] == []  # was a RecursionError
    assert (
        gw()
        .clean_text("tokens=" * 1100 + "api_key=Zz9abc", where="t")
        .endswith(f"api_key={REDACTED}")
    )


# ---- 2. depth, recursion, surrogates -------------------------------------------------------
def _nested_list(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [250, 100_000])
def test_deep_structures_raise_a_clear_error_before_anything_is_stored(
    depth: int, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    g = gw(audit_path=audit)
    deep = _nested_list(depth)
    with pytest.raises(InputTooDeepError, match="nested deeper than 200 levels"):
        g.clean({"password": "p1", "deep": deep}, where="t")
    text = "[" * depth + "1" + "]" * depth
    for call in (
        lambda: g.clean({"token": "t1", "body": text}, where="t"),
        lambda: g.clean_text(text, where="t"),
        lambda: g.clean_response({"body": text}, where="t"),
        lambda: g.clean({"body": '{"a":' * depth + "1" + "}" * depth}, where="t"),
    ):
        with pytest.raises(InputTooDeepError) as info:
            call()
        assert isinstance(info.value, ValueError)  # the service maps it to 422
    assert g.recent_audit == ()  # the password/token findings of the refused calls: not kept
    assert not audit.exists()


def test_deep_but_unbalanced_json_ish_text_is_cleaned_as_text() -> None:
    text = '{"a":[' * 5000 + ' api_key="Zz9abc1234"'
    out = gw().clean_text(text, where="t")
    assert "Zz9abc1234" not in out
    assert out.startswith('{"a":[{"a":[')


def test_recursion_error_from_a_deep_caller_stack_is_reported_as_input_too_deep() -> None:
    g = gw()
    value: Any = {"password": "p1"}
    for _ in range(150):
        value = {"a": value}

    def descend(n: int) -> Any:
        if n == 0:
            return g.clean(value, where="t")
        return descend(n - 1)

    room = sys.getrecursionlimit() - len(_stack()) - 60
    with pytest.raises(InputTooDeepError):
        descend(room)


def _stack() -> list[Any]:
    import inspect

    return inspect.stack(0)


def test_logging_a_too_deep_structure_drops_the_message_instead_of_raising() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("test.redaction.deep")
    logger.handlers[:] = [logging.StreamHandler(stream)]
    logger.propagate = False
    install_log_redaction(gw(), logger)
    logger.warning("payload %s", _nested_list(300))
    assert "log message dropped" in stream.getvalue()
    assert "nested deeper than 200" in stream.getvalue()


def test_lone_surrogates_are_replaced_and_encode(system_redis_url: str) -> None:
    g = gw()
    data = {"s": "a\ud800b", "\udc00key": ["x\udfff", "\ud800"], "j": '{"k": "\\ud800"}'}
    out = g.clean(data, where="t")
    encoded = json.dumps(out, ensure_ascii=False).encode("utf-8")  # strict: would raise
    assert "\ufffd" in out["s"]
    assert out["\ufffdkey"] == ["x\ufffd", "\ufffd"]
    assert json.loads(out["j"]) == {"k": "\ufffd"}  # an escaped surrogate in JSON text too
    assert g.clean_text("\ud800", where="t") == "\ufffd"
    assert redact_text("\udbff" * 3)[0] == "\ufffd" * 3
    client = redis.Redis.from_url(system_redis_url)
    key = f"test:redaction:{uuid.uuid4().hex}"
    try:
        client.set(key, json.dumps(out, ensure_ascii=False), ex=60)
        assert client.get(key) == encoded
    finally:
        client.delete(key)
        client.close()


# ---- 3. secrets that survived before -------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{PGP}\nafter", f"{REDACTED}\nafter"),
        ("postgres://user:pa/ss@host/db", f"postgres://user:{REDACTED}@host/db"),
        ("redis://:a/b:c@h:6379/0", f"redis://:{REDACTED}@h:6379/0"),
        (f"key {SK_PROJ} end", f"key {REDACTED} end"),
        (f"key={SK_ANT}", f"key={REDACTED}"),
        (f"google {GOOGLE}.", f"google {REDACTED}."),
        (f"gitlab {GITLAB}", f"gitlab {REDACTED}"),
        (f"hf {HF}", f"hf {REDACTED}"),
        (f"hook {SLACK_HOOK} x", f"hook https://hooks.slack.com/services/{REDACTED} x"),
        ("X-Auth-Key: abc123", f"X-Auth-Key: {REDACTED}"),
        ("passcode=123456", f"passcode={REDACTED}"),
        ("pin: 4321", f"pin: {REDACTED}"),
        ("Ocp-Apim-Subscription-Key: zz99", f"Ocp-Apim-Subscription-Key: {REDACTED}"),
        ("auth_key=qq11", f"auth_key={REDACTED}"),
        ("пароль=секрет1", f"пароль={REDACTED}"),
        ("ｐａｓｓｗｏｒｄ＝hunter2", f"ｐａｓｓｗｏｒｄ＝{REDACTED}"),  # key text kept as written
        ("密码：abc123", f"密码：{REDACTED}"),
        ("口令=abc123", f"口令={REDACTED}"),
        ("电话：１３８１２３４５６７８，好", "电话：１３８****５６７８，好"),
        ("138.1234.5679", "138****5679"),
        ("138-1234-5679", "138****5679"),
        ("138 1234 5679", "138****5679"),
        ("tel13912341234", "tel139****1234"),
        ("+86 139 1234 1234", "+86 139****1234"),
        (f"id {ID_SPACED}", "id 110101 ******** 1234"),
        ("id 110101-19900307-1234", "id 110101-********-1234"),
        ("mail a＠example.com", "mail a***@example.com"),
        ("mail john.doe＠example．com", "mail j***@example．com"),
        ("[('password', 'hunter2x')]", f"[('password', '{REDACTED}')]"),
        ('[["token", "abc123"]]', f'[["token", "{REDACTED}"]]'),
    ],
)
def test_secrets_that_used_to_survive(text: str, expected: str) -> None:
    g = gw()
    assert g.clean_text(text, where="t") == expected
    assert g.clean_text(expected, where="t") == expected  # idempotent


def test_new_shapes_leave_responses_and_audit_clean(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    g = gw(audit_path=audit, max_response_bytes=100_000)
    response = {
        "tool": "deploy",
        "stdout": f"{PGP}\nwebhook {SLACK_HOOK}\nOPENAI_API_KEY={SK_PROJ}\nhf {HF} gl {GITLAB}",
        "env": [["PGPASSWORD", "pa/ss-Word1"], ["HOME", "/root"]],
        "db": "postgres://app:pa/ss-Word1@db.internal:5432/app",
    }
    out = g.clean_response(response, where="api:deploy")
    stored = rendered(g, out) + audit.read_text(encoding="utf-8")
    for raw in ("lQOYBGV7", SLACK_PATH, SK_PROJ, HF, GITLAB, "pa/ss-Word1"):
        assert raw not in stored
    assert out["env"][1] == ["HOME", "/root"]


def test_service_api_keys_are_redacted() -> None:
    key = new_key()
    assert key.startswith(KEY_PREFIX)
    g = gw()
    assert g.clean_text(f"X-API-Key {key}", where="t") == f"X-API-Key {REDACTED}"
    assert g.clean({"note": f"use {key} now"}, where="t") == {"note": f"use {REDACTED} now"}


@pytest.mark.parametrize(
    "key",
    [
        "X-Auth-Key",
        "passcode",
        "pin",
        "Ocp-Apim-Subscription-Key",
        "auth_key",
        "пароль",
        "Пароль",
        "ｐａｓｓｗｏｒｄ",
        "ＡＰＩ＿ＫＥＹ",
        "密码",
        "口令",
        "userPin",
        "dbPass",
    ],
)
def test_new_secret_key_names(key: str) -> None:
    assert is_secret_key(key)
    assert gw().clean({"x": {key: "v-1"}}, where="t") == {"x": {key: REDACTED}}


@pytest.mark.parametrize("key", ["pinned", "spin", "passed", "bypass", "pin_count", "tokens"])
def test_lookalike_key_names_are_kept(key: str) -> None:
    assert not is_secret_key(key)


def test_base64_wrapped_secrets() -> None:
    g = gw()
    for inner in (f"password=Hunter2x{'y' * 8}", f"token {STRIPE}", f"cfg {{'api_key': '{GHP}'}}"):
        token = base64.b64encode(inner.encode()).decode()
        urlsafe = base64.urlsafe_b64encode(inner.encode()).decode().rstrip("=")
        for tok in (token, urlsafe):
            out = g.clean_text(f"blob {tok} end", where="t")
            assert out == f"blob {REDACTED} end", inner
    twice = base64.b64encode(base64.b64encode(f"secret={GHP}".encode())).decode()
    assert g.clean_text(twice, where="t") == REDACTED
    harmless = base64.b64encode(b"just some ordinary words here").decode()
    assert g.clean_text(f"blob {harmless}", where="t") == f"blob {harmless}"


def test_secret_pairs_in_structures() -> None:
    g = gw()
    data = {
        "headers": [["Authorization", "Basic Zm9vOmJhcg=="], ["Accept", "text/plain"]],
        "pairs": [("password", "hunter2x"), ("user", "bob")],
        "plain": ["password", "username", "email"],
    }
    out = g.clean(data, where="t")
    assert out["headers"] == [["Authorization", REDACTED], ["Accept", "text/plain"]]
    assert out["pairs"] == [("password", REDACTED), ("user", "bob")]
    assert out["plain"] == ["password", "username", "email"]  # three names, not a pair
    assert g.clean(out, where="t") == out


def test_placeholders_are_never_taken_for_values() -> None:
    for text in (
        f"password={REDACTED}",
        f"password=[{REDACTED}]",
        f"password={{{REDACTED}}}",
        f'"password": "{REDACTED}"',
        f"Authorization: Bearer {REDACTED}",
        f"postgres://u:{REDACTED}@h/db",
        "phone 138****1234, mail j***@example.com, card ************1111",
    ):
        assert redact_text(text) == (text, [])
    out, _ = redact_text("password=[x1, y2]")
    assert out == f"password=[{REDACTED}]"
    assert redact_text(out) == (out, [])


# ---- 4. secret-looking mapping keys ----------------------------------------------------------
def test_secret_looking_keys_are_renamed_and_audited_by_hash(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    g = gw(audit_path=audit)
    data = {
        STRIPE: 1,
        GHP: "x",
        "john.doe@example.com": {"password": "p1", "n": 2},
        "13812341234": 3,
        "ok": {f"note {JWT}": True},
    }
    out = g.clean(data, where="l2")
    labels = [k for k in out if k.startswith("<key:")]
    assert len(labels) == 2
    assert out["j***@example.com"] == {"password": REDACTED, "n": 2}
    assert out["138****1234"] == 3
    assert list(out["ok"]) == [k for k in out["ok"] if k.startswith("<key:")]
    stored = rendered(g, out) + audit.read_text(encoding="utf-8")
    for raw in (STRIPE, GHP, "john.doe", "13812341234", JWT, "p1"):
        assert raw not in stored
    paths = [f.path for f in g.recent_audit[-1].findings]
    assert all("<key:" in p for p in paths), paths
    assert any(p.endswith("].password") for p in paths)
    assert g.clean(out, where="l2") == out  # renamed keys are clean


def test_masked_key_collisions_fall_back_to_hash_labels() -> None:
    out = gw().clean({"13812341234": 1, "138****1234": 2, "13899991234": 3}, where="t")
    assert out["138****1234"] == 2
    assert sorted(v for k, v in out.items() if k.startswith("<key:")) == [1, 3]


def test_keys_inside_json_strings_and_secret_subtrees() -> None:
    g = gw()
    body = json.dumps({STRIPE: {"a": 1}})
    out = g.clean({"body": body, "password": {GHP: "v"}}, where="t")
    assert STRIPE not in out["body"] and GHP not in json.dumps(out)
    assert next(iter(json.loads(out["body"]))).startswith("<key:")
    assert list(out["password"].values()) == [REDACTED]


# ---- 5. window-wise scanning of long values --------------------------------------------------
WINDOW_SNIPPET = (
    f"jwt {JWT} key {STRIPE} url postgres://svc:Pw0rd/x@db:5432/x api_key='Zz9long' "
    f"mail Ada.Lovelace@example.com phone +86 138-1234-5678 id {ID_SPACED} "
    "card 4111 1111 1111 1111 "
    f"blob {base64.b64encode(b'password=Hunter2x').decode()} {PGP} tail"
)


@pytest.mark.parametrize(
    "offset",
    sorted(
        {
            SCAN_WINDOW - d
            for d in (1, 7, 64, 128, 200, 256, 300, 1024, 2048, 4096, 4160, 8192, SCAN_OVERLAP)
        }
        | {SCAN_WINDOW - SCAN_OVERLAP - 3, SCAN_WINDOW + 5, 2 * SCAN_WINDOW - SCAN_OVERLAP - 11}
    ),
)
def test_secrets_straddling_a_window_edge_are_matched_as_in_one_scan(offset: int) -> None:
    alone, hits = redact_text(WINDOW_SNIPPET)
    assert len(hits) >= 10
    pad = _rep("ab ", offset - 1) + " "
    padded, padded_hits = redact_text(pad + WINDOW_SNIPPET + " " + _rep("cd ", SCAN_WINDOW))
    assert padded[: len(pad)] == pad
    assert padded[len(pad) : len(pad) + len(alone)] == alone
    assert sorted(padded_hits) == sorted(hits)


def test_a_long_private_key_block_across_windows_goes_whole() -> None:
    body = "\n".join("Mh" + f"{i:05d}" + "Qz" * 30 for i in range(700))  # ~45 KB
    block = "-----BEGIN " + "RSA PRIVATE KEY-----\n" + body + "\n-----END " + "RSA PRIVATE KEY-----"
    for pad in (SCAN_WINDOW - SCAN_OVERLAP - 10, SCAN_WINDOW - 100):
        out, _ = redact_text(_rep("ab ", pad) + block + " tail")
        assert out.endswith(f"{REDACTED} tail") and "Mh00" not in out
        unterminated, _ = redact_text(_rep("ab ", pad) + block[: len(block) // 2])
        assert "Mh00" not in unterminated  # no END: redacted to the end of the text


# ---- 6. properties: idempotence, nothing planted survives ----------------------------------
FILLER = st.text(alphabet=string.ascii_lowercase + " .,!?设备压力", max_size=24)
ALNUM = string.ascii_letters + string.digits
SEPARATORS = st.sampled_from([" ", "\n", ", ", "; ", "\t", " (", ") ", " | "])
PROP = hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NEW_SECRET_KEYS = [
    "X-Auth-Key",
    "passcode",
    "pin",
    "Ocp-Apim-Subscription-Key",
    "auth_key",
    "пароль",
    "ｐａｓｓｗｏｒｄ",
    "密码",
    "口令",
    "password",
    "api_key",
]
FULLWIDTH = str.maketrans({c: chr(ord(c) + 0xFEE0) for c in string.digits + "@"})


def needle(alphabet: str = ALNUM, min_size: int = 10, max_size: int = 30) -> Any:
    """Always an upper-case letter and a digit: the filler can never re-create it."""
    body = st.text(alphabet=alphabet, min_size=min_size - 2, max_size=max_size - 2)
    return st.tuples(
        st.sampled_from(string.ascii_uppercase), body, st.sampled_from(string.digits)
    ).map("".join)


def _digits(n: int) -> Any:
    return st.text(alphabet=string.digits, min_size=n, max_size=n)


@st.composite
def planted(draw: Any) -> tuple[str, list[str]]:
    """One secret of the new kinds as free text, and the substrings that must not survive."""
    kind = draw(st.integers(0, 15))
    if kind == 0:
        lines = draw(st.lists(needle(ALNUM + "+/", 16, 64), min_size=1, max_size=3))
        block = "PGP " + "PRIVATE KEY BLOCK"
        return f"-----BEGIN {block}-----\n\n" + "\n".join(lines) + f"\n-----END {block}-----", lines
    if kind == 1:
        pw = draw(needle(ALNUM + "-_.~!$*", 6, 16)) + "/" + draw(needle(ALNUM, 4, 10))
        scheme = draw(st.sampled_from(["postgres", "postgresql", "redis", "amqp", "https"]))
        return f"{scheme}://svc:{pw}@db.internal:5432/x", [pw]
    if kind == 2:
        body = draw(needle(ALNUM + "-_", 20, 60))
        return draw(st.sampled_from(["sk-proj-", "sk-ant-api03-", "sk-svcacct-"])) + body, [body]
    if kind == 3:
        body = draw(needle(ALNUM + "-_", 35, 35))
        return "AIza" + body, [body]
    if kind == 4:
        body = draw(needle(ALNUM + "-_", 20, 40))
        return "glpat-" + body, [body]
    if kind == 5:
        body = draw(needle(ALNUM, 34, 34))
        return "hf_" + body, [body]
    if kind == 6:
        tail = draw(needle(ALNUM, 24, 24))
        path = f"T{draw(_digits(8))}/B{draw(_digits(8))}/{tail}"
        return "https://hooks.slack.com/services/" + path, [tail]
    if kind == 7:
        key = new_key()
        return key, [key[len(KEY_PREFIX) :]]
    if kind == 8:
        key = draw(st.sampled_from(NEW_SECRET_KEYS))
        sep = draw(st.sampled_from(["=", ": ", " = ", "：", "＝"]))
        value = draw(needle())
        if draw(st.booleans()):
            return f'"{key}"{sep}"{value}"', [value]
        return f"{key}{sep}{value}", [value]
    if kind == 9:
        num = "1" + draw(st.sampled_from("3456789")) + draw(_digits(9))
        shown = draw(
            st.sampled_from(
                [
                    num,
                    f"{num[:3]}.{num[3:7]}.{num[7:]}",
                    f"{num[:3]}-{num[3:7]}-{num[7:]}",
                    f"{num[:3]} {num[3:7]} {num[7:]}",
                    num.translate(FULLWIDTH),
                ]
            )
        )
        prefix = draw(st.sampled_from(["", "tel", "+86 ", "0086 ", "电话："]))
        return prefix + shown, [num[3:7] + num[7:], shown[3:] if len(shown) == 11 else num]
    if kind == 10:
        year = draw(st.integers(1950, 2010))
        date = f"{year}{draw(st.integers(1, 12)):02d}{draw(st.integers(1, 28)):02d}"
        region = draw(st.sampled_from("123456789")) + draw(_digits(5))
        sep = draw(st.sampled_from([" ", "-"]))
        return f"{region}{sep}{date}{sep}{draw(_digits(4))}", [date]
    if kind == 11:
        local = draw(needle(ALNUM + "._", 3, 16))
        at = draw(st.sampled_from(["@", "＠"]))
        return f"{local}{at}example.com", [local]
    if kind == 12:
        value = draw(needle())
        inner = draw(st.sampled_from([f"password={value}", f"api_key: {value}", f"token={value}"]))
        wrapped = base64.b64encode(inner.encode()).decode()
        return wrapped, [wrapped, value]
    if kind == 13:
        key = draw(st.sampled_from(NEW_SECRET_KEYS))
        value = draw(needle())
        q = draw(st.sampled_from(['"', "'"]))
        return f"[[{q}{key}{q}, {q}{value}{q}]]", [value]
    if kind == 14:
        body = draw(needle(ALNUM, 20, 30))
        return draw(st.sampled_from(["ghp_", "sk_live_"])) + body, [body]
    sig = draw(needle(ALNUM + "-_", 10, 40))
    return "eyJ" + draw(needle(ALNUM)) + ".eyJ" + draw(needle(ALNUM)) + "." + sig, [sig]


@st.composite
def in_context(draw: Any) -> tuple[Any, list[str]]:
    """A planted secret in random text, in a JSON object, in a list, or under a secret key."""
    text, needles = draw(planted())
    sentence = draw(FILLER) + draw(SEPARATORS) + text + draw(SEPARATORS) + draw(FILLER)
    shape = draw(st.integers(0, 4))
    if shape == 0:
        return sentence, needles
    if shape == 1:
        return json.dumps({"note": sentence, "n": 1}), needles
    if shape == 2:
        return [draw(FILLER), sentence, {"items": [sentence]}], needles
    if shape == 3:
        key = draw(st.sampled_from(NEW_SECRET_KEYS))
        value = draw(needle())
        return {key: value, "note": sentence}, [*needles, value]
    key = draw(st.sampled_from(NEW_SECRET_KEYS))
    value = draw(needle())
    return [[key, value], ("note", sentence)], [*needles, value]


@PROP
@given(in_context())
def test_property_no_planted_secret_survives(case: tuple[Any, list[str]]) -> None:
    value, needles = case
    before = copy.deepcopy(value)
    g = gw()
    out = g.clean(value, where="prop")
    assert value == before
    stored = rendered(g, out)
    for n in needles:
        assert n not in stored, f"leaked {n!r} from {value!r}"
    assert g.recent_audit, "secrets removed but nothing audited"


ATOMS = [
    *"aZ09 =:\"'@.-_[]{}()\\/+,;\n\t#?&*",
    *("password", "token", "Bearer ", "Basic ", "eyJ", "sk-", "sk_live_", "api_key", "://"),
    *("13812341234", "１３８", "＠", "：", REDACTED, "***", "pass", "tel", "+86 ", "110101"),
    *("19900307", "4111", "AKIA", "ghp_", "xoxb-", "-----BEGIN RSA PRIVATE KEY-----"),
    *("-----END RSA PRIVATE KEY-----", "hooks.slack.com/services/", "ctxk_", "密码", "пароль"),
    *("ｐａｓｓ", "cGFzc3dvcmQ9aHVudGVyMng=", "hunter2X", "Ab3Ab3Ab3Ab3Ab3Ab3Ab3Ab3", "x.com"),
    *("\ud800", "\udfff", "[[", "]]", "{", "Zz9", "example.com", " 1234 ", "0086"),
    # cue words, connectors, a high-entropy token, look-alikes (the cue-word rule)
    *("key", "secret ", " is ", "Zk8pQ2rX9vB4nM7tL1wC6yH3", "p\u0430ssw\u043erd", "\u200b"),
    *("%3D", "</", "<password>", "&x=", ";Server=", "密码是", "hunter22!", "\n  "),
]
DENSE_TEXT = st.lists(st.sampled_from(ATOMS), max_size=40).map("".join)


@PROP
@given(st.one_of(st.text(max_size=200), DENSE_TEXT))
def test_property_redaction_is_idempotent(text: str) -> None:
    once, _ = redact_text(text)
    assert redact_text(once) == (once, [])
    once.encode("utf-8")  # no lone surrogate survives


@PROP
@given(in_context())
def test_property_gateway_clean_is_idempotent(case: tuple[Any, list[str]]) -> None:
    g = gw()
    once = g.clean(case[0], where="t")
    assert g.clean(once, where="t") == once
