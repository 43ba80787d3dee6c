"""`ctx serve` (the context service) and `ctx loadtest PROFILE` (a Locust campaign).

Logs of `ctx serve`: uvicorn's own loggers (``uvicorn``, ``uvicorn.error``, ``uvicorn.access``)
do not propagate to the root logger the CLI cleans, so each worker installs the gateway's
redaction on them (:func:`install_serve_log_redaction`, from the :func:`serve_app` factory, i.e.
after uvicorn configured logging) plus :class:`SecretQueryFilter`, which blanks the values of
secret-looking query parameters (``?api_key=...``, ``&token=...``, ``sig=``...) in access lines.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import typer

if TYPE_CHECKING:
    from fastapi import FastAPI
    from rich.console import Console

    from context_core.gateway.sanitize import Gateway
    from loadtests.campaign import CampaignResult

PROFILES_HELP = (
    "short_sessions (1,000 QPS, 2.3 min sessions), long_sessions (100 QPS, 47 min), "
    "burst (200 -> 3,000 QPS)"
)


SERVE_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
_QUERY_PARAM = re.compile(r"([?&;])([^=&;#\s\"'?]+)=([^&;#\s\"']*)")
_SECRET_WORDS = frozenset(
    {
        "key", "apikey", "token", "password", "passwd", "pwd", "pass", "secret", "signature",
        "sig", "auth", "authorization", "credential", "credentials", "jwt", "otp", "code",
        "cookie", "session", "sessionid", "privatekey", "accesskey",
    }
)  # fmt: skip
_SECRET_ENDINGS = ("key", "token", "secret", "password", "signature", "sig", "auth")


def secret_param(name: str) -> bool:
    """True for a query parameter name that may carry a secret (generous on purpose: an
    over-blanked access-log value costs nothing)."""
    from context_core.gateway.redaction import is_secret_key

    name = unquote(name)
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return bool(words) and (
        any(w in _SECRET_WORDS for w in words)
        or "".join(words).endswith(_SECRET_ENDINGS)
        or is_secret_key(name)
    )


def scrub_query(text: str) -> str:
    """``text`` with the value of every secret-looking ``name=value`` query parameter blanked."""
    if "=" not in text:
        return text

    def sub(m: re.Match[str]) -> str:
        return f"{m.group(1)}{m.group(2)}=***" if secret_param(m.group(2)) else m.group(0)

    return _QUERY_PARAM.sub(sub, text)


class SecretQueryFilter(logging.Filter):
    """Blanks secret query parameter values in a record, keeping uvicorn's args tuple intact
    (its ``AccessFormatter`` unpacks it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(scrub_query(a) if isinstance(a, str) else a for a in record.args)
        elif not record.args and isinstance(record.msg, str):
            record.msg = scrub_query(record.msg)
        return True


def serve_log_config() -> dict[str, Any]:
    """uvicorn's logging config with :class:`SecretQueryFilter` on its loggers and an access
    format that prints the (cleaned) message, since the gateway's filter formats the record."""
    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["filters"] = {"secret_query": {"()": f"{__name__}.SecretQueryFilter"}}
    cfg["formatters"]["access"] = {
        "()": "uvicorn.logging.DefaultFormatter",
        "fmt": "%(levelprefix)s %(message)s",
    }
    for name in SERVE_LOGGERS:
        cfg["loggers"].setdefault(name, {})["filters"] = ["secret_query"]
    return cfg


def install_serve_log_redaction(gateway: Gateway) -> None:
    """The gateway's log redaction and :class:`SecretQueryFilter` on uvicorn's loggers."""
    from context_core.gateway.sanitize import install_log_redaction

    for name in SERVE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, SecretQueryFilter) for f in logger.filters):
            logger.addFilter(SecretQueryFilter())
        install_log_redaction(gateway, logger)


def serve_app() -> FastAPI:
    """The uvicorn factory `ctx serve` runs in each worker, after uvicorn set up logging."""
    from context_app.service import create_app
    from context_core.config import get_settings
    from context_core.gateway.sanitize import Gateway

    settings = get_settings()
    install_serve_log_redaction(Gateway.from_settings(settings))
    return create_app(settings)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("serve")(serve)
    app.command("loadtest")(loadtest)


def serve(
    host: str = typer.Option(None, "--host", help="Bind address (default CTX_SERVICE_HOST)."),
    port: int = typer.Option(None, "--port", help="Port (default CTX_SERVICE_PORT, 8080)."),
    workers: int = typer.Option(1, "--workers", min=1, help="uvicorn worker processes."),
    grpc_port: int = typer.Option(
        None,
        "--grpc-port",
        min=1,
        max=65535,
        help="Also serve gRPC (context.v1, docs/grpc.md) on this port (default CTX_GRPC_PORT).",
    ),
    no_http: bool = typer.Option(
        False, "--no-http", help="gRPC alone: no HTTP listener (needs --grpc-port)."
    ),
) -> None:
    """Start the context service (FastAPI on uvicorn).

    Embedded defaults: with no CTX_REDIS_URL an embedded Valkey starts under CTX_DATA_DIR,
    with no CTX_QDRANT_URL Qdrant Edge runs in-process. With no CTX_API_KEYS_FILE a dev API
    key is generated and printed once. OpenAPI: http://HOST:PORT/docs and /openapi.json.
    With --workers > 1 the workers share one Redis (an embedded Valkey unless CTX_REDIS_URL),
    one edge server owns the Qdrant Edge shards (unless CTX_QDRANT_URL) and metrics are
    aggregated across workers through PROMETHEUS_MULTIPROC_DIR.
    With --grpc-port the same process also serves gRPC over the same services (one worker);
    --no-http serves gRPC alone (metrics then come from the HTTP /metrics of a process that
    has both).
    """
    import uvicorn

    from context_core.config import get_settings
    from context_core.redis.connection import RedisProvider

    if grpc_port:
        os.environ["CTX_GRPC_PORT"] = str(grpc_port)  # read by each app's settings
        if host:
            os.environ["CTX_SERVICE_HOST"] = host  # gRPC binds the same address
    settings = get_settings()
    if settings.postgres_url:  # refuse before any worker starts: the schema must be at head
        from context_core.errors import ContextError
        from context_core.postgres import require_head

        try:
            require_head(settings.postgres_url, settings.postgres_schema)
        except ContextError as e:
            typer.secho(f"ctx serve: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from e
    host = host or settings.service_host
    port = port or settings.service_port
    if settings.grpc_port and workers > 1:
        raise typer.BadParameter(
            "gRPC runs in a single worker for now: drop --workers, or run a second "
            "`ctx serve --grpc-port N --no-http` process for gRPC",
            param_hint="--grpc-port",
        )
    if no_http:
        if not settings.grpc_port:
            raise typer.BadParameter(
                "--no-http serves gRPC alone: give --grpc-port N", param_hint="--no-http"
            )
        _serve_grpc_only(host)
        return
    app_ref = f"{__name__}:serve_app"
    if workers == 1:
        uvicorn.run(
            app_ref,
            factory=True,
            host=host,
            port=port,
            log_level="info",
            log_config=serve_log_config(),
        )
        return
    provider = None
    if not settings.redis_url:
        # One embedded Valkey for every worker, handed down as CTX_REDIS_URL.
        provider = RedisProvider(settings)
        os.environ["CTX_REDIS_URL"] = provider.url
        typer.echo(f"embedded Valkey for {workers} workers at {provider.safe_url}", err=True)
    if not settings.api_keys_file:
        raise typer.BadParameter(
            "--workers > 1 needs CTX_API_KEYS_FILE (a dev key generated per worker would differ); "
            "make one with: python -m context_core.access.auth --out DIR --agents my-agent",
            param_hint="--workers",
        )
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="ctx-metrics-"))
    edge = None
    if not settings.qdrant_url and not settings.edge_socket:
        # An Edge shard opens in one process only: one edge server owns them, the workers
        # search through its socket (CTX_EDGE_SOCKET).
        from context_core.knowledge.edge_server import start_edge_server

        sock = Path(tempfile.mkdtemp(prefix="ctx-edge-")) / "edge.sock"
        edge = start_edge_server(settings.qdrant_dir, sock, settings.qdrant_search_threads or None)
        os.environ["CTX_EDGE_SOCKET"] = str(sock)
        typer.echo(f"embedded Qdrant Edge for {workers} workers behind {sock}", err=True)
    try:
        uvicorn.run(
            app_ref,
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="info",
            log_config=serve_log_config(),
        )
    finally:
        if edge is not None:
            from context_core.knowledge.edge_server import stop_edge_server

            stop_edge_server(edge)
        if provider is not None:
            provider.close()


def _serve_grpc_only(host: str) -> None:
    import asyncio

    from context_app.rpc.server import serve_grpc_only
    from context_core.config import get_settings
    from context_core.gateway.sanitize import Gateway

    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    settings = get_settings(service_host=host)
    install_serve_log_redaction(Gateway.from_settings(settings))
    asyncio.run(serve_grpc_only(settings))


def _seconds(text: str) -> float:
    """'90', '90s', '2m', '1h30m' -> seconds."""
    m = re.fullmatch(
        r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text
    )
    if not m or not any(m.groups()):
        raise typer.BadParameter(f"{text!r}: use e.g. 90s, 2m or 1h30m", param_hint="--duration")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s


def loadtest(
    profile: str = typer.Argument(..., help=PROFILES_HELP),
    duration: str = typer.Option(
        "2m", "--duration", help="Run length (90s, 2m, 1h); the profile is compressed into it."
    ),
    time_scale: float = typer.Option(
        None, "--time-scale", help="Profile seconds per run second (default: squeeze to fit)."
    ),
    rate_scale: float = typer.Option(
        0.02, "--rate-scale", help="Multiply the profile's rate (0.02: 1,000 QPS -> 20 req/s)."
    ),
    service_url: str = typer.Option(
        None, "--service-url", help="Use a running service on loopback (needs --keys-file)."
    ),
    redis_url: str = typer.Option(
        None, "--redis-url", help="Redis for the service (default: a Valkey the campaign owns)."
    ),
    keys_file: str = typer.Option(
        None, "--keys-file", help="JSON {agent_id: raw API key} for --service-url."
    ),
    fault: str = typer.Option(
        None,
        "--fault",
        help="Fault drill: slow-l3, redis-restart or short-ttl (TTLs too short: the "
        "campaign must FAIL on premature_expirations).",
    ),
    no_seed: bool = typer.Option(
        False, "--no-seed", help="Do not index the sample export for L3 first."
    ),
    no_warm_up: bool = typer.Option(
        False,
        "--no-warm-up",
        help="Skip the warm-up (one closed session per device walking every intent, not in "
        "Locust's statistics) that fills the query-embedding cache before the load: the run "
        "then measures a cold start.",
    ),
    valkey_tcp: bool = typer.Option(
        False,
        "--valkey-tcp",
        help="Reach the campaign's own Valkey over TCP loopback instead of its Unix socket "
        "(about a fifth more service CPU per request here; a Redis on another host is TCP).",
    ),
    locust_workers: int = typer.Option(
        0,
        "--workers",
        min=0,
        help="Locust worker processes; 0 = one Locust process. N > 0: Locust's master (the "
        "shape, the sampler, the verdict; on a free loopback port) + N workers running the "
        "users, all on this machine. Workers on other machines join a plain Locust master: "
        "locust -f loadtests/locustfile.py --worker --master-host HOST.",
    ),
    service_workers: int = typer.Option(
        0,
        "--service-workers",
        min=0,
        help="Service (uvicorn) worker processes; 0 = one per CPU (CTX_SERVICE_EXECUTION=loop, "
        "the default; one per CPU plus one on threads). With more than one an edge server "
        "owns the Qdrant Edge shards.",
    ),
) -> None:
    """Run a load-test campaign on this machine and exit 0 (SLOs held) or 1 (breached).

    Starts a Valkey and the service on free loopback ports (unless given), runs Locust
    headless with the profile's shape, samples the service's /metrics and Redis INFO, and
    writes reports/loadtest_<profile>[_fault-<f>].{md,png,html} plus Locust's CSV files.
    With --workers N the load comes from N Locust worker processes under a master
    that gates on their summed stats (flushed by every worker before each sample).
    """
    from rich.console import Console

    from context_core.config import get_settings
    from context_core.errors import ConfigError
    from loadtests.campaign import CampaignConfig, auto_workers, run_campaign
    from loadtests.shapes import PROFILES

    console = Console()
    if profile not in PROFILES:
        raise typer.BadParameter(
            f"{profile!r}; allowed: {', '.join(sorted(PROFILES))}", param_hint="PROFILE"
        )
    cfg = CampaignConfig(
        profile=profile,
        duration_s=_seconds(duration),
        time_scale=time_scale,
        rate_scale=rate_scale,
        service_url=service_url,
        redis_url=redis_url,
        keys_file=Path(keys_file) if keys_file else None,
        fault=fault,
        seed_knowledge=not no_seed,
        warm_up=not no_warm_up,
        valkey_unix_socket=not valkey_tcp,
        service_workers=service_workers or auto_workers(),
        locust_workers=locust_workers,
    )
    try:
        with console.status(f"[bold]load test {profile}[/] running ({duration})..."):
            res = run_campaign(cfg, get_settings(), say=lambda m: console.print(f"  {m}"))
    except ConfigError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    _print_campaign(console, res, profile, fault)
    raise typer.Exit(0 if res.passed else 1)


def _print_campaign(console: Console, res: CampaignResult, profile: str, fault: str | None) -> None:
    """The SLO gates (and a fault drill's checks) as a table, the notes, reports, verdict."""
    from rich.table import Table

    table = Table(title=f"SLO gates: {profile}" + (f" (fault {fault})" if fault else ""))
    for col in ("gate", "target", "achieved", "result"):
        table.add_column(col)
    expected = set(res.slo.get("expected_breaches", []))
    for r in res.slo.get("results", []):
        ok = "PASS" if r["passed"] else ("expected" if r["name"] in expected else "FAIL")
        ach = "-" if r["achieved"] is None else f"{r['achieved']:.4g}"
        table.add_row(r["name"], r["target"], ach, ok)
    for r in res.slo.get("figures", []):  # reported next to the gates, never failing the run
        ach = "-" if r["achieved"] is None else f"{r['achieved']:.4g}"
        table.add_row(r["name"], r["target"], ach, "reported")
    for c in res.fault_checks:
        table.add_row(f"fault: {c.name}", c.expected, c.observed, "PASS" if c.passed else "FAIL")
    console.print(table)
    for n in res.notes:
        console.print(f"  note: {n}")
    console.print(f"report: {res.report}\nhtml:   {res.html}")
    verdict = "[green]PASS[/]" if res.passed else "[red]FAIL[/]"
    console.print(f"verdict: {verdict}")
