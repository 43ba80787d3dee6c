"""The L3 benchmark's build cache: built once per set of build parameters, reused by the next
run through its manifest, rebuilt when a parameter changes; a killed build is never reused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import l3_search as bench
from context_core.errors import ConfigError
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.store import SearchQuery, point_id


def _args(cache: Path, **kw: object) -> argparse.Namespace:
    base = dict(
        points=1_500,
        dim=16,
        sections=4,
        seed=3,
        vectors_on_disk=True,
        cache_dir=cache,
        search_threads=None,
        hnsw_m=None,
        ef_construct=None,
    )
    return argparse.Namespace(**{**base, **kw})


def _data(a: argparse.Namespace) -> tuple[np.ndarray, list[dict], list[str]]:
    vecs, payloads = bench._dataset(a.points, a.dim, a.sections, a.seed)
    return vecs, payloads, [point_id(p["source"], p["chunk_index"]) for p in payloads]


def test_built_once_then_reused_then_rebuilt_for_other_parameters(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = _args(cache)
    (cache / "l3-1500-deadbeef.building-x").mkdir(parents=True)  # a killed build's leftovers
    root, manifest = bench._cached_collection(a, *_data(a), rss0=0.0)
    assert manifest["reused"] is False and manifest["points"] == 1_500
    assert root.parent.name.startswith("l3-1500-") and ".building" not in str(root)
    on_disk = json.loads((root.parent / "manifest.json").read_text())
    assert on_disk["params"] == bench._build_params(a) and "reused" not in on_disk

    root2, again = bench._cached_collection(a, *_data(a), rss0=0.0)
    assert (root2, again["reused"], again["built_at"]) == (root, True, manifest["built_at"])
    vecs, _payloads, ids = _data(a)
    with EdgeStore(root2, on_disk=True) as store:  # the reused collection answers correctly
        hit = store.search(vecs[7].tolist(), SearchQuery(bench.COLLECTION, 1, exact=True))
        assert hit[0].id == ids[7]

    b = _args(cache, seed=4)  # another data set: another entry, built afresh
    root3, other = bench._cached_collection(b, *_data(b), rss0=0.0)
    assert other["reused"] is False and root3 != root
    built = sorted(p.name for p in cache.iterdir() if ".building" not in p.name)
    assert len(built) == 2


def test_the_graph_parameters_name_the_build_and_reach_the_engine(tmp_path: Path) -> None:
    """--hnsw-m / --ef-construct: another cache entry, and the shard is created with them."""
    cache = tmp_path / "cache"
    a = _args(cache, points=600)
    root, _ = bench._cached_collection(a, *_data(a), rss0=0.0)
    b = _args(cache, points=600, hnsw_m=16, ef_construct=64)
    root_b, built = bench._cached_collection(b, *_data(b), rss0=0.0)
    assert root_b != root and built["reused"] is False
    assert (built["params"]["hnsw_m"], built["params"]["hnsw_ef_construct"]) == (16, 64)
    config = json.loads((root_b / bench.COLLECTION / "edge_config.json").read_text())
    assert (config["hnsw_config"]["m"], config["hnsw_config"]["ef_construct"]) == (16, 64)
    default = json.loads((root / bench.COLLECTION / "edge_config.json").read_text())
    assert (default["hnsw_config"]["m"], default["hnsw_config"]["ef_construct"]) == (32, 128)


def test_edge_store_refuses_graph_parameters_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="HNSW m must be between 4 and 128"):
        EdgeStore(tmp_path, hnsw_m=2)
    with pytest.raises(ConfigError, match="ef_construct must be between 4 and 4096"):
        EdgeStore(tmp_path, ef_construct=10_000)


def test_timing_always_times_something_after_its_warm_up() -> None:
    """A short run (fewer arguments than the warm-up) warms up on half and times the rest; the
    warm-up arguments are never timed again."""
    seen: list[int] = []
    out = bench._timed(seen.append, list(range(20)))
    assert len(out) == 10 and seen == list(range(20))
    assert len(bench._timed(seen.append, list(range(100)))) == 70


def test_the_sweep_never_searches_a_query_right_after_another_setting_did(
    tmp_path: Path,
) -> None:
    """Back to back, the second search of one query runs on caches the first warmed: each
    setting searches every query once, and consecutive searches are different queries."""
    a = _args(tmp_path / "cache", points=800, hnsw_ef=32, oversampling=None, sweep="16:2,64:3")
    vecs, payloads, ids = _data(a)
    root, _ = bench._cached_collection(a, vecs, payloads, ids, rss0=0.0)
    queries = [(vecs[i].tolist(), payloads[i]["section"]) for i in range(0, 120, 2)]
    seen: list[tuple[int | None, int]] = []

    class Recording(EdgeStore):
        def search(self, vector: Any, query: SearchQuery, sparse: Any = None) -> Any:
            seen.append((self.hnsw_ef, [q for q, _s in queries].index(list(vector))))
            return super().search(vector, query, sparse)

    sections = np.array([p["section"] for p in payloads])
    with Recording(root, on_disk=True) as store:
        truth = bench._exact_top3(queries, vecs, sections, ids)
        rows = bench._sweep(store, a, queries, truth)
    assert [r["hnsw_ef"] for r in rows] == [32, 16, 64]
    assert len(seen) == 3 * len(queries)
    for ef in (32, 16, 64):  # every query once per setting
        assert sorted(j for e, j in seen if e == ef) == list(range(len(queries)))
    assert all(seen[i][1] != seen[i + 1][1] for i in range(len(seen) - 1))
    assert all(float(r["recall@3"]) > 0.5 for r in rows)
