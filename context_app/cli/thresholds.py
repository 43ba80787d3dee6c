"""`ctx eval thresholds ...`: calibration versions, promotion, rollback and shadow runs.

A thin shell over :mod:`evaluation.promotion` and :mod:`evaluation.shadow`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from context_core.errors import ContextError

app = typer.Typer(
    no_args_is_help=True,
    help="Calibration versions: list, show, promote, rollback, shadow.",
)


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)


def _store() -> Any:
    from context_core.config import get_settings
    from evaluation.promotion import VersionStore

    return VersionStore.for_settings(get_settings())


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


@app.command("list")
def list_cmd() -> None:
    """Every stored calibration version, oldest first; `*` marks the one in force."""
    from rich.console import Console
    from rich.table import Table

    from evaluation.promotion import summarize_versions

    store = _store()
    rows = summarize_versions(store)
    if not rows:
        typer.echo(f"no calibration versions under {store.root} yet (run `ctx eval calibrate`)")
        return
    table = Table(title=f"calibrations in {store.root}")
    for col in ("", "version", "created", "by", "rows", "accept", "skip", "AUC", "p_rel",
                "gates", "promoted"):  # fmt: skip
        table.add_column(col)
    for r in rows:
        table.add_row(
            "*" if r["in_force"] else "", r["version"], str(r["created_at"]), str(r["ran_by"]),
            str(r["rows"] if r["rows"] is not None else "–"), _fmt(r["accept"]),
            _fmt(r["skip"]), _fmt(r["auc"]), "yes" if r["relevance"] else "no", r["gates"],
            "yes" if r["promoted"] else "no",
        )  # fmt: skip
    Console(width=160).print(table)


@app.command()
def show(
    version: Annotated[
        str | None, typer.Argument(help="Version id [default: the one in force].")
    ] = None,
) -> None:
    """A version's thresholds, gates and provenance (JSON)."""
    store = _store()
    try:
        vid = version or store.current_id()
        if vid is None:
            raise _fail("no calibration is in force; name a version (`ctx eval thresholds list`)")
        v = store.get(vid)
    except ContextError as e:
        raise _fail(str(e)) from e
    doc = {
        "version": v.id,
        "in_force": v.id == store.current_id(),
        "path": str(v.path),
        "accept": v.thresholds.get("accept"),
        "skip": v.thresholds.get("skip"),
        "model": v.thresholds.get("model"),
        "relevance_model": None
        if v.relevance is None
        else {k: v.relevance.get(k) for k in ("kind", "features", "accept", "skip")},
        "provenance": v.provenance,
    }
    typer.echo(json.dumps(doc, indent=2, default=str))


@app.command()
def promote(
    version: Annotated[str, typer.Argument(help="Version id to put in force.")],
    force: Annotated[
        bool, typer.Option("--force", help="Promote although its gates failed (needs --reason).")
    ] = False,
    reason: Annotated[str | None, typer.Option(help="Why (recorded in the history).")] = None,
) -> None:
    """Put a stored version in force (the router reloads it on its next route)."""
    from evaluation.promotion import ran_by
    from evaluation.workflows import check_force

    store = _store()
    try:
        check_force(force, reason)
        v = store.get(version)
        failed = list((v.provenance.get("gates") or {}).get("failed") or [])
        if failed and not force:
            raise _fail(
                f"NOT PROMOTED: {v.id} failed gate(s) {', '.join(failed)} when it was "
                'calibrated; pass --force --reason "..." to promote it anyway'
            )
        v = store.promote(v.id, by=ran_by(), reason=reason, forced=bool(failed))
    except ContextError as e:
        raise _fail(str(e)) from e
    typer.echo(
        f"PROMOTED {v.id}: accept {v.thresholds['accept']:.3f}, skip {v.thresholds['skip']:.3f}"
        f"{', with p_relevant model' if v.relevance else ''} -> {store.thresholds_path}"
    )


@app.command()
def rollback(
    reason: Annotated[str | None, typer.Option(help="Why (recorded in the history).")] = None,
) -> None:
    """Return to the version promoted before the one in force."""
    from evaluation.promotion import ran_by

    store = _store()
    before = store.current_id()
    try:
        v = store.rollback(by=ran_by(), reason=reason)
    except ContextError as e:
        raise _fail(str(e)) from e
    typer.echo(
        f"ROLLED BACK {before} -> {v.id}: accept {v.thresholds['accept']:.3f}, skip "
        f"{v.thresholds['skip']:.3f} -> {store.thresholds_path}"
    )


@app.command()
def shadow(
    version: Annotated[str, typer.Argument(help="Candidate version to run in shadow.")],
    routes: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many routes (per process).")
    ] = None,
    minutes: Annotated[
        float | None, typer.Option(min=0.0, help="Stop after this many minutes [default 60].")
    ] = None,
) -> None:
    """Label every route's hits under VERSION too (traces: confidence.shadow), bounded."""
    from evaluation.shadow import start_shadow

    store = _store()
    try:
        doc = start_shadow(store, version, routes=routes, minutes=minutes)
    except ContextError as e:
        raise _fail(str(e)) from e
    bounds = [f"until {doc['until']}" if doc["until"] else "",
              f"{doc['max_routes']} routes per process" if doc["max_routes"] else ""]  # fmt: skip
    typer.echo(
        f"SHADOW {doc['version']} ({' or '.join(b for b in bounds if b)}) -> {store.shadow_file}"
    )


@app.command("shadow-stop")
def shadow_stop() -> None:
    """End the shadow run (routes stop recording shadow labels on their next call)."""
    from evaluation.shadow import stop_shadow

    store = _store()
    typer.echo("shadow stopped" if stop_shadow(store) else "no shadow was running")


@app.command("shadow-report")
def shadow_report_cmd(
    version: Annotated[
        str | None, typer.Argument(help="Version [default: every shadowed route].")
    ] = None,
) -> None:
    """Where the shadow's labels differ from those in force, and how CER would move."""
    from context_core.config import get_settings
    from context_core.routing.confidence import ConfidencePolicy
    from evaluation.shadow import shadow_report

    settings = get_settings()
    try:
        rep = shadow_report(
            settings.traces_dir, version=version, accept=ConfidencePolicy.load(settings).accept
        )
    except ContextError as e:
        raise _fail(str(e)) from e
    if rep.n_routes == 0:
        raise _fail(
            f"no route in {settings.traces_dir} ran with "
            f"{version or 'a calibration'} in shadow; start one with `ctx eval thresholds shadow`"
        )
    typer.echo(
        f"shadow {rep.version}: {rep.n_routes} routes, {rep.n_hits} hits, "
        f"{rep.n_changed} ({rep.changed_share:.1%}) labelled differently"
    )
    for t, n in rep.transitions.items():
        typer.echo(f"  {t}: {n}")
    a, b = rep.cer_in_force, rep.cer_shadow
    typer.echo(
        f"CER in force {a.cer:.1%} ({a.n_effective}/{a.n_steps}, loaded {a.n_loaded}) -> "
        f"shadow {b.cer:.1%} ({b.n_effective}/{b.n_steps}, loaded {b.n_loaded}): "
        f"{rep.cer_change * 100:+.1f} pp"
    )
