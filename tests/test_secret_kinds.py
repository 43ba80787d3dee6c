"""Secret kinds (issue 32 item 5): one fake sample per detect-secrets plugin, the cue-word rule,
passwords holding ``&;#%``, look-alike cue words, and the coverage table against detect-secrets.

Every sample is built at test time from pieces and random characters of the right shape
(a fixed seed), so no literal credential sits in this file; none is a real credential.

The side-by-side table (kind | ours | detect-secrets) is printed by running this module:
``python -m tests.test_secret_kinds`` (detect-secrets 1.5.0, the ``dev`` extra); the README
quotes it as measured.
"""

from __future__ import annotations

import random
import string
import sys
from collections.abc import Callable

import pytest

from context_core.gateway.redaction import REDACTED, redact_text
from context_core.gateway.sanitize import Gateway

_RNG = random.Random(20261204)
_UP, _LOW, _DIG = string.ascii_uppercase, string.ascii_lowercase, string.digits
_A62 = _UP + _LOW + _DIG
_URL = _A62 + "_-"
_HEX = "0123456789abcdef"


def _r(alphabet: str, n: int) -> str:
    """``n`` random characters of ``alphabet``, with at least one digit and one letter when
    the alphabet has both (real keys of these shapes always do)."""
    mixed = any(c.isdigit() for c in alphabet) and any(c.isalpha() for c in alphabet)
    while True:
        s = "".join(_RNG.choice(alphabet) for _ in range(n))
        if not mixed or (any(c.isdigit() for c in s) and any(c.isalpha() for c in s)):
            return s


def _j(*parts: str) -> str:
    return "".join(parts)


# (kind, detect-secrets plugin it mirrors, sample line holding the secret, the secret itself)
Sample = tuple[str, str, str, str]


def _samples() -> list[Sample]:
    out: list[Sample] = []

    def add(kind: str, plugin: str, line: str, secret: str) -> None:
        out.append((kind, plugin, line, secret))

    k = _j("AK", "IA", _r(_UP + "234567", 16))
    add("AWS access key id", "AWSKeyDetector", f"aws_access_key_id = {k}", k)
    k = _r(_A62 + "+/", 40)
    add("AWS secret key (unlabelled, prose)", "AWSKeyDetector", f"the secret key is {k}", k)
    k = _r(_A62 + "+/", 86) + "=="
    add(
        "Azure storage AccountKey",
        "AzureStorageKeyDetector",
        _j("DefaultEndpointsProtocol=https;AccountName=acme;Account", f"Key={k};EndpointSuffix=x"),
        k,
    )
    k = _j("AK", "Cp", _r(_A62, 69))
    add("Artifactory API key", "ArtifactoryDetector", f"artifactory: {k}", k)
    k = _j("AP", "6", _r(_A62, 12))
    add("Artifactory password", "ArtifactoryDetector", f"x-jfrog-art-api={k}", k)
    k = _r(_A62, 12) + "&" + _r(_A62, 4)
    add("Basic auth in URL", "BasicAuthDetector", f"https://admin:{k}@db.example.com/x", k)
    k = _r(_HEX, 64)
    add("Cloudant password", "CloudantDetector", f'cloudant_password = "{k}"', k)
    k = "".join(_RNG.choice("bcdfghjklmnpqrstvwxz") for _ in range(24))
    add("Cloudant API key (24 lower-case)", "CloudantDetector", f"cl_key = {k}", k)
    k = _j("M", _r(_URL, 23), ".", _r(_URL, 6), ".", _r(_URL, 27))
    add("Discord bot token", "DiscordBotTokenDetector", f"DISCORD={k}", k)
    k = _j("gh", "p_", _r(_A62, 36))
    add("GitHub token", "GitHubTokenDetector", f"git remote add origin {k}", k)
    k = _j("gl", "pat-", _r(_URL, 20))
    add("GitLab token", "GitLabTokenDetector", f"CI_TOKEN {k}", k)
    k = _r(_URL, 44)
    add("IBM Cloud IAM key", "IbmCloudIamDetector", f"ibm_cloud_iam_api_key: '{k}'", k)
    k = _r(_HEX, 48)
    add("IBM COS HMAC secret", "IbmCosHmacDetector", f"cos_hmac_secret_access_key={k}", k)
    header = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"  # {"alg":"HS256","typ":"JWT"}
    k = _j(header, ".", "eyJzdWIiOiIxMjM0NTY3ODkwIn0", ".", _r(_URL, 43))
    add("JWT", "JwtTokenDetector", f"Authorization: {k}", k)
    k = _j(_r(_HEX, 32), "-us", "12")
    add("Mailchimp key", "MailchimpDetector", f"mailchimp = {k}", k)
    k = _j("np", "m_", _r(_A62, 36))
    add("npm token", "NpmDetector", f"//registry.npmjs.org/:_authToken={k}", k)
    k = _j("np", "m_", _r(_A62, 36))
    add("npm token (bare, prose)", "NpmDetector", f"publish with {k} please", k)
    k = _j("sk-", _r(_A62, 20), "T3Blbk", "FJ", _r(_A62, 20))
    add("OpenAI key", "OpenAIDetector", f"OPENAI={k}", k)
    body = _r(_A62, 64)
    k = _j("-----BEGIN OPENSSH PRIVATE ", "KEY-----\n", body, "\n-----END OPENSSH PRIVATE KEY-----")
    add("Private key (PEM)", "PrivateKeyDetector", f"key file:\n{k}\n", body)
    k = _j("pypi-", "AgEIcHlwaS5vcmc", _r(_URL, 70))
    add("PyPI token", "PypiTokenDetector", f"password = {k}", k)
    k = _j("SG", ".", _r(_URL, 22), ".", _r(_URL, 43))
    add("SendGrid key", "SendGridDetector", f"sendgrid {k}", k)
    k = _j("xo", "xb-", _r(_DIG, 12), "-", _r(_DIG, 12), "-", _r(_A62, 24))
    add("Slack token", "SlackDetector", f"slack {k}", k)
    k = _j("T", _r(_A62, 8), "/B", _r(_A62, 8), "/", _r(_A62, 24))
    add("Slack webhook", "SlackDetector", f"https://hooks.slack.com/services/{k}", k)
    k = _r(_HEX, 64)
    add("SoftLayer key", "SoftlayerDetector", f"softlayer_api_key = {k}", k)
    k = _r(_HEX, 64)
    add("SoftLayer API URL", "SoftlayerDetector", f"https://api.softlayer.com/soap/v3/{k}", k)
    k = _j("sq0", "csp-", _r(_URL, 43))
    add("Square OAuth secret", "SquareOAuthDetector", f"square {k}", k)
    k = _j("sk", "_live_", _r(_A62, 24))
    add("Stripe live key", "StripeDetector", f"stripe {k}", k)
    k = _j(_r(_DIG, 9), ":", "AA", _r(_URL, 33))
    add("Telegram bot token", "TelegramBotTokenDetector", f"bot {k}", k)
    k = _j("AC", _r(_HEX, 32))
    add("Twilio account SID", "TwilioKeyDetector", f"twilio {k}", k)
    k = _j("SK", _r(_HEX, 32))
    add("Twilio API key", "TwilioKeyDetector", f"twilio {k}", k)
    k = _r(_A62 + "+/", 32)
    add("High-entropy base64 after a cue", "Base64HighEntropyString", f"the api key was {k}.", k)
    k = _r(_HEX, 40)
    add("High-entropy hex after a cue", "HexHighEntropyString", f"access key: '{k}'", k)
    k = _j(_r(_A62, 5), "&", _r(_A62, 3), ";", _r(_A62, 2), "#", _r(_DIG, 2), "%")
    add("Password with & ; # %", "KeywordDetector", f"DB_PASSWORD={k}", k)
    k = _j(_r(_A62, 6), "!", _r(_DIG, 2))
    add("Password in prose", "KeywordDetector", f"the password is {k}", k)
    return out


SAMPLES = _samples()


@pytest.mark.parametrize("sample", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_each_detect_secrets_kind_is_redacted(sample: Sample) -> None:
    _kind, _plugin, line, secret = sample
    out, hits = redact_text(line)
    assert secret not in out, out
    assert hits and REDACTED in out


def test_every_read_path_gets_the_redacted_value_through_the_gateway() -> None:
    """Writes (events, state, results, bundles) go through Gateway.clean: one nested dict with
    every new kind, in keys that name no secret, comes back without any of them."""
    g = Gateway()
    doc = {
        "events": [{"text": s[2]} for s in SAMPLES[: len(SAMPLES) // 2]],
        "state": {"notes": [s[2] for s in SAMPLES[len(SAMPLES) // 2 :]]},
        "result": {"cloudant_key": SAMPLES[7][3], "AWS_KEY": SAMPLES[1][3]},
        "bundle": {"yaml": "db:\n  password: " + SAMPLES[-2][3] + "\n  host: x\n"},
    }
    out = g.clean(doc, where="test_secret_kinds")
    rendered = repr(out)
    for s in SAMPLES:
        assert s[3] not in rendered, s[0]
    assert "host: x" in out["bundle"]["yaml"]
    assert g.recent_audit


def test_identifier_keys_keep_their_random_values() -> None:
    """Keys that name an identifier keep a random-looking value (a UUID, a hash)."""
    uid = "550e8400-e29b-41d4-a716-446655440000"
    digest = _r(_HEX, 64)
    doc = {"primary_key": uid, "cache_key": digest, "idempotencyKey": uid, "sort_key": digest}
    assert Gateway().clean(doc, where="t") == doc


# ---- the cue-word rule ----------------------------------------------------------------------

_TOKEN = _r(_A62, 28)


@pytest.mark.parametrize(
    "text",
    [
        f"the secret key is {_TOKEN}",
        f"Secret Key: {_TOKEN}",
        f"token = '{_TOKEN}'",
        f'api key -> "{_TOKEN}"',
        f"access key was `{_TOKEN}`",
        f"my credential for prod is {_TOKEN}.",
        f'{{"cloudant_key":"{_TOKEN}"}}',
        f"AWS_KEY={_TOKEN}",
        f"key: {_TOKEN}",
        f"密钥是{_TOKEN}",
        f"токен: {_TOKEN}",
    ],
)
def test_high_entropy_token_after_a_cue_is_redacted(text: str) -> None:
    out, _ = redact_text(text)
    assert _TOKEN not in out and REDACTED in out
    assert redact_text(out) == (out, [])


@pytest.mark.parametrize(
    "text",
    [
        "the key is to be patient",
        "password reset link sent to your inbox",
        "token limit reached after 4096 tokens",
        "the token was internationalization",
        "the key to success is maxTokensPerRequest",
        "the password is required.",
        "password was changed by admin2024",
        "keyboard token tokenizer monkey",
        "token budget for gpt-4o-mini-2024-07-18 is low",
        "the secret is out",
        "key findings: transformers.AutoTokenizer works",
        "pwd is /home/user/project",
        "the password is required!",
        "your password was Changed?",
        "the token expired, please log in",
    ],
)
def test_prose_survives(text: str) -> None:
    assert redact_text(text) == (text, [])


# ---- passwords with & ; # % and other syntaxes ----------------------------------------------

_PW = "p&ss;w#rd%26x"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"password={_PW}", ""),
        (f"DB_PASSWORD={_PW} next", " next"),
        (f"https://x.io/login?user=bob&password={_PW}&next=/home", "&next=/home"),
        (f"Server=db;Password={_PW};Database=app", ";Database=app"),
        (f'{{"password": "{_PW}"}}', '"}'),
        (f"password: '{_PW}'", "'"),
        (f"[db]\npassword = {_PW} and spaces\nhost = x", "\nhost = x"),
        (f"export PASSWORD={_PW}", ""),
        (f"'password' => '{_PW}'", "'"),
        (f"the password is {_PW}", ""),
        (f"<password>{_PW}</password>", "</password>"),
        (
            "DATABASE_URL=postgres://app:"
            + _PW.replace("&", "%26").replace("#", "%23")
            + "@db:5432/app",
            "@db:5432/app",
        ),
        (f"password%3D{_PW}", ""),
    ],
)
def test_password_masked_to_its_real_end(text: str, kept: str) -> None:
    out, _ = redact_text(text)
    assert "ss;w" not in out and "26x" not in out and "ss%" not in out, out
    assert out.endswith(kept), out


# ---- look-alike cue words (skeleton) --------------------------------------------------------


@pytest.mark.parametrize(
    "cue",
    ["p\u0430ssw\u043erd", "pass\u200bword", "ｐａｓｓｗｏｒｄ", "𝐩𝐚𝐬𝐬𝐰𝐨𝐫𝐝", "pass\u00adword"],
)
@pytest.mark.parametrize(
    "form", ["{cue}: {v}", "{cue}={v}", "the {cue} is {v}", '{{"{cue}": "{v}"}}']
)
def test_lookalike_cue_words_still_redact(cue: str, form: str) -> None:
    value = "hunter" + "22x"
    text = form.format(cue=cue, v=value)
    out, hits = redact_text(text)
    assert value not in out and hits, out
    assert cue in out  # the original characters of the cue are kept
    assert redact_text(out) == (out, [])


def test_lookalike_token_cue() -> None:
    out, _ = redact_text(f"t\u043eken: {_TOKEN}")
    assert _TOKEN not in out


# ---- the side-by-side table -----------------------------------------------------------------


def detect_secrets_finds(line: str, secret: str) -> bool:
    """Whether detect-secrets 1.5.0 (all its plugins, default settings) reports ``secret``
    (or a secret overlapping it) on ``line``, line by line as its scanner reads files."""
    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import default_settings

    with default_settings():
        for ln in line.splitlines() or [line]:
            for found in scan_line(ln):
                value = found.secret_value or ""
                if len(value) >= 4 and (value in secret or secret in value):
                    return True
    return False


def coverage_rows(
    samples: list[Sample] = SAMPLES, ours: Callable[[str], str] | None = None
) -> list[tuple[str, str, str]]:
    """(kind, ours, detect-secrets) per sample: "yes" when the secret is redacted/reported."""
    clean = ours or (lambda t: redact_text(t)[0])
    rows = []
    for kind, _plugin, line, secret in samples:
        rows.append(
            (
                kind,
                "yes" if secret not in clean(line) else "no",
                "yes" if detect_secrets_finds(line, secret) else "no",
            )
        )
    return rows


def test_coverage_table_against_detect_secrets() -> None:
    pytest.importorskip("detect_secrets")
    rows = coverage_rows()
    assert all(ours == "yes" for _k, ours, _d in rows), rows


def main() -> int:
    rows = coverage_rows()
    print("| kind | ours | detect-secrets |")
    print("|---|---|---|")
    for kind, ours, theirs in rows:
        print(f"| {kind} | {ours} | {theirs} |")
    print(
        f"\n{sum(r[1] == 'yes' for r in rows)}/{len(rows)} ours, "
        f"{sum(r[2] == 'yes' for r in rows)}/{len(rows)} detect-secrets"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
