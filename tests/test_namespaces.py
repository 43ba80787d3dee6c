"""Shared namespaces on a real Redis: TTLs, ACL by agent + purpose, audited denials."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cleanup_keys, redis_client

from context_core.access.namespaces import Grant, NamespaceRegistry
from context_core.errors import AccessDeniedError, ConfigError, ContextMissError
from context_core.gateway.sanitize import Gateway


@pytest.fixture(scope="module")
def redis_url(redis_or_cluster: str) -> str:
    """This module runs once on the system Redis (or embedded Valkey), once on a Redis Cluster."""
    return redis_or_cluster


@pytest.fixture
def ns_name() -> str:
    return f"fleet-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def registry(redis_url: str, tmp_path: Path, ns_name: str) -> Iterator[NamespaceRegistry]:
    client = redis_client(redis_url, decode_responses=True)
    reg = NamespaceRegistry(client, Gateway(), audit_path=tmp_path / "audit" / "access.jsonl")
    reg.create(
        ns_name,
        ttl_s=120,
        acl={
            "diag-agent": Grant(frozenset({"diagnostics"}), write=True),
            "report-agent": Grant(frozenset({"reporting"})),
            "ops-agent": Grant(frozenset({"*"})),
        },
    )
    yield reg
    cleanup_keys(redis_url, f"ns:{{{ns_name}}}:*")
    client.close()


def test_write_read_with_ttl_and_hash_tag(
    registry: NamespaceRegistry, ns_name: str, redis_url: str
) -> None:
    key = registry.write(
        ns_name, "baseline:PUMP", {"rms_mm_s": 2.1}, agent_id="diag-agent", purpose="diagnostics"
    )
    assert key == f"ns:{{{ns_name}}}:kv:baseline:PUMP"
    entry = registry.read_entry(
        ns_name, "baseline:PUMP", agent_id="report-agent", purpose="reporting"
    )
    assert entry.value == {"rms_mm_s": 2.1}
    assert entry.redis_key == key
    assert entry.ttl_s is not None and 100 < entry.ttl_s <= 120
    assert registry.read(ns_name, "baseline:PUMP", "ops-agent", "anything") == {"rms_mm_s": 2.1}
    c = redis_client(redis_url)
    assert 100 < c.ttl(key) <= 120
    assert c.ttl(f"ns:{{{ns_name}}}:acl") == -1  # the ACL is configuration: no expiry
    c.close()


def test_writes_pass_the_gateway(registry: NamespaceRegistry, ns_name: str, redis_url: str) -> None:
    secret = "sk_live_" + "b" * 24
    registry.write(
        ns_name,
        "creds",
        {"api_key": secret, "note": f"use {secret}"},
        agent_id="diag-agent",
        purpose="diagnostics",
    )
    raw = redis_client(redis_url).get(f"ns:{{{ns_name}}}:kv:creds")
    assert raw is not None and secret.encode() not in raw
    assert json.loads(raw)["v"]["api_key"] == "[REDACTED]"


@pytest.mark.parametrize(
    ("agent", "purpose", "reason"),
    [
        ("stranger", "diagnostics", "not in the ACL"),
        ("report-agent", "diagnostics", "purpose 'diagnostics' not granted"),
        (None, "diagnostics", "no agent id"),
        ("report-agent", "", "no purpose"),
    ],
)
def test_denied_read_raises_and_is_audited(
    registry: NamespaceRegistry,
    ns_name: str,
    tmp_path: Path,
    agent: str | None,
    purpose: str,
    reason: str,
) -> None:
    value = "fan-baseline-value-7f3a"
    registry.write(ns_name, "baseline:FAN", value, agent_id="diag-agent", purpose="diagnostics")
    with pytest.raises(AccessDeniedError, match=reason):
        registry.read(ns_name, "baseline:FAN", agent, purpose)
    lines = (tmp_path / "audit" / "access.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["event"] == "ns_access_denied"
    assert rec["op"] == "read"
    assert (rec["namespace"], rec["key"], rec["agent_id"], rec["purpose"]) == (
        ns_name,
        "baseline:FAN",
        agent,
        purpose,
    )
    assert reason in rec["reason"]
    assert value not in lines[0]  # never the value
    assert registry.recent_denials[-1].agent_id == agent


def test_write_needs_a_write_grant(registry: NamespaceRegistry, ns_name: str) -> None:
    with pytest.raises(AccessDeniedError, match="no write grant"):
        registry.write(ns_name, "k", 1, agent_id="report-agent", purpose="reporting")
    assert registry.recent_denials[-1].op == "write"


def test_grant_and_revoke(registry: NamespaceRegistry, ns_name: str) -> None:
    registry.write(ns_name, "k", "v", agent_id="diag-agent", purpose="diagnostics")
    registry.grant(ns_name, "new-agent", ["audit"])
    assert registry.read(ns_name, "k", "new-agent", "audit") == "v"
    registry.revoke(ns_name, "new-agent")
    with pytest.raises(AccessDeniedError):
        registry.read(ns_name, "k", "new-agent", "audit")
    assert set(registry.acl(ns_name)) == {"diag-agent", "report-agent", "ops-agent"}


def test_miss_and_bad_names(registry: NamespaceRegistry, ns_name: str) -> None:
    with pytest.raises(ContextMissError, match=f"ns:{{{ns_name}}}:kv:nothing"):
        registry.read(ns_name, "nothing", "ops-agent", "x")
    with pytest.raises(ConfigError, match="namespace name"):
        registry.read("bad{name}", "k", "ops-agent", "x")
    with pytest.raises(ConfigError, match="namespace name"):  # '$' also matched before "\n"
        registry.read(ns_name + "\n", "k", "ops-agent", "x")
    with pytest.raises(ConfigError, match="namespace key"):
        registry.read(ns_name, "a*", "ops-agent", "x")
    with pytest.raises(ConfigError, match="does not exist"):
        registry.grant("never-created-" + uuid.uuid4().hex[:6], "a", ["p"])


def test_drop_removes_everything(registry: NamespaceRegistry, ns_name: str, redis_url: str) -> None:
    registry.write(ns_name, "a", 1, agent_id="diag-agent", purpose="diagnostics")
    registry.write(ns_name, "b", 2, agent_id="diag-agent", purpose="diagnostics")
    assert registry.drop(ns_name) == 4  # meta, acl, two values
    assert not registry.exists(ns_name)
    assert list(redis_client(redis_url).scan_iter(match=f"ns:{{{ns_name}}}:*")) == []
