"""`ctx session-demo`: a scripted agent session through L1, L2, L3 and shared namespaces."""

from __future__ import annotations

from typing import Any

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("session-demo")(session_demo)
    app.command("sweep-idle")(sweep_idle)
    app.command("migrate-user-keys")(migrate_user_keys)


def migrate_user_keys(
    org: str = typer.Option(
        ...,
        "--org",
        help="The organisation the legacy (unscoped) preferences belong to; its compliance "
        "user profiles with non-canonical ids move too.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Report what would move; change nothing."
    ),
    drop: bool = typer.Option(
        False, "--drop", help="Delete the legacy preference keys instead of moving them."
    ),
) -> None:
    """Carry user records written before user ids were scoped by organisation and canonical
    (pref:{<uid>}:* and non-canonical compliance user ids) over to their new keys, or drop
    them. Until then they are unreachable, never shared. Idempotent; prints a JSON report
    (counts and ids, never values)."""
    import json as _json

    from context_core.access.user_keys_migration import migrate_user_keys as migrate
    from context_core.config import get_settings
    from context_core.errors import ContextError
    from context_core.platform import build_platform

    settings = get_settings()
    try:
        with build_platform(settings, with_knowledge=False) as platform:
            report = migrate(platform.redis, org, dry_run=dry_run, drop=drop)
    except ContextError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from e
    typer.echo(_json.dumps(report.to_dict(), indent=2))


def sweep_idle(
    idle_s: int = typer.Option(
        None,
        "--idle-s",
        help="Idle time that times a session out (default CTX_SESSION_IDLE_S, 90).",
    ),
) -> None:
    """Time out every session idle for longer than CTX_SESSION_IDLE_S, once.

    The service runs this every CTX_IDLE_SWEEP_INTERVAL_S by itself; this command is for
    library deployments without the service, or a cron/Airflow job. Effects are those of
    session_timeout: the task contract is marked expired and kept, the session's other L2
    keys are deleted, and a service session's stored L1 state gets an empty trace.
    """
    import json as _json

    from context_app.service.deps import STATE_KEY, _session_ttl_s
    from context_app.service.idle import IdleSweepParts, sweep_idle_once
    from context_app.service.metrics import ServiceMetrics
    from context_app.service.owners import OwnerBinding
    from context_core.config import get_settings
    from context_core.platform import build_platform

    settings = get_settings(**({"session_idle_s": idle_s} if idle_s else {}))
    # L1/L2 only: timing sessions out needs neither the vector store nor the model
    with build_platform(settings, with_knowledge=False) as platform:
        client = platform.redis
        raw_key = client.get(STATE_KEY)
        svc = IdleSweepParts(
            redis=client,
            gateway=platform.gateway,
            owners=OwnerBinding(client, ttl_s=_session_ttl_s(settings)),
            # without the service's signing key there is no service L1 state to clear
            state_key=str(raw_key or "").encode(),
            lifecycle=platform.lifecycle,
            metrics=ServiceMetrics(),
        )
        result = sweep_idle_once(svc)
    if not result.ran:
        typer.secho("another sweep is running (lock held); nothing done", fg="yellow", err=True)
        raise typer.Exit(1)
    typer.echo(_json.dumps(result.to_dict(), indent=2))


def session_demo(
    session_id: str = typer.Option(
        None, "--session-id", help="Session id to use (default: demo-<random>)."
    ),
    l3_timeout_ms: float = typer.Option(
        None, "--l3-timeout-ms", help="L3 budget per route (default CTX_L3_TIMEOUT_MS, 100)."
    ),
    width: int = typer.Option(70, "--width", help="Characters of content shown per fragment."),
) -> None:
    """Run a scripted pump-vibration investigation and print every context bundle.

    Uses the configured stores (embedded Valkey and Qdrant Edge under CTX_DATA_DIR unless
    CTX_REDIS_URL / CTX_QDRANT_URL are set) and the offline MiniLM model. Each step prints
    the fragments the agent received with their provenance (source key or point id,
    confidence label, freshness); traces go to CTX_DATA_DIR/traces for `ctx eval cer`.
    Fill the knowledge base first with `ctx ingest <export>` or `make run`.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from context_app.demo import DemoStep, bundle_rows, run_demo
    from context_core.config import get_settings
    from context_core.platform import build_platform

    console = Console()
    settings = get_settings(**({"l3_timeout_ms": l3_timeout_ms} if l3_timeout_ms else {}))

    def on_event(name: str, effects: dict[str, Any]) -> None:
        shown = {k: v for k, v in effects.items() if k not in {"contract", "expiring"}}
        if "expiring" in effects:
            shown["expiring_keys"] = len(effects["expiring"])
        console.print(f"[bold magenta]event[/] {name} {shown}")

    def on_bundle(s: DemoStep) -> None:
        b = s.bundle
        t = b.timings_ms
        title = (
            f"step {b.step} · {b.intent} · degraded={b.degraded} · "
            f"l1 {t['l1']:.2f} / l2 {t['l2']:.2f} / l3 {t['l3']:.2f} / total {t['total']:.2f} ms"
        )
        table = Table(title=title, title_justify="left", show_lines=False, expand=False)
        for col in ("layer", "source", "label", "conf", "age h", "content"):
            if col == "source":
                table.add_column(col, overflow="fold")
            else:
                table.add_column(col, no_wrap=True, overflow="ellipsis")
        for row in bundle_rows(b, width=width):
            table.add_row(*(Text(cell) for cell in row))  # content is data, never markup
        console.print(table)
        console.print(Text("agent output: ", style="dim") + Text(s.output + "\n"))

    with build_platform(settings) as platform:
        with console.status("loading the embedding model and opening the stores..."):
            _ = platform.knowledge
        result = run_demo(
            settings,
            platform=platform,
            session_id=session_id,
            on_event=on_event,
            on_bundle=on_bundle,
            on_start=lambda n: _announce(console, n),
        )
    console.print(
        f"[bold green]done[/]: session {result.session_id}, {len(result.steps)} routed steps, "
        f"traces in {result.traces_dir}"
    )


def _announce(console: Any, knowledge_points: int | None) -> None:
    if not knowledge_points:
        console.print(
            "[yellow]knowledge_main is empty[/]: L3 will find nothing, the demo still runs "
            "L1 + L2. Fill it with `ctx ingest <confluence export>` or `make run`."
        )
    else:
        console.print(f"knowledge_main holds {knowledge_points} chunks")
