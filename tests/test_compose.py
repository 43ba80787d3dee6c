"""docker-compose.yml: valid for Debian's docker-compose, pinned, healthy, consistent with CTX_*."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from context_core.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
EXPECTED = {
    "valkey",
    "qdrant",
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "ctx-keys",
    "context-service",
    "locust-master",
    "locust-worker",
}
ONE_SHOT = {"airflow-init", "ctx-keys"}
# Long-running services may go without a healthcheck only if nothing waits on them.
NO_HEALTHCHECK_OK = {"locust-worker"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_expected_services_exist(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == EXPECTED


def test_every_ctx_variable_is_a_settings_field(compose: dict[str, Any]) -> None:
    fields = {f"CTX_{name.upper()}" for name in Settings.model_fields}
    used = {k for svc in compose["services"].values() for k in _env(svc) if k.startswith("CTX_")}
    text_refs = set(re.findall(r"\bCTX_[A-Z0-9_]+\b", COMPOSE.read_text(encoding="utf-8")))
    assert used, "the service must be configured through CTX_* variables"
    assert {"CTX_REDIS_URL", "CTX_QDRANT_URL", "CTX_API_KEYS_FILE"} <= used
    unknown = (used | text_refs) - fields
    assert not unknown, f"not Settings fields: {sorted(unknown)}"


def test_service_settings_values_parse(compose: dict[str, Any]) -> None:
    env = {k: v for k, v in _env(compose["services"]["context-service"]).items() if k[:4] == "CTX_"}
    s = Settings(**{k[4:].lower(): v for k, v in env.items()})
    assert s.redis_url == "redis://valkey:6379/0"
    assert s.qdrant_url == "http://qdrant:6333"
    assert s.service_port == 8080


def test_images_are_pinned_and_built_images_have_dockerfiles(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc.get("image")
        assert image, f"{name}: give an image name (pinned) even when built"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: image {image!r} is not pinned"
        if "build" in svc:
            assert (ROOT / svc["build"]["dockerfile"]).is_file(), name


def test_healthchecks_and_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        if name in ONE_SHOT or name in NO_HEALTHCHECK_OK:
            continue
        assert "healthcheck" in svc, f"{name} has no healthcheck"
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            want = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
            assert cond["condition"] == want, f"{name} -> {dep}"
    airflow_env = _env(services["airflow-scheduler"])
    assert airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert "@postgres:5432/airflow" in airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert "./dags:/opt/airflow/dags:ro" in services["airflow-dag-processor"]["volumes"]


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    for name, svc in compose["services"].items():
        for v in svc.get("volumes", []):
            src = v.split(":", 1)[0]
            if not src.startswith((".", "/")):
                assert src in declared, f"{name}: volume {src!r} is not declared"


def test_no_secret_is_written_in_the_file() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    for var in ("POSTGRES_PASSWORD", "AIRFLOW_JWT_SECRET"):
        assert f"${{{var}:?" in text, f"{var} must come from the environment, required"


def _compose_bin() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("Debian's docker-compose is not installed (apt-get install docker-compose)")
    return exe


def test_docker_compose_config_accepts_the_file() -> None:
    exe = _compose_bin()
    env = {
        **os.environ,
        "POSTGRES_PASSWORD": secrets.token_urlsafe(16),
        "AIRFLOW_JWT_SECRET": secrets.token_urlsafe(32),
    }
    out = subprocess.run(
        [exe, "-f", str(COMPOSE), "config"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert set(resolved["services"]) == EXPECTED
    # anchors and merges resolved: the scheduler inherits the CTX_* block
    assert resolved["services"]["airflow-scheduler"]["environment"]["CTX_REDIS_URL"] == (
        "redis://valkey:6379/0"
    )


def test_docker_compose_config_names_a_missing_secret() -> None:
    exe = _compose_bin()
    env = {k: v for k, v in os.environ.items() if k not in {"POSTGRES_PASSWORD"}}
    env["AIRFLOW_JWT_SECRET"] = secrets.token_urlsafe(32)
    out = subprocess.run(
        [exe, "-f", str(COMPOSE), "config", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert out.returncode != 0
    assert "POSTGRES_PASSWORD" in out.stderr
