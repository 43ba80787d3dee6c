"""The governance jobs wired to a platform: the erasure target from settings and the keys
file, and the retention run the CLI and the ``data_retention`` DAG share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.governance.erasure import ErasureTarget
    from context_core.platform import Platform

__all__ = ["erasure_target", "run_retention"]


def erasure_target(settings: Settings, platform: Platform) -> ErasureTarget:
    """The platform's stores; each agent's org from ``CTX_API_KEYS_FILE`` (without one, the
    service's dev agent acting for the default org)."""
    from context_core.access.auth import DEV_AGENT, KeyStore
    from context_core.gateway.identity import DEFAULT_ORG
    from context_core.governance.erasure import ErasureTarget

    if settings.api_keys_file is not None:
        agent_orgs = {a.agent_id: a.org for a in KeyStore.load(settings.api_keys_file).agents}
    else:
        agent_orgs = {DEV_AGENT: DEFAULT_ORG}
    return ErasureTarget.from_settings(
        settings,
        redis=platform.redis,
        compliance=platform.compliance,
        store=platform.store,
        agent_orgs=agent_orgs,
        wm=platform.wm,
    )


def run_retention(
    settings: Settings, *, dry_run: bool = False, at: float | None = None
) -> dict[str, Any]:
    """Open the platform (no embedding model), enforce retention, close; the receipt as a
    dict. ``at`` (epoch seconds) replaces the clock, for dry runs only."""
    from context_core.errors import ConfigError
    from context_core.governance.retention import enforce_retention
    from context_core.platform import build_platform

    if at is not None and not dry_run:
        raise ConfigError("a retention run at another time than now must be a dry run")
    with build_platform(settings, with_knowledge=False) as platform:
        target = erasure_target(settings, platform)
        if at is not None:
            target.clock = lambda: at
        return enforce_retention(target, dry_run=dry_run).to_dict()
