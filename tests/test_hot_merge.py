"""Hot path on real parts: the gateway, the minilm encoder, Qdrant Edge on a temp dir."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from context_core.config import Settings, get_settings
from context_core.gateway.sanitize import Gateway
from context_core.ingest.hot import merge_hot, normalise_terms, on_fallback
from context_core.ingest.pipeline import run_refresh
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder, load_encoder
from context_core.knowledge.memory import KnowledgeMemory
from context_core.knowledge.store import PointRecord, point_id
from context_core.platform import run_hot_merge
from context_core.sample_data import sample_export_path

NOW = 1_780_000_000.0
HOUR = 3600.0


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return load_encoder(get_settings(embed_model="minilm"))


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")


def _km(store: EdgeStore, enc: Encoder, cfg: Settings, at: float) -> KnowledgeMemory:
    return KnowledgeMemory(store, enc, cfg, Gateway.from_settings(cfg), clock=lambda: at)


def test_normalise_terms_folds_fullwidth_and_whitespace() -> None:
    assert (
        normalise_terms("  ＰＵＭＰ－００４２\u3000 bearing\t\ttemp ") == "PUMP-0042 bearing temp"
    )


def test_on_fallback_cleans_normalises_and_expires_in_72h(cfg: Settings, minilm: Encoder) -> None:
    with EdgeStore(cfg.qdrant_dir) as store:
        km = _km(store, minilm, cfg, NOW)
        pid = on_fallback(
            "How do I reset ＰＵＭＰ－００４２?  Call me on 13812345678",
            "Hold RESET for 5 s; mail ops@example.com if it fails.",
            "confirmed",
            knowledge=km,
            section="PUMP",
        )
        assert pid is not None
        (rec,) = store.retrieve(cfg.collection_hot, [pid])
        p = rec.payload
        assert p["text"].startswith("Q: How do I reset PUMP-0042? Call me on 138****5678")
        assert "13812345678" not in str(p) and "ops@example.com" not in str(p)
        assert p["confirmed"] is True and p["section"] == "PUMP"
        assert p["expires_at"] == pytest.approx(NOW + 72 * HOUR)

        # The same question, differently typed, is the same pair key -> one point, refreshed.
        again = on_fallback(
            "how do i reset pump-0042? call me on 13812345678",
            "Hold RESET for 5 s; mail ops@example.com if it fails.",
            None,
            knowledge=km,
            section="PUMP",
        )
        assert store.retrieve(cfg.collection_hot, [again])[0].payload["source"] == p["source"]
        assert store.count(cfg.collection_hot) == 1
        assert store.retrieve(cfg.collection_hot, [again])[0].payload["confirmed"] is False
        rejected = on_fallback(
            "How do I reset PUMP-0042? Call me on 13812345678", "x", "rejected", knowledge=km
        )
        assert rejected is None
        assert store.count(cfg.collection_hot, filter={"source": p["source"]}) == 0
        with pytest.raises(ValueError, match="feedback must be"):
            on_fallback("q", "a", "maybe", knowledge=km)


def test_merge_moves_confirmed_skips_duplicates_drops_expired(
    cfg: Settings, minilm: Encoder
) -> None:
    with EdgeStore(cfg.qdrant_dir) as store:
        km = _km(store, minilm, cfg, NOW)
        km.ensure_collections()
        known = "Q: How do I reset FAN-0007?\nA: Switch off the isolator, wait 30 s, switch on."
        store.upsert(
            cfg.collection_main,
            [
                PointRecord(
                    point_id("fan-sop", 0),
                    minilm.encode([known])[0],
                    {"source": "fan-sop", "chunk_index": 0, "text": known},
                )
            ],
        )
        new = on_fallback(
            "What torque for the PUMP-0042 coupling bolts?",
            "45 Nm, crosswise.",
            "confirmed",
            knowledge=km,
            section="PUMP",
        )
        dup = on_fallback(
            "How do I reset FAN-0007?",
            "Switch off the isolator, wait 30 s, switch on.",
            "confirmed",
            knowledge=km,
            section="FAN",
        )
        pending = on_fallback(
            "Is COMP-0003 oil synthetic?",
            "Yes, ISO VG 68.",
            "unconfirmed",
            knowledge=km,
            section="COMP",
        )
        old = on_fallback(
            "Old answer about FAN-0001 belts?",
            "Replace every 6 months.",
            "confirmed",
            knowledge=_km(store, minilm, cfg, NOW - 80 * HOUR),
        )
        summary = merge_hot(km, now=NOW)
        assert summary.to_dict() == {"merged": 1, "duplicates": 1, "expired": 1, "kept": 1}

        assert [r.id for r in store.scroll(cfg.collection_hot)] == [pending]
        assert store.retrieve(cfg.collection_hot, [new, dup, old]) == []
        main = {r.payload["text"]: r.payload for r in store.scroll(cfg.collection_main)}
        assert len(main) == 2  # the known answer and the merged one, no duplicate
        merged = next(p for t, p in main.items() if "45 Nm" in t)
        assert merged["merged_from"] == cfg.collection_hot
        assert "expires_at" not in merged and "confirmed" not in merged
        # Merged knowledge is searchable in main (the router's filter on section works).
        hit = km.search("coupling bolt torque PUMP-0042", section="PUMP", include_hot=False)[0]
        assert "45 Nm" in hit.payload["text"]

        # A second merge finds nothing new to do.
        assert merge_hot(km, now=NOW).to_dict() == {
            "merged": 0,
            "duplicates": 0,
            "expired": 0,
            "kept": 1,
        }


def test_refresh_keeps_merged_answers_and_run_hot_merge(cfg: Settings, minilm: Encoder) -> None:
    export = sample_export_path()
    if not export.is_dir():
        pytest.skip(f"sample export {export} not shipped yet")
    with EdgeStore(cfg.qdrant_dir) as store:
        run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        km = _km(store, minilm, cfg, time.time())
        on_fallback(
            "Which grease for the PUMP-0042 drive end?",
            "Lithium complex NLGI 2.",
            "confirmed",
            knowledge=km,
            section="PUMP",
        )
        n_main = store.count(cfg.collection_main)
    summary = run_hot_merge(cfg)  # opens its own store, like the DAG task
    assert summary.merged == 1
    with EdgeStore(cfg.qdrant_dir) as store:
        s = run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        assert (s.chunks_written, s.chunks_deleted) == (0, 0)
        assert store.count(cfg.collection_main) == n_main + 1
        assert store.count(cfg.collection_main, filter={"merged_from": cfg.collection_hot}) == 1


def test_cli_hot_merge_on_an_empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from context_app.cli import app

    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    res = CliRunner().invoke(app, ["hot-merge"])
    assert res.exit_code == 0, res.output
    assert "'merged': 0" in res.output and "'expired': 0" in res.output
