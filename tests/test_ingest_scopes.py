"""Knowledge refresh never loses knowledge: scoped deletes and the guards (issue 9).

Real parts: exports written in Confluence's HTML layout, the minilm encoder, Qdrant Edge on a
temp dir, the ``ctx`` CLI. Each test checks what the collection holds afterwards, point by
point, not just that a call returned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from exports import para, write_export
from typer.testing import CliRunner

from context_core.config import Settings, get_settings
from context_core.errors import EmptyExportError, MassDeleteError
from context_core.ingest.pipeline import (
    plan_refresh,
    read_quarantine_history,
    remove_space,
    run_refresh,
    source_scope,
)
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder, load_encoder
from context_core.knowledge.store import PointRecord, point_id


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return load_encoder(get_settings(embed_model="minilm"))


def space_a() -> dict[str, tuple[str, str, str]]:
    return {
        "1001": ("Pump seals", "PUMP", f"<p>{para('seal', 3)}</p>"),
        "1002": ("Pump bearings", "PUMP", f"<p>{para('bearing', 3)}</p>"),
        "1003": ("Fan belts", "FAN", f"<p>{para('belt', 3)}</p>"),
        "1004": ("Fan motors", "FAN", f"<p>{para('motor', 3)}</p>"),
        "1005": ("Valve packing", "VALVE", f"<p>{para('packing', 3)}</p>"),
        "1006": ("Valve actuators", "VALVE", f"<p>{para('actuator', 3)}</p>"),
    }


def space_b() -> dict[str, tuple[str, str, str]]:
    return {
        "2001": ("Onboarding", "HR", f"<p>{para('badge', 2)}</p>"),
        "2002": ("Leave policy", "HR", f"<p>{para('leave form', 2)}</p>"),
        "2003": ("Laptop setup", "IT", f"<p>{para('laptop', 2)}</p>"),
    }


def by_space(store: EdgeStore, collection: str = "knowledge_main") -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in store.scroll(collection):
        out.setdefault(str(r.payload.get("space")), {})[r.id] = r.payload
    return out


def refresh(export: Path, cfg: Settings, store: EdgeStore, enc: Encoder, **kw: Any) -> Any:
    return run_refresh(export, settings=cfg, store=store, encoder=enc, progress=False, **kw)


def test_two_spaces_in_one_collection_survive_each_others_refreshes(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    a = write_export(tmp_path / "A", space_a(), space="ENG", name="Engineering")
    b = write_export(tmp_path / "B", space_b(), space="OPS", name="Office", home="200")
    with EdgeStore(cfg.qdrant_dir) as store:
        first = refresh(a, cfg, store, minilm)
        a_points = by_space(store)["ENG"]
        second = refresh(b, cfg, store, minilm)
        after_b = by_space(store)
        # A changes one page and drops one (1 of 6 = 17 %, under the 20 % guard).
        pages = space_a()
        pages["1001"] = ("Pump seals", "PUMP", f"<p>{para('mechanical seal face', 3)}</p>")
        del pages["1006"]
        write_export(a, pages, space="ENG", name="Engineering")
        third = refresh(a, cfg, store, minilm)
        final = by_space(store)

    assert (first.pages_new, first.pages_deleted) == (6, 0)
    assert first.scopes == {"ENG": source_scope("ENG")} == {"ENG": "confluence-export#ENG"}
    # The second space deleted nothing of the first.
    assert (second.pages_new, second.pages_deleted, second.chunks_deleted) == (3, 0, 0)
    assert second.pages_in_scope == 0
    assert after_b["ENG"] == a_points
    assert {p["source"] for p in after_b["OPS"].values()} == {"2001", "2002", "2003"}
    assert {p["scope"] for p in after_b["OPS"].values()} == {"confluence-export#OPS"}
    # The first space's own refresh changed and deleted only its own pages.
    assert (third.pages_in_scope, third.pages_changed, third.pages_deleted) == (6, 1, 1)
    assert final["OPS"] == after_b["OPS"]
    assert {p["source"] for p in final["ENG"].values()} == {"1001", "1002", "1003", "1004", "1005"}
    assert "mechanical seal face" in final["ENG"][point_id("1001", 0)]["text"]


def test_export_with_no_readable_page_deletes_nothing(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    a = write_export(tmp_path / "A", space_a(), space="ENG")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "index.html").write_text(
        "<html><body><h1>Welcome to our intranet</h1><p>Nothing here.</p></body></html>"
    )
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(a, cfg, store, minilm)
        before = {r.id: r.payload for r in store.scroll("knowledge_main")}
        with pytest.raises(EmptyExportError, match="no readable Confluence page") as exc:
            refresh(wrong, cfg, store, minilm)
        after = {r.id: r.payload for r in store.scroll("knowledge_main")}
    assert after == before and len(before) >= 6
    assert "Nothing was written or deleted" in str(exc.value)


def test_export_whose_pages_are_all_quarantined_deletes_nothing(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    a = write_export(tmp_path / "A", space_a(), space="ENG")
    broken = write_export(
        tmp_path / "broken", {pid: (t, s, "") for pid, (t, s, _) in space_a().items()}, space="ENG"
    )
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(a, cfg, store, minilm)
        before = store.count("knowledge_main")
        with pytest.raises(EmptyExportError, match="all 6 page files were quarantined") as exc:
            refresh(broken, cfg, store, minilm)
        assert store.count("knowledge_main") == before
    assert "empty body" in str(exc.value)  # the reasons are in the message


def test_mass_delete_is_refused_until_allowed(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    a = write_export(tmp_path / "A", space_a(), space="ENG")
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(a, cfg, store, minilm)
        before = {r.id: r.payload for r in store.scroll("knowledge_main")}
        # Half the space is gone from the export, and one remaining page changed.
        pages = {k: v for k, v in space_a().items() if k in ("1001", "1002", "1003")}
        pages["1001"] = ("Pump seals", "PUMP", f"<p>{para('changed text', 2)}</p>")
        write_export(a, pages, space="ENG")
        with pytest.raises(MassDeleteError) as exc:
            refresh(a, cfg, store, minilm)
        # Nothing at all was written: not even the changed page.
        assert {r.id: r.payload for r in store.scroll("knowledge_main")} == before
        assert not (cfg.reports_dir / "ingest_summary.json").read_text().count('"pages_deleted": 3')

        s = refresh(a, cfg, store, minilm, allow_deletes=True)
        final = {r.payload["source"] for r in store.scroll("knowledge_main")}
    err = exc.value
    assert (err.would_delete, err.in_scope) == (3, 6)
    assert "3 of 6 pages (50%)" in str(err) and "--allow-deletes" in str(err)
    assert "1004 (Fan motors)" in str(err)  # names what would go
    assert (s.pages_deleted, s.pages_changed) == (3, 1)
    assert final == {"1001", "1002", "1003"}


def test_delete_share_is_configurable(tmp_path: Path, minilm: Encoder) -> None:
    strict = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "r", ingest_max_delete_share=0.0
    )
    a = write_export(tmp_path / "A", space_a(), space="ENG")
    with EdgeStore(strict.qdrant_dir) as store:
        refresh(a, strict, store, minilm)
        pages = space_a()
        del pages["1006"]
        write_export(a, pages, space="ENG")
        with pytest.raises(MassDeleteError, match="1 of 6 pages"):
            plan_refresh(a, settings=strict, store=store, encoder=minilm)
        loose = get_settings(
            data_dir=tmp_path / "ctx", reports_dir=tmp_path / "r", ingest_max_delete_share=0.5
        )
        plan = plan_refresh(a, settings=loose, store=store, encoder=minilm)
    assert plan.pages_deleted == 1 and plan.delete_ids == [point_id("1006", 0)]


def test_partial_export_never_deletes_pages_it_did_not_read(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    a = write_export(tmp_path / "A", space_a(), space="ENG", name="Engineering")
    # The same space as loose page files, without the space index: not a complete export.
    loose = tmp_path / "loose"
    loose.mkdir()
    for name in ("1001.html", "1002.html"):
        (loose / name).write_bytes((a / name).read_bytes())
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(a, cfg, store, minilm)
        before = store.count("knowledge_main")
        s = refresh(loose, cfg, store, minilm, space="ENG")
        assert store.count("knowledge_main") == before
    assert (s.complete, s.export_kind, s.pages_unchanged, s.pages_deleted) == (
        False,
        "pages",
        2,
        0,
    )


def test_merged_hot_answers_and_legacy_points(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    """Merged hot answers are never touched; points from before scopes count as their space's."""
    a = write_export(tmp_path / "A", space_a(), space="ENG")
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(a, cfg, store, minilm)
        vec = minilm.encode(["torque for the coupling"])[0]
        hot = PointRecord(
            point_id("hot-abc", 0),
            vec,
            {"source": "hot-abc", "text": "45 Nm", "merged_from": "hot_knowledge"},
        )
        # A page written before this change: a space field but no scope.
        legacy = PointRecord(
            point_id("1999", 0),
            vec,
            {"source": "1999", "space": "ENG", "chunk_index": 0, "n_chunks": 1, "title": "Old"},
        )
        store.upsert("knowledge_main", [hot, legacy])
        s = refresh(a, cfg, store, minilm)
        ids = {r.id for r in store.scroll("knowledge_main")}
    assert s.pages_in_scope == 7 and s.pages_deleted == 1  # the legacy page left the export
    assert point_id("hot-abc", 0) in ids and point_id("1999", 0) not in ids


def test_a_page_moved_to_another_space_is_not_deleted_by_the_old_one(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    pages_a = space_a()
    a = write_export(tmp_path / "A", pages_a, space="ENG")
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(a, cfg, store, minilm)
        moved = pages_a.pop("1005")
        b = write_export(tmp_path / "B", {**space_b(), "1005": moved}, space="OPS", home="200")
        refresh(b, cfg, store, minilm)  # 1005 now belongs to OPS
        write_export(a, pages_a, space="ENG")
        s = refresh(a, cfg, store, minilm)
        owner = {r.payload["source"]: r.payload["space"] for r in store.scroll("knowledge_main")}
    assert s.pages_deleted == 0 and s.pages_in_scope == 5
    assert owner["1005"] == "OPS"


def test_remove_space_is_explicit_and_removes_only_that_space(
    tmp_path: Path, cfg: Settings, minilm: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from context_app.cli import app

    a = write_export(tmp_path / "A", space_a(), space="ENG")
    b = write_export(tmp_path / "B", space_b(), space="OPS", home="200")
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(a, cfg, store, minilm)
        refresh(b, cfg, store, minilm)
        ops_before = by_space(store)["OPS"]
        dry = remove_space("ENG", settings=cfg, store=store, dry_run=True)
        assert store.count("knowledge_main") == len(ops_before) + dry.chunks
    assert (dry.pages, dry.dry_run) == (6, True)

    monkeypatch.setenv("CTX_DATA_DIR", str(cfg.data_dir))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(cfg.reports_dir))
    runner = CliRunner()
    refused = runner.invoke(app, ["remove-space", "ENG"], input="n\n")
    assert refused.exit_code == 1 and "nothing deleted" in refused.output
    res = runner.invoke(app, ["remove-space", "ENG", "--yes"])
    assert res.exit_code == 0, res.output
    assert "deleted 6 pages" in res.output
    with EdgeStore(cfg.qdrant_dir) as store:
        assert by_space(store) == {"OPS": ops_before}


def test_quarantine_history_is_kept_across_runs(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    pages = space_a()
    pages["1007"] = ("Empty", "PUMP", "")
    a = write_export(tmp_path / "A", pages, space="ENG")
    with EdgeStore(cfg.qdrant_dir) as store:
        s1 = refresh(a, cfg, store, minilm)
        s2 = refresh(a, cfg, store, minilm)
    assert s1.run_id != s2.run_id and s1.quarantine_file == s2.quarantine_file
    lines = read_quarantine_history(cfg.reports_dir)
    assert [(q["run_id"], q["kind"]) for q in lines] == [
        (s1.run_id, "quarantined"),
        (s2.run_id, "quarantined"),
    ]
    assert all(q["source_path"].endswith("1007.html") and q["at"] for q in lines)
    summary = json.loads((cfg.reports_dir / "ingest_summary.json").read_text())
    assert summary["run_id"] == s2.run_id and summary["quarantine_file"].endswith(
        "quarantine.jsonl"
    )


def test_cli_guards_exit_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minilm: Encoder
) -> None:
    from context_app.cli import app

    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(tmp_path / "reports"))
    a = write_export(tmp_path / "A", space_a(), space="ENG")
    runner = CliRunner()
    assert runner.invoke(app, ["ingest", str(a), "--no-progress"]).exit_code == 0
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "index.html").write_text("<html><body><p>a landing page</p></body></html>")
    empty = runner.invoke(app, ["ingest", str(wrong), "--no-progress"])
    assert empty.exit_code == 1 and "no readable Confluence page" in empty.output

    write_export(a, {k: v for k, v in space_a().items() if k in ("1001", "1002")}, space="ENG")
    guarded = runner.invoke(app, ["ingest", str(a), "--no-progress"])
    assert guarded.exit_code == 1 and "refusing to delete 4 of 6 pages" in guarded.output
    allowed = runner.invoke(app, ["ingest", str(a), "--no-progress", "--allow-deletes"])
    assert allowed.exit_code == 0, allowed.output
    with EdgeStore(tmp_path / "ctx" / "qdrant") as store:
        assert {r.payload["source"] for r in store.scroll("knowledge_main")} == {"1001", "1002"}


FIXTURES = Path(__file__).parent / "fixtures" / "confluence"


@pytest.mark.parametrize("as_zip", [False, True], ids=["folder", "zip"])
def test_single_page_export_ingests_and_deletes_nothing_else(
    tmp_path: Path, cfg: Settings, minilm: Encoder, as_zip: bool
) -> None:
    """A page export's index.html is the page (Chinese locale); it never prunes its space."""
    import shutil

    export: Path = FIXTURES / "page-export-zh"
    if as_zip:
        export = Path(shutil.make_archive(str(tmp_path / "page-export"), "zip", export))
    other = write_export(tmp_path / "A", space_a(), space="ENG")
    with EdgeStore(cfg.qdrant_dir) as store:
        refresh(other, cfg, store, minilm)
        eng = by_space(store)["ENG"]
        s = refresh(export, cfg, store, minilm)
        again = refresh(export, cfg, store, minilm)
        spaces = by_space(store)
    assert (s.pages_seen, s.pages_new, s.pages_quarantined) == (1, 1, 0)
    assert (s.export_kind, s.complete, s.pages_deleted) == ("page", False, 0)
    assert (again.pages_unchanged, again.chunks_written, again.chunks_deleted) == (1, 0, 0)
    assert spaces["ENG"] == eng
    (page_points,) = [v for k, v in spaces.items() if k != "ENG"]
    payload = next(iter(page_points.values()))
    assert payload["source"] == "123456" and payload["title"] == "页面"
    assert payload["updated_at"].startswith("2018-01-11")


def test_zip_export_with_an_oversized_member_ingests_the_rest(
    tmp_path: Path, minilm: Encoder
) -> None:
    import zipfile

    cfg = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", max_page_bytes=200_000
    )
    folder = write_export(tmp_path / "A", space_a(), space="ENG")
    archive = tmp_path / "ENG.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"ENG/{f.name}")
        with zf.open("ENG/7777.html", "w") as big:  # 5 MB of markup from a few KB
            for _ in range(5):
                big.write(b"<p>" + b"x" * (1024 * 1024) + b"</p>")
    with EdgeStore(cfg.qdrant_dir) as store:
        s = refresh(archive, cfg, store, minilm)
        sources = {r.payload["source"] for r in store.scroll("knowledge_main")}
    assert (s.pages_new, s.pages_quarantined, s.export_kind) == (6, 1, "space")
    assert sources == set(space_a())
    (q,) = read_quarantine_history(cfg.reports_dir)
    assert q["source_path"].endswith("ENG.zip!/ENG/7777.html")
    assert "max_page_bytes=200000" in q["reason"] and "CTX_MAX_PAGE_BYTES" in q["reason"]


def test_a_date_that_falls_back_is_recorded_with_its_reason(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    a = write_export(tmp_path / "A", space_a(), space="ENG")
    page = a / "1001.html"
    page.write_text(page.read_text().replace("last modified on Jun 29, 2019", "edited lately"))
    with EdgeStore(cfg.qdrant_dir) as store:
        s = refresh(a, cfg, store, minilm)
    assert s.warnings == 1 and s.pages_quarantined == 0
    (w,) = read_quarantine_history(cfg.reports_dir)
    assert w["kind"] == "warning" and w["source_path"].endswith("1001.html")
    assert "no date in metadata" in w["reason"] and "modification time" in w["reason"]
