"""Hand cases for the sanitize gateway: every key rule, every value pattern, PII, cap, audit.

Fake secrets are assembled at run time so no credential-looking literal sits in the repo.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from context_core.config import get_settings
from context_core.gateway.sanitize import (
    REDACTED,
    AuditRecord,
    Finding,
    Gateway,
    install_log_redaction,
    is_secret_key,
    mask_mobile,
)

# ---- fake secrets, built at run time ------------------------------------------------------
STRIPE = "sk_" + "live_" + "Ab3" * 8
STRIPE_TEST = "sk_" + "test_" + "Zz9" * 8
RESTRICTED = "rk_" + "live_" + "Qw1" * 8
AKIA = "AK" + "IA" + "ABCDEFGH23456789"
ASIA = "AS" + "IA" + "ZYXWVUTS98765432"
AWS_SECRET = "wJalr" + "XUtnFEMI/K7MDENG/bPxRfiCY" + "0123456789"
JWT = "ey" + "JhbGciOiJIUzI1NiJ9" + ".ey" + "JzdWIiOiIxMjM0In0" + ".dBjftJeZ4CVPmB92K27uhb_wW1gF"
GHP = "gh" + "p_" + "x1Y2" * 6
GHO = "gh" + "o_" + "q9W8" * 6
GH_PAT = "github" + "_pat_" + "11AB" * 6 + "_cd"
SLACK = "xo" + "xb-" + "1234567890-abcdefghij"
BEARER_TOK = "tok" + "A1b2C3d4E5f6"
BASIC_B64 = "ZGFuOnMzY3JldC1wdw=="  # base64("dan:s3cret-pw")
PEM = (
    "-----BEGIN " + "RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAx1x2\nq8ZbWn3M0aVd\n"
    "-----END " + "RSA PRIVATE KEY-----"
)
VALID_ID = "11010519491231002X"  # checksum-valid test number (X check digit)


def id_with_check(body17: str) -> str:
    """Append the ISO 7064 MOD 11-2 check character (test-side reimplementation)."""
    total = sum(int(d) * (2 ** (17 - i) % 11) for i, d in enumerate(body17))
    return body17 + "10X98765432"[total % 11]


VALID_ID_DIGIT = id_with_check("11010119900307457")
INVALID_ID = "110105194912310021"
VISA = "4111111111111111"  # classic Luhn-valid test PAN
UNIONPAY = "6222021234567890128"


def gw(**kw: Any) -> Gateway:
    return Gateway(**kw)


def blob(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---- key-based redaction -------------------------------------------------------------------
SECRET_KEYS = [
    "api_key",
    "apikey",
    "api-key",
    "API.KEY",
    "x-api-key",
    "X-Api-Key",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "session_token",
    "refreshToken",
    "ACCESSTOKEN",
    "csrftoken",
    "password",
    "passwd",
    "pwd",
    "dbPassword",
    "DB_PASSWORD_PROD",
    "secret",
    "client_secret",
    "clientSecret",
    "AWS_SECRET_ACCESS_KEY",
    "Authorization",
    "proxy-authorization",
    "Proxy-Authorization",
    "cookie",
    "Set-Cookie",
    "private_key",
    "privateKey",
    "credential",
    "credentials",
    "basic_auth",
    "jwt",
    "密码",
]
HARMLESS_KEYS = [
    "tokens_used",
    "max_tokens",
    "prompt_tokens",
    "total_tokens",
    "token_count",
    "token_type",
    "password_length",
    "tokenizer",
    "session_id",
    "user_id",
    "key",
    "public_key",
    "device_id",
    "auth_method",
    "bypass",
    "passed",
    "",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_key_redacted_at_depth(key: str) -> None:
    value = "plain-value-" + key[:3]
    data = {"a": [{"b": ({key: value},)}]}
    out = gw().clean(data, where="t")
    assert out == {"a": [{"b": ({key: REDACTED},)}]}
    assert is_secret_key(key)


@pytest.mark.parametrize("key", HARMLESS_KEYS)
def test_harmless_key_kept(key: str) -> None:
    assert not is_secret_key(key)
    assert gw().clean({key: "plain value"}, where="t") == {key: "plain value"}


def test_secret_key_subtree_keeps_structure_and_falsy_values() -> None:
    data = {
        "credentials": {"user": "bob", "pw": "x1", "n": 7, "list": ["a", None]},
        "password": None,
        "token": "",
        "secret": True,
    }
    out = gw().clean(data, where="t")
    assert out == {
        "credentials": {"user": REDACTED, "pw": REDACTED, "n": REDACTED, "list": [REDACTED, None]},
        "password": None,
        "token": "",
        "secret": True,
    }


# ---- value patterns ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"key {STRIPE} end", f"key {REDACTED} end"),
        (f"key {STRIPE_TEST}", f"key {REDACTED}"),
        (f"key {RESTRICTED}", f"key {REDACTED}"),
        (f"id={AKIA} x", f"id={REDACTED} x"),
        (f"{ASIA}", REDACTED),
        (f"jwt {JWT} end", f"jwt {REDACTED} end"),
        (f"Authorization: Bearer {BEARER_TOK}", f"Authorization: Bearer {REDACTED}"),
        (f"hdr bearer {BEARER_TOK}.x", f"hdr bearer {REDACTED}"),
        (f"Authorization: Basic {BASIC_B64}", f"Authorization: Basic {REDACTED}"),
        (f"{PEM}\ntrailer", f"{REDACTED}\ntrailer"),
        (f"gh {GHP} {GHO} {GH_PAT}", f"gh {REDACTED} {REDACTED} {REDACTED}"),
        (f"slack {SLACK}", f"slack {REDACTED}"),
        (f"aws_secret_access_key={AWS_SECRET}", f"aws_secret_access_key={REDACTED}"),
        (f"AWS_SECRET_ACCESS_KEY: '{AWS_SECRET}'", f"AWS_SECRET_ACCESS_KEY: '{REDACTED}'"),
        ("login password=hunter2x ok", f"login password={REDACTED} ok"),
        ("token: abc.def rest", f"token: {REDACTED} rest"),
        ('cfg {"api_key": "zzz111"}', f'cfg {{"api_key": "{REDACTED}"}}'),
        ('{"dbPassword":"p@ss w0rd"}', f'{{"dbPassword":"{REDACTED}"}}'),
        ('esc {\\"password\\": \\"s3cr3t\\"}', f'esc {{\\"password\\": \\"{REDACTED}\\"}}'),
        ("密码：abc123456", f"密码：{REDACTED}"),
        ("用户密码：abc123456", f"用户密码：{REDACTED}"),
        ("RuntimeError: api_key=Zz9abc", f"RuntimeError: api_key={REDACTED}"),
        ("tokens: api_key=Zz9abc", f"tokens: api_key={REDACTED}"),
        ("Authorization: Basic notb64", f"Authorization: Basic {REDACTED}"),
        ("redis://user:pa55w0rd@h:6379/0", f"redis://user:{REDACTED}@h:6379/0"),
        ("https://:pw0rd@example.com/x", f"https://:{REDACTED}@example.com/x"),
    ],
)
def test_value_patterns(text: str, expected: str) -> None:
    assert gw().clean_text(text, where="t") == expected


@pytest.mark.parametrize(
    "text",
    [
        "use a bearer token for this endpoint",  # prose, not a credential
        "Basic Troubleshooting steps",  # capitalised word, not base64 user:pass
        "tokens: 512 used, max_tokens=1024",  # counts are not secrets
        "token_count=3",
        "see https://example.com/path?q=1",
        "high throughput, ghost mode",  # 'gh' marker without a token shape
        "order 1700000000000 at epoch ms",  # 13 digits, starts with 1 -> not a card
        "pump PUMP-0042 pressure 3.5 bar",
    ],
)
def test_lookalikes_not_redacted(text: str) -> None:
    assert gw().clean_text(text, where="t") == text


# ---- PII -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("13812341234", "138****1234"),
        ("call 13812341234.", "call 138****1234."),
        ("+86 138-1234-5678", "+86 138****5678"),
        ("8615912345678", "86159****5678"),
        ("tel:+86 19912345678", "tel:+86 199****5678"),
        ("138 1234 5678", "138****5678"),
    ],
)
def test_mobile_masked(text: str, expected: str) -> None:
    assert gw().clean_text(text, where="t") == expected
    assert mask_mobile(text) == expected


@pytest.mark.parametrize("text", ["12812341234", "1381234123", "138123412345", "10086"])
def test_not_mobile(text: str) -> None:
    assert mask_mobile(text) == text


def test_id_number_checksum() -> None:
    g = gw()
    assert g.clean_text(f"ID {VALID_ID}", where="t") == "ID 110105********002X"
    assert g.clean_text(VALID_ID.lower(), where="t") == "110105********002x"
    assert VALID_ID_DIGIT[-1].isdigit()
    assert g.clean_text(VALID_ID_DIGIT, where="t") == "110101********457" + VALID_ID_DIGIT[-1]
    assert id_with_check(VALID_ID[:17]) == VALID_ID
    # Same shape, wrong check digit: left alone (it is some other 18-digit number).
    assert g.clean_text(INVALID_ID, where="t") == INVALID_ID


def test_bank_card_luhn() -> None:
    g = gw()
    assert g.clean_text(f"card {VISA}", where="t") == "card ************1111"
    assert g.clean_text("4111 1111 1111 1111", where="t") == "**** **** **** 1111"
    assert g.clean_text("4111-1111-1111-1111", where="t") == "****-****-****-1111"
    assert g.clean_text(UNIONPAY, where="t") == "***************0128"
    bad = VISA[:-1] + "2"
    assert g.clean_text(bad, where="t") == bad


def test_email_masked() -> None:
    g = gw()
    assert g.clean_text("mail john.doe@example.com.", where="t") == "mail j***@example.com."
    assert g.clean_text("a@b.cn", where="t") == "a***@b.cn"
    assert g.clean_text("user@localhost", where="t") == "user@localhost"


def test_large_int_pii_masked_small_ints_kept() -> None:
    out = gw().clean({"phone": 13812341234, "n": 42, "ts": 1700000000000}, where="t")
    assert out == {"phone": "138****1234", "n": 42, "ts": 1700000000000}


def test_dict_keys_are_cleaned_too() -> None:
    out = gw().clean({"13812341234": {"x": 1}}, where="t")
    assert out == {"138****1234": {"x": 1}}


# ---- size cap --------------------------------------------------------------------------------
def _payload_of_size(n: int) -> dict[str, str]:
    base = len(json.dumps({"d": ""}, separators=(",", ":")).encode())
    return {"d": "x" * (n - base)}


def test_cap_exactly_limit_passes_limit_plus_one_fails() -> None:
    alerts: list[tuple[str, dict[str, Any]]] = []
    g = gw(max_response_bytes=1000, on_alert=lambda w, d: alerts.append((w, d)))
    at = _payload_of_size(1000)
    assert g.clean_response(at, where="api:x") == at
    assert alerts == []
    over = _payload_of_size(1001)
    assert g.clean_response(over, where="api:x") == {"error": "response too large"}
    assert alerts == [("api:x", {"bytes": 1001, "limit": 1000})]
    rec = g.recent_audit[-1]
    assert rec.where == "api:x"
    assert [f.kind for f in rec.findings] == ["oversize"]


def test_cap_counts_utf8_bytes_not_chars() -> None:
    g = gw(max_response_bytes=20)
    # 6 CJK chars = 18 bytes + 2 quotes = 20 bytes: fits; one more char does not.
    assert g.clean_response("设备压力异常", where="t") == "设备压力异常"
    assert g.clean_response("设备压力异常了", where="t") == {"error": "response too large"}


def test_default_cap_is_10_kib_from_settings(tmp_path: Path) -> None:
    g = Gateway.from_settings(get_settings(data_dir=tmp_path))
    assert g.max_response_bytes == 10 * 1024
    assert g.audit_path == tmp_path / "audit" / "audit.jsonl"


def test_alert_failure_does_not_break_cleaning() -> None:
    def boom(where: str, details: dict[str, Any]) -> None:
        raise RuntimeError("pager down")

    g = gw(max_response_bytes=10, on_alert=boom)
    assert g.clean_response("x" * 50, where="t") == {"error": "response too large"}


# ---- audit -----------------------------------------------------------------------------------
def test_audit_has_paths_and_hashes_never_values(tmp_path: Path) -> None:
    audit = tmp_path / "deep" / "dir" / "audit.jsonl"
    g = gw(audit_path=audit)
    data = {
        "headers": {"Authorization": f"Bearer {BEARER_TOK}"},
        "items": [{}, {}, {"note": f"key {STRIPE} phone 13812341234"}],
    }
    g.clean(data, where="l2:api")
    rec = g.recent_audit[-1]
    assert isinstance(rec, AuditRecord)
    assert rec.findings == (
        Finding("$.headers.Authorization", "secret_key", rec.findings[0].value_sha256),
        Finding("$.items[2].note", "secret_value", rec.findings[1].value_sha256),
        Finding("$.items[2].note", "pii_phone", rec.findings[2].value_sha256),
    )
    import hashlib

    assert rec.findings[1].value_sha256 == hashlib.sha256(STRIPE.encode()).hexdigest()[:16]
    text = audit.read_text(encoding="utf-8")
    assert json.loads(text)["findings"][0]["path"] == "$.headers.Authorization"
    for s in (BEARER_TOK, STRIPE, "13812341234", "12341234"):
        assert s not in repr(rec)
        assert s not in rec.to_json()
        assert s not in text


def test_audit_key_switches_to_hmac() -> None:
    import hashlib
    import hmac

    g = gw(audit_key=b"k" * 32)
    g.clean_text("13812341234", where="t")
    expected = hmac.new(b"k" * 32, b"13812341234", hashlib.sha256).hexdigest()[:16]
    assert g.recent_audit[-1].findings[0].value_sha256 == expected


def test_clean_input_writes_no_audit(tmp_path: Path) -> None:
    audit = tmp_path / "a.jsonl"
    g = gw(audit_path=audit)
    assert g.clean({"status": "ok", "n": 3}, where="t") == {"status": "ok", "n": 3}
    assert g.recent_audit == ()
    assert not audit.exists()


def test_audit_tail_is_bounded() -> None:
    g = gw(audit_tail=5)
    for _ in range(12):
        g.clean_text("13812341234", where="t")
    assert len(g.recent_audit) == 5


def test_input_not_mutated() -> None:
    data = {
        "password": "x1",
        "list": [{"note": "13812341234"}, ("t", {"token": "y"})],
        "s": {"a"},
    }
    before = copy.deepcopy(data)
    out = gw().clean(data, where="t")
    assert data == before
    assert out is not data
    assert out["list"] is not data["list"]
    assert out["list"][1] == ("t", {"token": REDACTED})


def test_thread_safety_audit_counts(tmp_path: Path) -> None:
    audit = tmp_path / "a.jsonl"
    g = gw(audit_path=audit, audit_tail=10_000)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(50):
                out = g.clean({"password": f"p{i}-{j}", "t": "13812341234"}, where=f"w{i}")
                assert out == {"password": REDACTED, "t": "138****1234"}
        except BaseException as e:  # pragma: no cover - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(g.recent_audit) == 400
    lines = audit.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 400
    assert all(len(json.loads(line)["findings"]) == 2 for line in lines)


# ---- logging -------------------------------------------------------------------------------
def _capture_logger(name: str) -> tuple[logging.Logger, Any]:
    import io

    stream = io.StringIO()
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger, stream


def test_log_redaction_args_exceptions_and_idempotence() -> None:
    g = gw()
    logger, stream = _capture_logger("test.gateway.logs")
    install_log_redaction(g, logger)
    install_log_redaction(g, logger)  # idempotent
    assert sum(type(f).__name__ == "_RedactionFilter" for f in logger.filters) == 1
    assert sum(type(f).__name__ == "_RedactionFilter" for f in logger.handlers[0].filters) == 1
    logger.info("calling with key %s for %s", STRIPE, "13812341234")
    child = logging.getLogger("test.gateway.logs.child")
    child.warning("child says password=%s", "hunter2x")
    try:
        raise ValueError(f"bad token {JWT}")
    except ValueError:
        logger.exception("failed for %s", "a@example.com")
    out = stream.getvalue()
    for s in (STRIPE, "13812341234", "hunter2x", JWT, "a@example.com"):
        assert s not in out
    assert f"calling with key {REDACTED} for 138****1234" in out
    assert f"child says password={REDACTED}" in out
    assert f"ValueError: bad token {REDACTED}" in out
    assert "failed for a***@example.com" in out
    assert out.count(REDACTED) == 3


def test_log_redaction_root_default() -> None:
    root = logging.getLogger()
    g = gw()
    before = list(root.filters)
    try:
        install_log_redaction(g)
        assert any(type(f).__name__ == "_RedactionFilter" for f in root.filters)
    finally:
        for f in list(root.filters):
            if f not in before:
                root.removeFilter(f)
        for h in root.handlers:
            for f in list(h.filters):
                if type(f).__name__ == "_RedactionFilter":
                    h.removeFilter(f)


def test_from_settings_uses_audit_hmac_key(tmp_path: Path) -> None:
    import hashlib
    import hmac

    key = "k-" + "9" * 30
    g = Gateway.from_settings(get_settings(data_dir=tmp_path, audit_hmac_key=key))
    g.clean_text("13812341234", where="t")
    expected = hmac.new(key.encode(), b"13812341234", hashlib.sha256).hexdigest()[:16]
    assert g.recent_audit[-1].findings[0].value_sha256 == expected
    line = (tmp_path / "audit" / "audit.jsonl").read_text(encoding="utf-8")
    assert key not in line
    assert expected in line


def test_json_inside_strings_cleaned_structurally() -> None:
    g = gw()
    body = json.dumps({"token": {"a": "X1abc-def"}, "n": 1})
    out = g.clean({"body": body}, where="t")
    assert json.loads(out["body"]) == {"token": {"a": REDACTED}, "n": 1}
    assert g.recent_audit[-1].findings[0].path == "$.body.token.a"
    # double-encoded JSON, compact separators preserved
    inner = json.dumps({"password": "Zq9-secret"}, separators=(",", ":"))
    twice = json.dumps({"wrapped": inner}, separators=(",", ":"))
    cleaned = g.clean_text(twice, where="t")
    assert "Zq9-secret" not in cleaned
    assert json.loads(json.loads(cleaned)["wrapped"]) == {"password": REDACTED}
    # JSON-looking text without findings is returned byte-for-byte
    same = '{ "a" :  1 }'
    assert g.clean_text(same, where="t") is same


def test_python_repr_containers_after_secret_keys() -> None:
    text = "payload {'token': {'a': 'X1abc'}, 'pwd': ['Zz9', 'q'], 'ok': 1}"
    assert gw().clean_text(text, where="t") == (
        f"payload {{'token': {{{REDACTED}}}, 'pwd': [{REDACTED}], 'ok': 1}}"
    )


def test_log_args_cleaned_as_structures() -> None:
    g = gw()
    logger, stream = _capture_logger("test.gateway.structured")
    install_log_redaction(g, logger)
    logger.info("payload %s", {"auth": {"nested": {"v": "Zz9-deep"}}, "ok": [1, 2]})
    logger.info({"password": "Qq7-direct"})
    out = stream.getvalue()
    assert "Zz9-deep" not in out
    assert "Qq7-direct" not in out
    assert "'ok': [1, 2]" in out


# ---- property tests ------------------------------------------------------------------------
# Fake secrets are drawn at run time. Each always holds an upper-case letter and a digit, and
# the surrounding filler text is lower-case letters and punctuation only, so a secret that
# shows up in the output can only have leaked through the gateway, never been re-made by filler.
import base64  # noqa: E402
import string  # noqa: E402

from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FILLER_ALPHABET = string.ascii_lowercase + " .,!?"
FILLER = st.text(alphabet=FILLER_ALPHABET, max_size=30)
ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"
SECRET_KEY_NAMES = [
    "api_key",
    "apiKey",
    "x-api-key",
    "token",
    "access_token",
    "refresh.token",
    "id_token",
    "session_token",
    "password",
    "passwd",
    "pwd",
    "dbPassword",
    "secret",
    "client_secret",
    "AWS_SECRET_ACCESS_KEY",
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "private_key",
    "credentials",
]
HARMLESS_KEY_NAMES = [
    "status",
    "data",
    "items",
    "note",
    "message",
    "tokens_used",
    "max_tokens",
    "device_id",
    "session_id",
    "result",
]
PROP_SETTINGS = hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def needle(alphabet: str = ALNUM, min_size: int = 10, max_size: int = 30) -> Any:
    body = st.text(alphabet=alphabet, min_size=min_size - 2, max_size=max_size - 2)
    upper = st.sampled_from(string.ascii_uppercase)
    digit = st.sampled_from(string.digits)
    return st.tuples(upper, body, digit).map(lambda t: t[0] + t[1] + t[2])


@st.composite
def random_case(draw: Any, word: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return "".join(c.upper() if f else c.lower() for c, f in zip(word, flips, strict=True))


def _digits(n: int) -> Any:
    return st.text(alphabet=string.digits, min_size=n, max_size=n)


def _luhn_complete(partial: str) -> str:
    for d in string.digits:
        cand = partial + d
        total = 0
        for i, ch in enumerate(reversed(cand)):
            x = int(ch) * (2 if i % 2 else 1)
            total += x - 9 if x > 9 else x
        if total % 10 == 0:
            return cand
    raise AssertionError("unreachable")


@st.composite
def secret_snippet(draw: Any) -> tuple[str, list[str]]:
    """One secret-bearing snippet of free text, and the substrings that must not survive."""
    kind = draw(
        st.sampled_from(
            [
                "stripe",
                "aws_id",
                "jwt",
                "github",
                "slack",
                "bearer",
                "basic",
                "pem",
                "url",
                "assign",
                "json_assign",
                "aws_secret",
                "phone",
                "id",
                "card",
                "email",
            ]
        )
    )
    if kind == "stripe":
        body = draw(needle(min_size=16))
        return draw(st.sampled_from(["sk_live_", "sk_test_", "rk_live_"])) + body, [body]
    if kind == "aws_id":
        body = draw(needle(string.ascii_uppercase + string.digits, 16, 16))
        s = draw(st.sampled_from(["AKIA", "ASIA"])) + body
        return s, [s]
    if kind == "jwt":
        sig = draw(needle(B64URL, 10, 40))
        s = "eyJ" + draw(needle(B64URL)) + ".eyJ" + draw(needle(B64URL)) + "." + sig
        return s, [s, sig]
    if kind == "github":
        body = draw(needle(min_size=22, max_size=40))
        return draw(st.sampled_from(["ghp_", "gho_", "github_pat_"])) + body, [body]
    if kind == "slack":
        body = draw(needle(ALNUM + "-", 10, 30))
        return draw(st.sampled_from(["xoxb-", "xoxp-", "xoxa-", "xoxr-"])) + body, [body]
    if kind == "bearer":
        tok = draw(needle(ALNUM + "-._~+/", 8, 40))
        return draw(random_case("bearer")) + " " + tok, [tok]
    if kind == "basic":
        user = draw(st.text(alphabet=ALNUM, min_size=1, max_size=12))
        pw = draw(needle(min_size=8))
        b64 = base64.b64encode(f"{user}:{pw}".encode()).decode()
        return "Basic " + b64, [b64]
    if kind == "pem":
        label = draw(st.sampled_from(["RSA ", "EC ", "", "OPENSSH ", "ENCRYPTED "]))
        lines = draw(st.lists(needle(ALNUM + "+/", 16, 64), min_size=1, max_size=4))
        s = (
            f"-----BEGIN {label}PRIVATE KEY-----\n"
            + "\n".join(lines)
            + f"\n-----END {label}PRIVATE KEY-----"
        )
        return s, lines
    if kind == "url":
        pw = draw(needle(ALNUM + "-_.~!$*", 8, 24))
        scheme = draw(st.sampled_from(["https", "redis", "postgresql", "amqp"]))
        return f"{scheme}://svc:{pw}@db.internal:5432/x", [pw]
    if kind == "assign":
        key = draw(random_case(draw(st.sampled_from(SECRET_KEY_NAMES))))
        sep = draw(st.sampled_from(["=", ": ", " = ", ":", "="]))
        v = draw(needle())
        return f"{key}{sep}{v}", [v]
    if kind == "json_assign":
        key = draw(random_case(draw(st.sampled_from(SECRET_KEY_NAMES))))
        v = draw(needle())
        q = draw(st.sampled_from(['"', "'"]))
        return f"{q}{key}{q}: {q}{v}{q}", [v]
    if kind == "aws_secret":
        v = draw(needle(ALNUM + "/+", 40, 40))
        return draw(random_case("aws_secret_access_key")) + "=" + v, [v]
    if kind == "phone":
        num = "1" + draw(st.sampled_from("3456789")) + draw(_digits(9))
        prefix = draw(st.sampled_from(["", "+86 ", "86", "+86-", "0086 "]))
        if draw(st.booleans()):
            shown = f"{num[:3]} {num[3:7]} {num[7:]}"
            return prefix + shown, [num, shown]
        return prefix + num, [num]
    if kind == "id":
        body = draw(st.sampled_from("123456789")) + draw(_digits(16))
        s = id_with_check(body)
        return s, [s]
    if kind == "card":
        start = draw(st.sampled_from(["4", "51", "62", "37", "35"]))
        length = draw(st.integers(13, 19))
        pan = _luhn_complete(start + draw(_digits(length - len(start) - 1)))
        if draw(st.booleans()):
            grouped = " ".join(pan[i : i + 4] for i in range(0, len(pan), 4))
            return grouped, [pan, grouped]
        return pan, [pan]
    local = draw(needle(ALNUM + "._", 3, 20))
    domain = draw(st.sampled_from(["example.com", "corp.example.cn", "mail.test.org"]))
    return f"{local}@{domain}", [f"{local}@{domain}"]


@st.composite
def tree(draw: Any, depth: int = 0) -> tuple[Any, list[str]]:
    """A nested dict/list/tuple/JSON-string value, and the secrets hidden in it."""
    kinds = ["text", "secret_text", "secret_text", "int", "none"]
    if depth < 3:
        kinds += ["dict", "dict", "list", "tuple", "json"]
    kind = draw(st.sampled_from(kinds))
    if kind == "text":
        return draw(FILLER), []
    if kind == "secret_text":
        text, needles = draw(secret_snippet())
        return f"{draw(FILLER)} {text} {draw(FILLER)}", needles
    if kind == "int":
        return draw(st.integers(-(10**6), 10**6)), []
    if kind == "none":
        return None, []
    if kind == "json":
        value, needles = draw(tree(depth + 1))
        return json.dumps(value), needles
    needles: list[str] = []
    if kind == "dict":
        out: dict[str, Any] = {}
        for _ in range(draw(st.integers(0, 4))):
            if draw(st.booleans()):
                key = draw(random_case(draw(st.sampled_from(SECRET_KEY_NAMES))))
                if draw(st.booleans()):
                    value = draw(needle())
                    ns = [value]
                else:
                    value, ns = draw(tree(depth + 1))
            else:
                key = draw(st.sampled_from(HARMLESS_KEY_NAMES))
                value, ns = draw(tree(depth + 1))
            if key not in out:  # a repeated key would silently drop earlier secrets
                out[key] = value
                needles += ns
        return out, needles
    items = []
    for _ in range(draw(st.integers(0, 4))):
        value, ns = draw(tree(depth + 1))
        items.append(value)
        needles += ns
    return (items if kind == "list" else tuple(items)), needles


@PROP_SETTINGS
@given(tree())
def test_property_no_generated_secret_survives_clean(case: tuple[Any, list[str]]) -> None:
    value, needles = case
    before = copy.deepcopy(value)
    g = gw()
    out = g.clean(value, where="prop")
    assert value == before  # input untouched
    rendered = json.dumps(out, ensure_ascii=False) + repr(out)
    audit = "".join(r.to_json() + repr(r) for r in g.recent_audit)
    for n in needles:
        assert n not in rendered, f"leaked {n!r}"
        assert n not in audit
    if needles:
        assert g.recent_audit, "secrets removed but nothing audited"


@PROP_SETTINGS
@given(tree(), secret_snippet(), FILLER)
def test_property_no_generated_secret_survives_logging(
    case: tuple[Any, list[str]], snippet: tuple[str, list[str]], filler: str
) -> None:
    import io

    value, needles = case
    text, more = snippet
    stream = io.StringIO()
    logger = logging.getLogger("test.gateway.property")
    logger.handlers.clear()
    logger.filters.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    install_log_redaction(gw(), logger)
    logger.info("value=%s", value)
    logger.warning(json.dumps(value))
    logger.error("%s %s", filler, text)
    logging.getLogger("test.gateway.property.child").info(f"{filler} {text} {filler}")
    try:
        raise RuntimeError(text)
    except RuntimeError:
        logger.exception("failed")
    out = stream.getvalue()
    assert out.count("\n") >= 5
    for n in needles + more:
        assert n not in out, f"leaked {n!r}"


@PROP_SETTINGS
@given(FILLER, st.lists(FILLER, max_size=5))
def test_property_harmless_text_unchanged(text: str, items: list[str]) -> None:
    g = gw()
    assert g.clean_text(text, where="t") == text
    data = {"note": text, "items": items, "tokens_used": 12}
    assert g.clean(data, where="t") == data
    assert g.recent_audit == ()


@PROP_SETTINGS
@given(st.data())
def test_property_key_matcher_any_case(data: Any) -> None:
    # Odd casing may turn a harmless key into a secret one ("max_tokenS" splits as
    # max/token/S): that errs on the safe side, so only the secret direction is a property.
    secret = data.draw(random_case(data.draw(st.sampled_from(SECRET_KEY_NAMES))))
    assert is_secret_key(secret)
    seps = data.draw(st.sampled_from(["_", "-", ".", "__"]))
    assert is_secret_key(secret.replace("_", seps))


def test_json_string_literals_and_multiply_escaped_values() -> None:
    g = gw()
    # A JSON string literal holding JSON text (what json.dumps(json.dumps(x)) gives).
    inner = json.dumps({"token": "Qx7-deep"})
    literal = json.dumps(inner)
    out = g.clean_text(literal, where="t")
    assert "Qx7-deep" not in out
    assert json.loads(json.loads(out)) == {"token": REDACTED}
    # Escaped twice inside free text.
    text = 'log: {\\\\\\"password\\\\\\": \\\\\\"Qx7-deep\\\\\\"} tail'
    out2 = g.clean_text(text, where="t")
    assert "Qx7-deep" not in out2
    assert out2.endswith(" tail")


def test_hex_hashes_with_digit_runs_are_not_pii() -> None:
    import hashlib

    digest = "ab13812341234cd" + hashlib.sha256(b"x").hexdigest()[:40] + "e4111111111111111f"
    data = {"content_hash": digest, "data_sha256": digest.upper()}
    assert gw().clean(data, where="t") == data


def test_nesting_limit_is_a_clear_error() -> None:
    deep: Any = "x"
    for _ in range(250):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper than 200"):
        gw().clean(deep, where="t")
    ok: Any = {"password": "p1"}
    for _ in range(150):
        ok = {"a": ok}
    out = gw().clean(ok, where="t")
    for _ in range(150):
        out = out["a"]
    assert out == {"password": REDACTED}


def test_container_types_kept() -> None:
    from collections import OrderedDict, namedtuple

    Pair = namedtuple("Pair", "left right")
    data = {
        "od": OrderedDict([("token", "t1"), ("n", 1)]),
        "nt": Pair("13812341234", "x"),
        "fs": frozenset({"13812341234"}),
        "b": b"password=hunter2x",
    }
    out = gw().clean(data, where="t")
    assert isinstance(out["od"], OrderedDict)
    assert out["od"] == OrderedDict([("token", REDACTED), ("n", 1)])
    assert out["nt"] == Pair("138****1234", "x")
    assert out["fs"] == frozenset({"138****1234"})
    assert out["b"] == f"password={REDACTED}".encode()


def test_audit_write_failure_is_logged_cleaned_without_recursion(tmp_path: Path) -> None:
    import io

    g = gw(audit_path=tmp_path)  # a directory: every append fails with an OSError
    parent = logging.getLogger("context_core")
    saved = (list(parent.handlers), list(parent.filters), parent.level, parent.propagate)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    parent.handlers[:] = [handler]
    parent.setLevel(logging.DEBUG)
    parent.propagate = False
    try:
        install_log_redaction(g, parent)
        logging.getLogger("context_core.worker").warning("key %s", STRIPE)
    finally:
        parent.handlers[:] = saved[0]
        parent.filters[:] = saved[1]
        parent.setLevel(saved[2])
        parent.propagate = saved[3]
    out = stream.getvalue()
    assert STRIPE not in out
    assert f"context_core.worker key {REDACTED}" in out
    assert "context_core.gateway.sanitize gateway audit write to" in out
    assert len(g.recent_audit) == 1  # the in-memory tail still has the record


def test_clean_text_is_remembered_but_text_with_a_finding_is_scanned_and_audited_every_time(
    tmp_path: Path,
) -> None:
    from context_core.gateway.redaction import KNOWN_CLEAN, KNOWN_CLEAN_TEXT_MAX_LEN

    g = Gateway(audit_path=tmp_path / "audit.jsonl")
    clean = '{"device": "PUMP-0042", "rms_mm_s": 4.2, "status": "running"} ' * 3
    assert g.clean_text(clean, where="t") == clean
    assert clean in KNOWN_CLEAN  # the next request carrying the same L1 text skips the scan
    too_long = "vibration " * (KNOWN_CLEAN_TEXT_MAX_LEN // 10 + 1)
    assert g.clean_text(too_long, where="t") == too_long
    assert too_long not in KNOWN_CLEAN

    dirty = "reading done, api_key=sk_live_" + "b" * 24 + " for PUMP-0042"
    before = len(g.recent_audit)
    for _ in range(2):
        out = g.clean_text(dirty, where="t")
        assert "sk_live_" not in out
        assert dirty not in KNOWN_CLEAN
    assert len(g.recent_audit) == before + 2  # audited on each call, never memoised
