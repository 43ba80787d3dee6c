"""The real 406-file DLX Confluence export, end to end with the offline minilm model.

Slow (thousands of chunks to embed on CPU); skipped where ../shared/data is absent. The exact
counts below were observed on this export with the heading-aware 256-token chunker; a change
to the reader or the chunker that moves them should be a deliberate one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from context_core.config import get_settings
from context_core.ingest.pipeline import run_refresh
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import load_encoder

PAGE_FILES = 405  # *.html files besides index.html
PAGES_WITH_BODY = 371
QUARANTINED = 34  # folder-only pages, whiteboard/database placeholders, empty bodies
CHUNKS = 4627


@pytest.mark.slow
@pytest.mark.realdata
@pytest.mark.timeout(5400)
def test_dlx_export_ingests_and_reruns_as_a_no_op(shared_data: Path, tmp_path: Path) -> None:
    export = shared_data / "confluence" / "DLX-confluence"
    if not export.is_dir():
        pytest.skip(f"{export} is absent")
    settings = get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")
    encoder = load_encoder(settings)
    with EdgeStore(settings.qdrant_dir) as store:
        first = run_refresh(export, settings=settings, store=store, encoder=encoder, progress=False)
        observed = {
            "pages_seen": first.pages_seen,
            "pages_new": first.pages_new,
            "pages_quarantined": first.pages_quarantined,
            "chunks_written": first.chunks_written,
            "points": store.count(settings.collection_main),
        }
        assert observed == {
            "pages_seen": PAGE_FILES,
            "pages_new": PAGES_WITH_BODY,
            "pages_quarantined": QUARANTINED,
            "chunks_written": CHUNKS,
            "points": CHUNKS,
        }
        assert len(list(export.glob("*.html"))) - 1 == PAGE_FILES  # all but index.html

        # Every page with a body yields chunks, with contiguous indexes; none is over the limit.
        by_source: dict[str, list[int]] = {}
        for rec in store.scroll(settings.collection_main):
            by_source.setdefault(rec.payload["source"], []).append(rec.payload["chunk_index"])
            assert rec.payload["n_tokens"] <= settings.chunk_max_tokens
        assert len(by_source) == PAGES_WITH_BODY
        assert all(sorted(ix) == list(range(len(ix))) for ix in by_source.values())

        quarantine = [
            json.loads(line)
            for line in (settings.reports_dir / "quarantine.jsonl").read_text().splitlines()
        ]
        assert len(quarantine) == QUARANTINED
        assert all(
            q["reason"].startswith(("empty body", "unsupported content")) for q in quarantine
        )

        again = run_refresh(export, settings=settings, store=store, encoder=encoder, progress=False)
        assert (again.chunks_written, again.chunks_deleted) == (0, 0)
        assert again.pages_unchanged == PAGES_WITH_BODY
        assert store.count(settings.collection_main) == CHUNKS
