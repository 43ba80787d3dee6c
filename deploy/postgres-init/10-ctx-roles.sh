#!/bin/bash
# Run once by the postgres image when its data volume is first initialised
# (/docker-entrypoint-initdb.d): the context platform's database and its two roles.
#   ctx_owner: owns database ctx and the schema; `ctx db upgrade` runs the migrations as it.
#   ctx_app:   the serving role; the migrations grant it DML on the tables, never CREATE.
# Neither is a superuser or BYPASSRLS (both would ignore row-level security).
# Passwords come from the environment (PG_CTX_OWNER_PASSWORD, PG_CTX_APP_PASSWORD), never here.
set -euo pipefail
: "${PG_CTX_OWNER_PASSWORD:?set PG_CTX_OWNER_PASSWORD}" "${PG_CTX_APP_PASSWORD:?set PG_CTX_APP_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v owner_pw="$PG_CTX_OWNER_PASSWORD" -v app_pw="$PG_CTX_APP_PASSWORD" <<'SQL'
CREATE ROLE ctx_owner LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB PASSWORD :'owner_pw';
CREATE ROLE ctx_app LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB PASSWORD :'app_pw';
CREATE DATABASE ctx OWNER ctx_owner;
REVOKE ALL ON DATABASE ctx FROM PUBLIC;
GRANT CONNECT ON DATABASE ctx TO ctx_app;
\connect ctx
REVOKE ALL ON SCHEMA public FROM PUBLIC;
SQL
