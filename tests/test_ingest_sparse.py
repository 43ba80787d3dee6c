"""Ingestion writes sparse vectors; an old dense-only collection gains them on the next
refresh or with `ctx add-sparse`, its dense vectors untouched. Real export files, the minilm
encoder, Qdrant Edge."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from exports import base_pages, write_export
from typer.testing import CliRunner

from context_core.config import Settings, get_settings
from context_core.ingest.pipeline import run_refresh
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import Encoder, load_encoder
from context_core.knowledge.sparse import SPARSE_ENCODER
from context_core.knowledge.store import PointRecord, point_id

OLD = [
    "Old manual: the pump seal is replaced every 8000 running hours.",
    "Old manual: fan bearings are greased quarterly with lithium grease.",
]


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", embed_batch_size=4
    )


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return load_encoder(get_settings(embed_model="minilm"))


def _old_collection(store: EdgeStore, name: str, enc: Encoder) -> dict[str, np.ndarray]:
    """A collection as built before sparse vectors: dense only, no sparse record."""
    store.create_collection(name, dim=enc.dim, model=enc.name)
    vecs = enc.encode(OLD)
    store.upsert(
        name,
        [
            PointRecord(point_id("old", i), vecs[i], {"source": "old", "text": t})
            for i, t in enumerate(OLD)
        ],
    )
    return {point_id("old", i): vecs[i] for i in range(len(OLD))}


def test_refresh_writes_sparse_vectors(tmp_path: Path, cfg: Settings, minilm: Encoder) -> None:
    export = write_export(tmp_path / "export", base_pages())
    with EdgeStore(cfg.qdrant_dir) as store:
        s = run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        info = store.info(cfg.collection_main)
        recs = list(store.scroll(cfg.collection_main, with_vectors=True))
    assert info is not None and info.sparse == SPARSE_ENCODER
    assert len(recs) == s.chunks_written > 0
    assert all(r.sparse is not None and len(r.sparse) > 0 for r in recs)


def test_refresh_migrates_a_dense_only_collection(
    tmp_path: Path, cfg: Settings, minilm: Encoder
) -> None:
    export = write_export(tmp_path / "export", base_pages())
    with EdgeStore(cfg.qdrant_dir) as store:
        old = _old_collection(store, cfg.collection_main, minilm)
        run_refresh(export, settings=cfg, store=store, encoder=minilm, progress=False)
        info = store.info(cfg.collection_main)
        recs = {r.id: r for r in store.scroll(cfg.collection_main, with_vectors=True)}
    assert info is not None and info.sparse == SPARSE_ENCODER
    assert all(r.sparse is not None for r in recs.values())
    for pid, vec in old.items():  # the old points kept their dense vectors, bit for bit
        assert np.array_equal(np.asarray(recs[pid].vector, dtype=np.float32), vec)


def test_cli_add_sparse(tmp_path: Path, minilm: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    from context_app.cli import app

    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    with EdgeStore(tmp_path / "ctx" / "qdrant") as store:
        old = _old_collection(store, "old_main", minilm)
    res = CliRunner().invoke(app, ["add-sparse", "--collection", "old_main"])
    assert res.exit_code == 0, res.output
    assert "'written': 2" in res.output
    with EdgeStore(tmp_path / "ctx" / "qdrant") as store:
        info = store.info("old_main")
        recs = {r.id: r for r in store.scroll("old_main", with_vectors=True)}
    assert info is not None and info.sparse == SPARSE_ENCODER
    for pid, vec in old.items():
        assert recs[pid].sparse is not None
        assert np.array_equal(np.asarray(recs[pid].vector, dtype=np.float32), vec)
    res = CliRunner().invoke(app, ["add-sparse", "--collection", "old_main"])
    assert res.exit_code == 0 and "'already': 2" in res.output
