"""The PostgreSQL schema as migrations: fresh upgrade, adoption of the old DDL, round trip,
refusal to start when behind, the serving role's privileges, `ctx db`.

Real PostgreSQL at 127.0.0.1:5432 (``tests/postgres_env.py``): every role is created here
with a unique name, NOSUPERUSER NOBYPASSRLS (superusers and BYPASSRLS roles ignore row-level
security), and dropped at the end with its schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from postgres_env import PG_ADMIN_URL, Pg, connect, create_role, drop_roles, pg_env, url_as
from typer.testing import CliRunner

from context_app.cli import app as cli
from context_core.access.compliance import PostgresComplianceStore
from context_core.config import Settings, get_settings
from context_core.errors import ConfigError, SchemaBehindError
from context_core.gateway.sanitize import Gateway
from context_core.postgres import (
    MigrationTarget,
    downgrade,
    head_revision,
    revisions,
    status,
    upgrade,
)

# What PostgresComplianceStore ran itself, as the serving role, before the migrations existed
# (context_core/access/compliance.py `_MIGRATION` at commit 92f38b4): a deployment of that
# release has this schema, owned by the serving role.
OLD_DDL = """
CREATE TABLE IF NOT EXISTS {s}.compliance_profiles (
    org_id text NOT NULL, user_id text NOT NULL DEFAULT '',
    version integer NOT NULL CHECK (version > 0), profile jsonb NOT NULL, sha256 text NOT NULL,
    updated_at timestamptz NOT NULL, updated_by text NOT NULL, PRIMARY KEY (org_id, user_id));
CREATE TABLE IF NOT EXISTS {s}.compliance_audit (
    id bigserial PRIMARY KEY, org_id text NOT NULL, user_id text NOT NULL DEFAULT '',
    version integer NOT NULL, operator text NOT NULL, at timestamptz NOT NULL,
    sha256 text NOT NULL, changed text[] NOT NULL, UNIQUE (org_id, user_id, version));
ALTER TABLE {s}.compliance_profiles ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.compliance_profiles FORCE ROW LEVEL SECURITY;
ALTER TABLE {s}.compliance_audit ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.compliance_audit FORCE ROW LEVEL SECURITY;
CREATE POLICY ctx_org_isolation ON {s}.compliance_profiles
    USING (org_id = current_setting('ctx.org_id', true))
    WITH CHECK (org_id = current_setting('ctx.org_id', true));
CREATE POLICY ctx_org_isolation ON {s}.compliance_audit
    USING (org_id = current_setting('ctx.org_id', true))
    WITH CHECK (org_id = current_setting('ctx.org_id', true));
"""


@pytest.fixture
def owner() -> Iterator[str]:
    """A non-superuser owner role allowed to create schemas in the test database."""
    from postgres_env import require_pg

    require_pg()
    conn = connect(PG_ADMIN_URL)
    try:
        with conn.cursor() as cur:
            role = create_role(cur, "ctx_owner")
            cur.execute(f"GRANT CREATE ON DATABASE {conn.info.dbname} TO {role}")
        try:
            yield role
        finally:
            with conn.cursor() as cur:
                cur.execute(f"REVOKE CREATE ON DATABASE {conn.info.dbname} FROM {role}")
                drop_roles(cur, role)
    finally:
        conn.close()


@pytest.fixture
def fresh() -> Iterator[Pg]:
    """A serving role and a schema name; nothing migrated yet."""
    with pg_env(migrate=False, prefix="ctx_mig") as env:
        yield env


def _one(conn: Any, sql: str, args: tuple[Any, ...] = ()) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        row = cur.fetchone()
        return None if row is None else row[0] if len(row) == 1 else row


def _catalog(env: Pg) -> dict[str, Any]:
    """What the catalog says about the schema: owners, RLS flags, policies, index, grants."""
    conn = env.admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT c.relname, pg_get_userbyid(c.relowner), c.relrowsecurity, "
                "c.relforcerowsecurity FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'S')",
                (env.schema,),
            )
            rels = {r[0]: r[1:] for r in cur.fetchall()}
            cur.execute(
                "SELECT tablename, policyname FROM pg_policies WHERE schemaname = %s",
                (env.schema,),
            )
            policies = sorted(cur.fetchall())
            cur.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (env.schema,))
            indexes = {r[0] for r in cur.fetchall()}
        schema_owner = _one(
            conn,
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s",
            (env.schema,),
        )
    finally:
        conn.close()
    return {"rels": rels, "policies": policies, "indexes": indexes, "owner": schema_owner}


def _privileges(env: Pg) -> dict[str, bool]:
    conn = env.admin()
    s, r = env.schema, env.role
    try:
        out = {
            f"schema {p}": _one(conn, "SELECT has_schema_privilege(%s, %s, %s)", (r, s, p))
            for p in ("USAGE", "CREATE")
        }
        for table in ("compliance_profiles", "compliance_audit"):
            for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"):
                out[f"{table} {p}"] = _one(
                    conn, "SELECT has_table_privilege(%s, %s, %s)", (r, f"{s}.{table}", p)
                )
        out["sequence USAGE"] = _one(
            conn,
            "SELECT has_sequence_privilege(%s, %s, 'USAGE')",
            (r, f"{s}.compliance_audit_id_seq"),
        )
        out["alembic_version SELECT"] = _one(
            conn, "SELECT has_table_privilege(%s, %s, 'SELECT')", (r, f"{s}.alembic_version")
        )
        out["alembic_version UPDATE"] = _one(
            conn, "SELECT has_table_privilege(%s, %s, 'UPDATE')", (r, f"{s}.alembic_version")
        )
    finally:
        conn.close()
    return out


SERVING_PRIVILEGES = {
    "schema USAGE": True,
    "schema CREATE": False,
    **{
        f"{t} {p}": p in ("SELECT", "INSERT", "UPDATE", "DELETE")
        for t in ("compliance_profiles", "compliance_audit")
        for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
    },
    "sequence USAGE": True,
    "alembic_version SELECT": True,
    "alembic_version UPDATE": False,
}


def _store(env: Pg, tmp_path: Path) -> PostgresComplianceStore:
    return PostgresComplianceStore(
        env.app_url, Gateway(audit_path=tmp_path / "audit.jsonl"), schema=env.schema
    )


def test_fresh_upgrade_by_a_non_superuser_owner(fresh: Pg, owner: str, tmp_path: Path) -> None:
    target = fresh.target(url_as(owner))
    before = status(target)
    assert (before.current, before.head, before.up_to_date) == (None, head_revision(), False)
    after = upgrade(target)
    assert (after.current, after.role, after.up_to_date) == (head_revision(), owner, True)
    assert revisions() == ["0001", "0002"]
    cat = _catalog(fresh)
    assert cat["owner"] == owner
    assert cat["rels"] == {
        "alembic_version": (owner, False, False),
        "compliance_profiles": (owner, True, True),
        "compliance_audit": (owner, True, True),
        "compliance_audit_id_seq": (owner, False, False),
    }
    assert cat["policies"] == [
        ("compliance_audit", "ctx_org_isolation"),
        ("compliance_profiles", "ctx_org_isolation"),
    ]
    assert "compliance_audit_org_at" in cat["indexes"]
    assert _privileges(fresh) == SERVING_PRIVILEGES
    assert upgrade(target).current == head_revision()  # again: nothing to do
    assert _catalog(fresh) == cat

    store = _store(fresh, tmp_path)  # the serving role opens it and works
    try:
        store.put("org-a", {"approved_tools": ["fetch"]}, expected_version=0, operator="op")
        store.put("org-b", {"approved_tools": ["b-only"]}, expected_version=0, operator="op")
        assert store.get("org-a").profile.approved_tools == ["fetch"]
        assert [e.version for e in store.history("org-b")] == [1]
    finally:
        store.close()


def test_the_serving_role_cannot_create_and_rls_holds_for_it(pg_migrated: Pg) -> None:
    import psycopg2

    env, s = pg_migrated, pg_migrated.schema
    app = env.app()
    try:
        for ddl in (
            f"CREATE TABLE {s}.sneaky (x int)",
            f"CREATE VIEW {s}.sneaky AS SELECT * FROM {s}.compliance_profiles",
            f"CREATE INDEX sneaky ON {s}.compliance_profiles (sha256)",
            f"ALTER TABLE {s}.compliance_profiles NO FORCE ROW LEVEL SECURITY",
            f"ALTER TABLE {s}.compliance_audit DISABLE ROW LEVEL SECURITY",
            f"DROP POLICY ctx_org_isolation ON {s}.compliance_profiles",
            f"UPDATE {s}.alembic_version SET version_num = '0001'",
        ):
            with pytest.raises(psycopg2.errors.InsufficientPrivilege), app, app.cursor() as cur:
                cur.execute(ddl)
        with app, app.cursor() as cur:  # org A writes and reads its own row
            cur.execute("SELECT set_config('ctx.org_id', 'org-a', true)")
            cur.execute(
                f"INSERT INTO {s}.compliance_profiles (org_id, user_id, version, profile, sha256, "
                "updated_at, updated_by) VALUES ('org-a', '', 1, '{}', 'x', now(), 'op')"
            )
            cur.execute(
                f"INSERT INTO {s}.compliance_audit (org_id, version, operator, at, sha256, "
                "changed) VALUES ('org-a', 1, 'op', now(), 'x', '{}')"
            )
        with app, app.cursor() as cur:
            cur.execute("SELECT set_config('ctx.org_id', 'org-b', true)")
            cur.execute(f"SELECT count(*) FROM {s}.compliance_profiles")
            assert cur.fetchone()[0] == 0  # B sees none of A's rows
            cur.execute(f"SELECT count(*) FROM {s}.compliance_audit WHERE org_id = 'org-a'")
            assert cur.fetchone()[0] == 0
            cur.execute(f"DELETE FROM {s}.compliance_profiles WHERE org_id = 'org-a'")
            assert cur.rowcount == 0
        with pytest.raises(psycopg2.errors.InsufficientPrivilege), app, app.cursor() as cur:
            cur.execute("SELECT set_config('ctx.org_id', 'org-b', true)")
            cur.execute(
                f"INSERT INTO {s}.compliance_profiles (org_id, user_id, version, profile, sha256, "
                "updated_at, updated_by) VALUES ('org-a', 'u', 1, '{}', 'x', now(), 'op')"
            )
        with app, app.cursor() as cur:
            cur.execute("SELECT set_config('ctx.org_id', 'org-a', true)")
            cur.execute(f"SELECT count(*) FROM {s}.compliance_profiles")
            assert cur.fetchone()[0] == 1  # A's row survived B's attempts
    finally:
        app.close()


@pytest.fixture
def pg_migrated() -> Iterator[Pg]:
    with pg_env(prefix="ctx_mig") as env:
        yield env


def test_upgrade_adopts_a_schema_the_old_code_created(
    fresh: Pg, owner: str, tmp_path: Path
) -> None:
    s = fresh.schema
    admin = fresh.admin()
    try:  # what an operator did for the old release: the schema owned by the serving role
        with admin.cursor() as cur:
            cur.execute(f"CREATE SCHEMA {s} AUTHORIZATION {fresh.role}")
    finally:
        admin.close()
    app = fresh.app()
    try:  # what the old release's store then ran, as the serving role, and a write of it
        with app, app.cursor() as cur:
            cur.execute(OLD_DDL.format(s=s))
            cur.execute("SELECT set_config('ctx.org_id', 'org-old', true)")
            cur.execute(
                f"INSERT INTO {s}.compliance_profiles (org_id, user_id, version, profile, sha256, "
                "updated_at, updated_by) VALUES ('org-old', '', 1, "
                """'{"approved_tools": ["legacy"]}', 'x', now(), 'op')"""
            )
            cur.execute(
                f"INSERT INTO {s}.compliance_audit (org_id, version, operator, at, sha256, "
                "changed) VALUES ('org-old', 1, 'op', now(), 'x', '{approved_tools}')"
            )
    finally:
        app.close()
    with pytest.raises(SchemaBehindError, match=r"no migrations applied.*`ctx db upgrade`"):
        _store(fresh, tmp_path)  # the new code refuses the unmigrated schema

    # an owner that may not take the old tables over is told what it needs
    with pytest.raises(ConfigError, match="member of their owner role"):
        upgrade(fresh.target(url_as(owner)))
    assert status(fresh.target()).current is None  # nothing half-done

    admin = fresh.admin()
    try:  # the documented path: the owner role becomes a member of the old owner
        with admin.cursor() as cur:
            cur.execute(f"GRANT {fresh.role} TO {owner}")
    finally:
        admin.close()
    assert upgrade(fresh.target(url_as(owner))).current == head_revision()
    cat = _catalog(fresh)
    assert cat["owner"] == owner  # the serving role lost the schema, so CREATE too
    assert {k: v[0] for k, v in cat["rels"].items()} == dict.fromkeys(cat["rels"], owner)
    assert cat["rels"]["compliance_profiles"][1:] == (True, True)
    assert len(cat["policies"]) == 2  # the old ones kept, none duplicated
    assert _privileges(fresh) == SERVING_PRIVILEGES
    store = _store(fresh, tmp_path)  # the old rows, read by the new code
    try:
        assert store.get("org-old").profile.approved_tools == ["legacy"]
        assert [e.version for e in store.history("org-old")] == [1]
        store.put("org-old", {"approved_tools": []}, expected_version=1, operator="op")
        assert [e.version for e in store.history("org-old")] == [1, 2]  # the sequence works
    finally:
        store.close()


def test_downgrade_upgrade_round_trip(pg_migrated: Pg, tmp_path: Path) -> None:
    env, target = pg_migrated, pg_migrated.target()
    store = _store(env, tmp_path)
    try:
        store.put("org-r", {"language": "de-DE"}, expected_version=0, operator="op")
    finally:
        store.close()
    assert downgrade(target, "0001").current == "0001"
    assert "compliance_audit_org_at" not in _catalog(env)["indexes"]
    with pytest.raises(SchemaBehindError, match=r"revision 0001, behind .* head 0002.*ctx db up"):
        _store(env, tmp_path)
    assert upgrade(target).current == "0002"
    assert "compliance_audit_org_at" in _catalog(env)["indexes"]
    store = _store(env, tmp_path)
    try:
        assert store.get("org-r").profile.language == "de-DE"  # 0002 -> 0001 -> 0002 kept it
    finally:
        store.close()
    assert downgrade(target, "base").current is None
    cat = _catalog(env)
    assert set(cat["rels"]) == {"alembic_version"} and cat["policies"] == []
    assert upgrade(target).current == "0002"
    assert _privileges(env) == SERVING_PRIVILEGES
    assert len(_catalog(env)["policies"]) == 2


def test_a_schema_ahead_of_the_code_is_refused(pg_migrated: Pg, tmp_path: Path) -> None:
    admin = pg_migrated.admin()
    try:
        with admin.cursor() as cur:
            cur.execute(f"UPDATE {pg_migrated.schema}.alembic_version SET version_num = '9999'")
    finally:
        admin.close()
    with pytest.raises(SchemaBehindError, match="revision 9999, unknown to this code"):
        _store(pg_migrated, tmp_path)


def test_the_owner_must_not_be_the_serving_role(fresh: Pg) -> None:
    with pytest.raises(ConfigError, match="keep CREATE"):
        upgrade(MigrationTarget(fresh.app_url, fresh.schema, fresh.role))


def test_the_service_refuses_to_start_when_behind(
    pg_migrated: Pg, settings: Settings, tmp_path: Path
) -> None:
    from context_app.service.app import create_app

    downgrade(pg_migrated.target(), "0001")
    s = get_settings(
        **{
            **settings.model_dump(),
            "postgres_url": pg_migrated.app_url,
            "postgres_schema": pg_migrated.schema,
        }
    )
    res = CliRunner().invoke(
        cli,
        ["serve", "--port", "1"],  # refused before uvicorn binds anything
        env={"CTX_POSTGRES_URL": pg_migrated.app_url, "CTX_POSTGRES_SCHEMA": pg_migrated.schema},
    )
    assert res.exit_code == 2
    assert "ctx serve: PostgreSQL schema" in res.output and "run `ctx db upgrade`" in res.output
    app = create_app(s)  # `uvicorn --factory` skips the command: the lifespan refuses too
    with pytest.raises(SchemaBehindError) as info, TestClient(app):
        pass  # pragma: no cover - the lifespan raises before this
    msg = str(info.value)
    assert "behind the code's head 0002" in msg and "run `ctx db upgrade`" in msg
    upgrade(pg_migrated.target())  # after the upgrade the platform opens
    from context_core.platform import build_platform

    with build_platform(s, with_knowledge=False) as p:
        assert p.compliance.get("org-x").version == 0


# --- the commands -------------------------------------------------------------------------------


def test_ctx_db_commands(fresh: Pg, owner: str) -> None:
    runner = CliRunner()
    env = {
        "CTX_POSTGRES_OWNER_URL": url_as(owner),
        "CTX_POSTGRES_URL": fresh.app_url,  # names the serving role to grant
        "CTX_POSTGRES_SCHEMA": fresh.schema,
    }
    res = runner.invoke(cli, ["db", "check"], env=env)
    assert res.exit_code == 1 and "behind: run `ctx db upgrade`" in res.output
    res = runner.invoke(cli, ["db", "upgrade"], env=env)
    assert res.exit_code == 0, res.output
    assert f"upgraded schema {fresh.schema} from (none) to 0002 as role {owner}" in res.output
    assert f"serving role {fresh.role} holds (read back from the catalog):" in res.output
    assert "  schema: USAGE\n" in res.output  # and not CREATE
    assert "  compliance_profiles: SELECT, INSERT, UPDATE, DELETE\n" in res.output
    assert "  alembic_version: SELECT\n" in res.output
    assert _privileges(fresh) == SERVING_PRIVILEGES
    res = runner.invoke(cli, ["db", "upgrade"], env=env)  # again: nothing to run
    assert res.exit_code == 0 and f"schema {fresh.schema} already at 0002" in res.output
    res = runner.invoke(cli, ["db", "current"], env=env)
    assert res.exit_code == 0
    assert f"schema {fresh.schema}: revision 0002, head 0002 (up to date)" in res.output
    assert runner.invoke(cli, ["db", "check"], env=env).exit_code == 0
    res = runner.invoke(cli, ["db", "downgrade", "0001"], env=env)
    assert res.exit_code == 2 and "--yes" in res.output  # refused without confirmation
    assert status(fresh.target()).current == "0002"
    res = runner.invoke(cli, ["db", "downgrade", "0001", "--yes"], env=env)
    assert res.exit_code == 0 and "revision 0001, head 0002" in res.output
    res = runner.invoke(cli, ["db", "history"])
    assert res.exit_code == 0 and res.output.splitlines()[0].startswith("0001  Compliance")
    # a second serving role, named on the command line, is granted by the next upgrade
    admin = connect(PG_ADMIN_URL)
    try:
        with admin.cursor() as cur:
            other = create_role(cur, "ctx_app2")
        res = runner.invoke(
            cli,
            ["db", "upgrade", "--dsn", url_as(owner), "--schema", fresh.schema,
             "--app-role", other],
            env={},
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        assert f"serving role {other} holds" in res.output and "  schema: USAGE\n" in res.output
        assert _privileges(Pg(PG_ADMIN_URL, url_as(other), fresh.schema, other)) == (
            SERVING_PRIVILEGES
        )
    finally:
        with admin.cursor() as cur:
            drop_roles(cur, other)
        admin.close()
    # no owner DSN: the error names the variable
    res = runner.invoke(cli, ["db", "upgrade"], env={"CTX_POSTGRES_SCHEMA": fresh.schema})
    assert res.exit_code == 2 and "CTX_POSTGRES_OWNER_URL" in res.output
    # a server that does not answer: exit 3, the password hidden
    res = runner.invoke(
        cli, ["db", "upgrade", "--dsn", "postgresql://u:hunter2secret@127.0.0.1:1/x"], env=env
    )
    assert res.exit_code == 3 and "hunter2secret" not in res.output and "***" in res.output


def test_the_airflow_deployment_migrates_the_platform_schema(
    fresh: Pg, owner: str, tmp_path: Path
) -> None:
    from context_app.airflow_deploy import AirflowDeployError, AirflowDeployment

    home = tmp_path / "airflow"
    home.mkdir()
    base = {"CTX_POSTGRES_URL": fresh.app_url, "CTX_POSTGRES_SCHEMA": fresh.schema}
    dep = AirflowDeployment(home=home, db_name="unused", extra_env=base)
    with pytest.raises(AirflowDeployError, match=r"`ctx db check` failed \(exit 1\)"):
        dep.migrate_platform_schema()  # no owner URL: checked, and behind
    assert "behind: run `ctx db upgrade`" in (home / "db-upgrade.log").read_text()
    dep.extra_env["CTX_POSTGRES_OWNER_URL"] = url_as(owner)
    assert dep.migrate_platform_schema() == "ctx db upgrade"
    assert status(fresh.target()).current == head_revision()
    assert _privileges(fresh) == SERVING_PRIVILEGES
    del dep.extra_env["CTX_POSTGRES_OWNER_URL"]
    assert dep.migrate_platform_schema() == "ctx db check"
    bare = AirflowDeployment(home=home, db_name="unused", extra_env={"CTX_POSTGRES_URL": ""})
    assert bare.migrate_platform_schema() is None  # profiles in Redis: nothing to migrate


def test_concurrent_upgrades_run_one_after_the_other(fresh: Pg) -> None:
    """Three deployments starting at once on an empty schema (three processes, as in a
    rollout): the advisory lock serialises them, the later ones find nothing to do, all end at
    head with one version row; threads of one process take turns too."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    cmd = [sys.executable, "-m", "context_app.cli", "db", "upgrade", "--dsn", fresh.admin_url,
           "--schema", fresh.schema, "--app-role", fresh.role]  # fmt: skip
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert sum(f"from (none) to {head_revision()}" in o for o in outs) == 1, outs
    assert sum("already at" in o for o in outs) == 2, outs
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: upgrade(fresh.target()), range(2)))
    assert [r.current for r in results] == [head_revision()] * 2
    conn = fresh.admin()
    try:
        assert _one(conn, f"SELECT count(*) FROM {fresh.schema}.alembic_version") == 1
    finally:
        conn.close()
    assert len(_catalog(fresh)["policies"]) == 2
