"""The knowledge refresh on real parts: HTML export files, the minilm encoder, Qdrant Edge, GX.

Exports are written per test in Confluence's "Export space -> HTML" layout, so each test can
edit, shrink or delete pages between runs and check what the next run does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from exports import base_pages, para, write_export
from typer.testing import CliRunner

from context_core.config import Settings, get_settings
from context_core.errors import DataValidationError, IngestError
from context_core.ingest.model import Chunk, Page
from context_core.ingest.pipeline import plan_refresh, run_refresh
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder, load_encoder
from context_core.knowledge.store import point_id


class CountingEncoder(Encoder):
    """The real minilm encoder, counting encode calls; optionally failing after N calls."""

    def __init__(self, base: Encoder, *, fail_after: int | None = None) -> None:
        self.__dict__.update(base.__dict__)
        self.calls = 0
        self.fail_after = fail_after

    def encode(self, texts: Sequence[str], **kw: Any) -> np.ndarray:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("worker killed in the embed step")
        self.calls += 1
        return super().encode(texts, **kw)


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", embed_batch_size=4
    )


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return load_encoder(get_settings(embed_model="minilm"))


def _points(store: EdgeStore, collection: str = "knowledge_main") -> dict[str, dict[str, Any]]:
    return {r.id: r.payload for r in store.scroll(collection)}


def test_first_run_writes_every_chunk_with_full_payload(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    export = write_export(tmp_path / "export", base_pages())
    with EdgeStore(cfg.qdrant_dir) as store:
        s = run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        points = _points(store)
    assert (s.pages_seen, s.pages_new, s.pages_quarantined) == (5, 4, 1)
    assert (s.pages_changed, s.pages_unchanged, s.pages_deleted, s.chunks_deleted) == (0,) * 4
    assert s.chunks_written == len(points) > 4  # the long pages need several chunks
    assert set(s.seconds) == {"parse", "chunk", "validate", "embed", "upsert"}  # model given

    by_source: dict[str, list[dict[str, Any]]] = {}
    for pid, p in points.items():
        assert pid == point_id(p["source"], p["chunk_index"])
        by_source.setdefault(p["source"], []).append(p)
    assert set(by_source) == {"201", "202", "301", "302"}
    for chunks in by_source.values():
        assert sorted(c["chunk_index"] for c in chunks) == list(range(len(chunks)))
        assert {c["n_chunks"] for c in chunks} == {len(chunks)}
    seal = min(by_source["201"], key=lambda c: c["chunk_index"])
    assert seal["title"] == "Seal replacement"
    assert seal["section"] == "PUMP"
    assert seal["heading_path"] == ["Tools"]
    assert seal["updated_at"] == "2019-06-29T00:00:00+00:00"
    assert seal["updated_at_ts"] == pytest.approx(1561766400.0)
    assert seal["model"] == "minilm" and len(seal["content_hash"]) == 64
    assert "inspect the seal" in seal["text"]
    assert all(minilm.count_tokens(p["text"]) <= 256 for p in points.values())

    # Everything written passed the gateway: the phone number is masked, the e-mail gone.
    contact = by_source["302"][0]["text"]
    assert "13812345678" not in contact and "138****5678" in contact
    assert "ops@example.com" not in contact

    report = json.loads((cfg.reports_dir / "ingest_summary.json").read_text())
    assert report["chunks_written"] == s.chunks_written and report["pages_quarantined"] == 1
    (q,) = [json.loads(x) for x in (cfg.reports_dir / "quarantine.jsonl").read_text().splitlines()]
    assert q["source_path"].endswith("401.html") and "empty body" in q["reason"]


def test_unchanged_rerun_embeds_nothing(tmp_path: Path, cfg: Settings, minilm: Encoder) -> None:
    export = write_export(tmp_path / "export", base_pages())
    with EdgeStore(cfg.qdrant_dir) as store:
        first = run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        before = _points(store)
        enc = CountingEncoder(minilm)
        again = run_refresh(export, settings=cfg, store=store, encoder=enc, progress=False)
        after = _points(store)
    assert enc.calls == 0
    assert (again.chunks_written, again.chunks_deleted) == (0, 0)
    assert again.pages_unchanged == first.pages_new == 4
    assert after == before


def test_changed_shrunk_and_deleted_pages(tmp_path: Path, cfg: Settings, minilm: Encoder) -> None:
    pages = base_pages()
    export = write_export(tmp_path / "export", pages)
    with EdgeStore(cfg.qdrant_dir) as store:
        run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        before = _points(store)
        n_fan_before = sum(1 for p in before.values() if p["source"] == "301")
        assert n_fan_before >= 2

        pages["202"] = ("Bearing noise", "PUMP", f"<p>{para('grease nipple', 3)}</p>")
        pages["301"] = ("Fan belt", "FAN", "<h3>Tension</h3><p>Replace the belt yearly.</p>")
        del pages["302"]
        write_export(export, pages)
        s = run_refresh(
            export, settings=cfg, store=store, encoder=minilm, progress=False, allow_deletes=True
        )
        after = _points(store)

    assert (s.pages_changed, s.pages_deleted, s.pages_unchanged, s.pages_new) == (2, 1, 1, 0)
    assert s.chunks_written == 2  # one chunk each for the edited pages
    assert s.chunks_deleted == (n_fan_before - 1) + 1  # fan surplus + the deleted page
    assert not any(p["source"] == "302" for p in after.values())
    assert [p["chunk_index"] for p in after.values() if p["source"] == "301"] == [0]
    assert "grease nipple" in after[point_id("202", 0)]["text"]
    # The untouched page keeps exactly its points.
    assert {k: v for k, v in after.items() if v["source"] == "201"} == {
        k: v for k, v in before.items() if v["source"] == "201"
    }


def test_killed_run_then_rerun_matches_a_clean_run(
    tmp_path: Path, cfg: Settings, minilm: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one batch per encoder call, so the kill lands after exactly one batch was written
    monkeypatch.setattr("context_core.ingest.pipeline.EMBED_WINDOW_BATCHES", 1)
    export = write_export(tmp_path / "export", base_pages())
    crashing = CountingEncoder(minilm, fail_after=1)
    with EdgeStore(cfg.qdrant_dir) as store:
        with pytest.raises(RuntimeError, match="killed"):
            run_refresh(export, settings=cfg, store=store, encoder=crashing, progress=False)
        assert store.count("knowledge_main") == cfg.embed_batch_size  # one batch landed
        partial = [p["source"] for p in _points(store).values()]
        s = run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        resumed = {r.id: r for r in store.scroll("knowledge_main", with_vectors=True)}
    clean_cfg = get_settings(
        data_dir=tmp_path / "clean", reports_dir=tmp_path / "r2", embed_batch_size=4
    )
    with EdgeStore(clean_cfg.qdrant_dir) as store:
        run_refresh(export, settings=clean_cfg, store=store, encoder=minilm, progress=False)
        clean = {r.id: r for r in store.scroll("knowledge_main", with_vectors=True)}
    # Pages the first batch completed are skipped; half-written ones are redone in full.
    assert len(clean) - cfg.embed_batch_size <= s.chunks_written <= len(clean)
    assert set(resumed) == set(clean)
    final = [r.payload["source"] for r in clean.values()]
    # The crash really left a page half-written (so the re-run had to repair it).
    assert any(0 < partial.count(src) < final.count(src) for src in set(partial))
    for pid, rec in clean.items():
        assert resumed[pid].payload == rec.payload
        assert np.allclose(resumed[pid].vector, rec.vector, atol=1e-2)


def _sloppy_chunker(page: Page) -> list[Chunk]:
    """A chunker with a bug: one chunk per section, however long."""
    return [
        Chunk(page.page_id, i, s.heading_path, page.section, s.text, 999)
        for i, s in enumerate(page.sections)
    ]


def test_failed_suite_stops_before_any_write(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    export = write_export(tmp_path / "export", base_pages())
    with EdgeStore(cfg.qdrant_dir) as store:
        with pytest.raises(DataValidationError) as exc:
            plan_refresh(export, settings=cfg, store=store, encoder=minilm, chunker=_sloppy_chunker)
        assert store.info("knowledge_main") is None
    text = str(exc.value)
    assert "n_tokens" in text and "ExpectColumnValuesToBeBetween" in text
    assert f"{export / '201.html'}#0" in text


def test_missing_export_is_a_clear_error(cfg: Settings, minilm: Encoder) -> None:
    with EdgeStore(cfg.qdrant_dir) as store, pytest.raises(IngestError, match="does not exist"):
        run_refresh("/nonexistent/export", settings=cfg, store=store, encoder=minilm)


def test_cli_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from context_app.cli import app

    export = write_export(tmp_path / "export", base_pages())
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(tmp_path / "reports"))
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", str(export), "--collection", "cli_test"])
    assert res.exit_code == 0, res.output
    assert "chunks written" in res.output and "quarantined" in res.output
    with EdgeStore(tmp_path / "ctx" / "qdrant") as store:
        assert (
            store.count("cli_test")
            == json.loads((tmp_path / "reports" / "ingest_summary.json").read_text())[
                "chunks_written"
            ]
        )
    bad = runner.invoke(app, ["ingest", str(tmp_path / "nope")])
    assert bad.exit_code != 0
    assert "does not exist" in bad.output


def test_page_quarantined_later_keeps_its_last_good_chunks(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    pages = base_pages()
    export = write_export(tmp_path / "export", pages)
    with EdgeStore(cfg.qdrant_dir) as store:
        run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        before = _points(store)
        pages["202"] = ("Bearing noise", "PUMP", "")  # the page broke in the new export
        write_export(export, pages)
        s = run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        after = _points(store)
    assert (s.pages_quarantined, s.pages_deleted, s.chunks_deleted) == (2, 0, 0)
    assert after == before


def test_windowed_embedding_stores_each_text_with_its_own_vector(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    """Several batches per encoder call (sorted by length inside the encoder), BM25 on a
    helper thread: every stored point still carries the vector of its own text."""
    export = write_export(tmp_path / "export", base_pages())
    with EdgeStore(cfg.qdrant_dir) as store:
        run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        stored = list(store.scroll("knowledge_main", with_vectors=True))
    assert len(stored) > cfg.embed_batch_size  # more than one batch in the window
    texts = [r.payload["text"] for r in stored]
    alone = minilm.encode(texts, batch_size=1)
    for rec, vec in zip(stored, alone, strict=True):
        assert float(np.dot(np.asarray(rec.vector), vec)) > 0.99


def test_auto_refreshes_a_torch_built_collection_with_torch(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    """CTX_EMBED_BACKEND=auto (the default) on a collection built with torch: unchanged pages
    stay unchanged (the plan is made for the collection's encoder, not int8's), and an edited
    page is embedded by the encoder the refresh loads itself, torch, which the collection
    accepts. No ONNX export is needed for it."""
    pages = base_pages()
    export = write_export(tmp_path / "export", pages)
    auto = cfg.model_copy(update={"embed_backend": "auto"})
    with EdgeStore(cfg.qdrant_dir) as store:
        run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        pages["202"] = ("Bearing noise", "PUMP", f"<p>{para('grease nipple', 3)}</p>")
        write_export(export, pages)
        s = run_refresh(export, settings=auto, store=store, progress=False)
        info = store.info("knowledge_main")
        after = _points(store)
    assert (s.pages_changed, s.pages_unchanged) == (1, 3)
    assert info is not None and info.model == "minilm"
    assert "grease nipple" in after[point_id("202", 0)]["text"]
