"""API keys per agent: only sha256 digests are stored; each agent has namespaces and purposes.

Keys file (``CTX_API_KEYS_FILE``), JSON::

    {"diag-agent": {"key_sha256": "<hex>", "namespaces": ["fleet"], "purposes": ["diagnostics"],
                    "org": "acme"}}

``org`` (optional, default ``"default"``) is the organisation the agent acts for: its
sessions get that org's compliance profile, and it reads (and, holding the purpose
``compliance_admin``, writes) only that org's profiles (:mod:`context_core.access.compliance`).

With no file configured the service makes one dev key at startup and prints it once, so
``ctx serve`` works out of the box without ever writing a credential into the repository.
``python -m context_core.access.auth --out DIR --agents a,b`` writes a keys file plus the raw
keys (mode 600) for load generators; it never overwrites an existing pair.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context_core.errors import ConfigError
from context_core.gateway.identity import DEFAULT_ORG

__all__ = ["AgentKey", "KeyStore", "generate_keys", "hash_key"]

DEV_AGENT = "dev-agent"
ORG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_ORG = re.compile(ORG_PATTERN)
KEY_PREFIX = "ctxk_"
ANY = "*"


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class AgentKey:
    """What an authenticated caller may do. ``"*"`` in either tuple grants everything."""

    agent_id: str
    key_sha256: str
    namespaces: tuple[str, ...] = ()
    purposes: tuple[str, ...] = ()
    org: str = DEFAULT_ORG

    def may_use_namespace(self, name: str) -> bool:
        return ANY in self.namespaces or name in self.namespaces

    def may_declare(self, purpose: str) -> bool:
        return ANY in self.purposes or purpose in self.purposes


class KeyStore:
    """sha256(key) -> :class:`AgentKey`. Lookup hashes the presented key first, so the raw
    value is compared nowhere and timing reveals nothing about stored digests."""

    def __init__(self, agents: Iterable[AgentKey]) -> None:
        self._by_hash: dict[str, AgentKey] = {}
        for a in agents:
            if a.key_sha256 in self._by_hash:
                raise ConfigError(
                    f"API keys file: agents {self._by_hash[a.key_sha256].agent_id!r} and "
                    f"{a.agent_id!r} share one key; give each agent its own"
                )
            self._by_hash[a.key_sha256] = a

    @property
    def agents(self) -> tuple[AgentKey, ...]:
        return tuple(self._by_hash.values())

    def authenticate(self, raw: str | None) -> AgentKey | None:
        if not raw:
            return None
        digest = hash_key(raw)
        agent = self._by_hash.get(digest)
        if agent is None or not hmac.compare_digest(agent.key_sha256, digest):
            return None
        return agent

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "keys file") -> KeyStore:
        agents = []
        if not isinstance(data, Mapping) or not data:
            raise ConfigError(f"{source}: expected a non-empty JSON object {{agent_id: {{...}}}}")
        for agent_id, rec in data.items():
            if not isinstance(rec, Mapping):
                raise ConfigError(f"{source}: entry {agent_id!r} must be an object")
            digest = str(rec.get("key_sha256", "")).lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(
                    f"{source}: {agent_id}.key_sha256 must be 64 hex chars (sha256 of the key; "
                    "never store the key itself)"
                )
            ns = rec.get("namespaces", [])
            purposes = rec.get("purposes", [])
            if not isinstance(ns, list) or not isinstance(purposes, list):
                raise ConfigError(f"{source}: {agent_id}.namespaces/purposes must be lists")
            org = rec.get("org", DEFAULT_ORG)
            if not isinstance(org, str) or not _ORG.match(org):
                raise ConfigError(
                    f"{source}: {agent_id}.org must be 1-64 characters from A-Z a-z 0-9 . _ - "
                    f"(starting with a letter or digit), got {org!r}"
                )
            agents.append(
                AgentKey(str(agent_id), digest, tuple(map(str, ns)), tuple(map(str, purposes)), org)
            )
        _one_org_per_namespace(agents, source)
        return cls(agents)

    @classmethod
    def load(cls, path: Path) -> KeyStore:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"CTX_API_KEYS_FILE={path} does not exist; create it or unset") from e
        except json.JSONDecodeError as e:
            raise ConfigError(f"CTX_API_KEYS_FILE={path} is not valid JSON: {e}") from e
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def dev_default(cls) -> tuple[KeyStore, str]:
        """One all-access dev agent with a fresh random key (returned so it can be printed)."""
        raw = new_key()
        return cls([AgentKey(DEV_AGENT, hash_key(raw), (ANY,), (ANY,))]), raw


def _one_org_per_namespace(agents: Iterable[AgentKey], source: str) -> None:
    """A shared namespace belongs to one organisation: a keys file that grants one name to
    agents of two organisations would let each read (and write) the other's shared context,
    so it is refused, naming both."""
    owner: dict[str, tuple[str, str]] = {}
    for a in agents:
        for ns in a.namespaces:
            if ns == ANY:
                continue
            first = owner.setdefault(ns, (a.org, a.agent_id))
            if first[0] != a.org:
                raise ConfigError(
                    f"{source}: namespace {ns!r} is granted to agent {first[1]!r} of org "
                    f"{first[0]!r} and to agent {a.agent_id!r} of org {a.org!r}; a namespace "
                    "belongs to one organisation: give the other organisation's its own name"
                )


def generate_keys(
    out_dir: Path,
    agents: Iterable[str],
    *,
    namespaces: Iterable[str] = (ANY,),
    purposes: Iterable[str] = (ANY,),
) -> tuple[Path, Path]:
    """Write ``api_keys.json`` (digests) and ``loadtest.keys`` (raw keys, mode 600).

    Existing files are kept as they are, so a restarted stack keeps its keys.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    digests, raws = out_dir / "api_keys.json", out_dir / "loadtest.keys"
    if digests.exists() and raws.exists():
        return digests, raws
    ns, ps = list(namespaces), list(purposes)
    keys = {a: new_key() for a in agents}
    if not keys:
        raise ConfigError("generate_keys: give at least one agent id")
    doc = {
        a: {"key_sha256": hash_key(k), "namespaces": ns, "purposes": ps} for a, k in keys.items()
    }
    digests.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    fd = os.open(raws, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(keys, fh)
    return digests, raws


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=generate_keys.__doc__)
    ap.add_argument("--out", type=Path, required=True, help="directory for the two files")
    ap.add_argument("--agents", required=True, help="comma-separated agent ids")
    ap.add_argument("--namespaces", default=ANY, help="comma-separated (default: all)")
    ap.add_argument("--purposes", default=ANY, help="comma-separated (default: all)")
    args = ap.parse_args(argv)
    digests, raws = generate_keys(
        args.out,
        [a for a in args.agents.split(",") if a],
        namespaces=[n for n in args.namespaces.split(",") if n],
        purposes=[p for p in args.purposes.split(",") if p],
    )
    print(f"keys file: {digests}\nraw keys (keep private): {raws}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
