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
    "ctx-db-upgrade",
    "context-service",
    "locust-master",
    "locust-worker",
    # profile qdrant-cluster
    "qdrant-node-1",
    "qdrant-node-2",
    "qdrant-node-3",
    "context-service-cluster",
}
CLUSTER_PROFILE = "qdrant-cluster"
CLUSTER = {"qdrant-node-1", "qdrant-node-2", "qdrant-node-3", "context-service-cluster"}
LOCUSTFILE = "/app/loadtests/locustfile.py"
ONE_SHOT = {"airflow-init", "ctx-keys", "ctx-db-upgrade"}
SECRETS = (
    "POSTGRES_PASSWORD",
    "AIRFLOW_JWT_SECRET",
    "PG_CTX_OWNER_PASSWORD",
    "PG_CTX_APP_PASSWORD",
)
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


def test_locust_master_and_workers_run_the_campaign_entry(compose: dict[str, Any]) -> None:
    services = compose["services"]
    master, worker = services["locust-master"], services["locust-worker"]
    m_cmd, w_cmd = master["command"], worker["command"]
    # the same locustfile (shape, sampler, gates) on both sides, Locust's own distributed mode
    assert m_cmd[:3] == w_cmd[:3] == ["locust", "-f", LOCUSTFILE]
    assert "--master" in m_cmd and "--worker" not in m_cmd
    assert "--worker" in w_cmd and "--master" not in w_cmd
    assert w_cmd[w_cmd.index("--master-host") + 1] == "locust-master"
    # the master starts the campaign by itself once the workers joined, then quits: its exit
    # code is the verdict
    assert "--autostart" in m_cmd and int(m_cmd[m_cmd.index("--autoquit") + 1]) > 0
    assert m_cmd[m_cmd.index("--host") + 1] == "http://context-service:8080"
    m_env, w_env = _env(master), _env(worker)
    assert m_env["LOCUST_EXPECT_WORKERS"] == "${LOCUST_EXPECT_WORKERS:-2}"
    assert worker["deploy"]["replicas"] == 2  # = the default of LOCUST_EXPECT_WORKERS
    for key in ("LOCUST_SAMPLES_OUT", "LOCUST_CSV", "LOCUST_HTML"):
        assert m_env[key].startswith("/var/lib/ctx/reports/"), key
        assert key not in w_env, f"workers must not write {key} (their stats are deltas)"
    assert "ctx-data:/var/lib/ctx" in master["volumes"]
    for key in ("LOCUST_CTX_PROFILE", "LOCUST_KEYS_FILE", "LOCUST_REDIS_URL"):
        assert m_env[key] == w_env[key], key
    # the keys file the master names is where the workers read it
    assert "ctx-keys:/keys:ro" in master["volumes"] and "ctx-keys:/keys:ro" in worker["volumes"]
    assert worker["depends_on"]["locust-master"]["condition"] == "service_healthy"


def test_qdrant_cluster_profile(compose: dict[str, Any]) -> None:
    services = compose["services"]
    profiled = {n for n, svc in services.items() if CLUSTER_PROFILE in svc.get("profiles", [])}
    assert profiled == CLUSTER, "only the cluster's services belong to the profile"
    assert not any(svc.get("profiles") for n, svc in services.items() if n not in CLUSTER)
    nodes = [services[f"qdrant-node-{i}"] for i in (1, 2, 3)]
    for i, node in enumerate(nodes, start=1):
        assert node["image"] == services["qdrant"]["image"]
        assert _env(node)["QDRANT__CLUSTER__ENABLED"] == "true"
        cmd = node["command"]
        assert cmd[cmd.index("--uri") + 1] == f"http://qdrant-node-{i}:6335"
        if i == 1:
            assert "--bootstrap" not in cmd
        else:
            assert cmd[cmd.index("--bootstrap") + 1] == "http://qdrant-node-1:6335"
            assert node["depends_on"]["qdrant-node-1"]["condition"] == "service_healthy"
        assert f"qdrant-node-{i}:/qdrant/storage" in node["volumes"]
        # the p2p port accepts writes: never published
        assert not any("6335" in str(p) for p in node.get("ports", []))
    app = services["context-service-cluster"]
    env = {k: v for k, v in _env(app).items() if k.startswith("CTX_")}
    s = Settings(**{k[4:].lower(): v for k, v in env.items()})
    assert s.qdrant_url == "http://qdrant-node-1:6333"
    assert (s.qdrant_shards, s.qdrant_replication) == (3, 2)
    assert s.collection_main == "knowledge_main"
    assert s.qdrant_write_consistency <= s.qdrant_replication
    for i in (1, 2, 3):
        assert app["depends_on"][f"qdrant-node-{i}"]["condition"] == "service_healthy"
    # the default stack keeps one Qdrant and Qdrant's defaults (one shard, no replica)
    default = Settings(
        **{
            k[4:].lower(): v
            for k, v in _env(services["context-service"]).items()
            if k.startswith("CTX_")
        }
    )
    assert (default.qdrant_shards, default.qdrant_replication) == (1, 1)
    published = [p for svc in services.values() for p in svc.get("ports", [])]
    assert len(published) == len(set(published)), "two services publish the same port"


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
    for var in SECRETS:
        assert f"${{{var}:?" in text, f"{var} must come from the environment, required"


def _compose_bin() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("Debian's docker-compose is not installed (apt-get install docker-compose)")
    return exe


def test_docker_compose_config_accepts_the_file() -> None:
    exe = _compose_bin()
    env = {**os.environ, **{var: secrets.token_urlsafe(16) for var in SECRETS}}
    out = subprocess.run(
        [exe, "-f", str(COMPOSE), "config"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert set(resolved["services"]) == EXPECTED
    assert resolved["services"]["locust-master"]["environment"]["LOCUST_EXPECT_WORKERS"] == "2"
    assert resolved["services"]["locust-worker"]["deploy"]["replicas"] == 2
    cluster_app = resolved["services"]["context-service-cluster"]
    assert cluster_app["profiles"] == [CLUSTER_PROFILE]
    assert cluster_app["environment"]["CTX_QDRANT_SHARDS"] == "3"
    assert cluster_app["environment"]["CTX_QDRANT_REPLICATION"] == "2"
    assert cluster_app["environment"]["CTX_REDIS_URL"] == "redis://valkey:6379/0"  # merged
    node2 = resolved["services"]["qdrant-node-2"]
    assert node2["environment"]["QDRANT__CLUSTER__ENABLED"] == "true"
    assert node2["profiles"] == [CLUSTER_PROFILE]
    # anchors and merges resolved: the scheduler inherits the CTX_* block
    assert resolved["services"]["airflow-scheduler"]["environment"]["CTX_REDIS_URL"] == (
        "redis://valkey:6379/0"
    )


def test_docker_compose_config_names_a_missing_secret() -> None:
    exe = _compose_bin()
    env = {k: v for k, v in os.environ.items() if k not in {"POSTGRES_PASSWORD"}}
    env.update({var: secrets.token_urlsafe(16) for var in SECRETS if var != "POSTGRES_PASSWORD"})
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


def test_the_schema_is_migrated_by_its_owner_before_anything_serves(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    job = services["ctx-db-upgrade"]
    assert job["command"] == ["ctx", "db", "upgrade"]
    env = _env(job)
    owner_url = env["CTX_POSTGRES_OWNER_URL"]
    assert owner_url.startswith("postgresql://ctx_owner:${PG_CTX_OWNER_PASSWORD:?")
    assert env["CTX_POSTGRES_APP_ROLE"] == "ctx_app"
    Settings(**{k[4:].lower(): v for k, v in env.items()})  # the values parse
    # everything that reads the schema waits for the job, and serves as the app role only
    for name in ("context-service", "context-service-cluster", "airflow-scheduler"):
        svc = services[name]
        assert svc["depends_on"]["ctx-db-upgrade"]["condition"] == (
            "service_completed_successfully"
        ), name
        app_url = _env(svc)["CTX_POSTGRES_URL"]
        assert app_url.startswith("postgresql://ctx_app:") and app_url.endswith(
            "@postgres:5432/ctx"
        )
        assert "CTX_POSTGRES_OWNER_URL" not in _env(svc), f"{name} must not hold the owner DSN"
    init = "./deploy/postgres-init:/docker-entrypoint-initdb.d:ro"
    assert init in services["postgres"]["volumes"]
    script = (ROOT / "deploy" / "postgres-init" / "10-ctx-roles.sh").read_text(encoding="utf-8")
    for role in ("ctx_owner", "ctx_app"):
        assert f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS" in script
    assert "CREATE DATABASE ctx OWNER ctx_owner" in script
