"""The int8 ONNX encoder: exported from the packaged MiniLM (no download), cached, selected by
CTX_EMBED_BACKEND, recorded by collections, refused when it differs from the collection's."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from context_core.config import Settings, get_settings
from context_core.errors import ModelLoadError, ModelMismatchError
from context_core.gateway.sanitize import Gateway
from context_core.knowledge import onnx_encoder
from context_core.knowledge.edge import EdgeStore
from context_core.knowledge.embedding import MODEL_REGISTRY, Encoder, load_encoder
from context_core.knowledge.memory import KnowledgeMemory
from context_core.knowledge.onnx_encoder import (
    FP32_FFN_OUTPUT_LAYERS,
    encoder_name,
    ensure_int8_export,
    export_path,
    ffn_output_linears,
    length_buckets,
    split_encoder_name,
)
from context_core.knowledge.store import PointRecord, check_model, point_id
from context_core.platform import build_platform

SENTENCES = [
    "How do I replace the seal on a centrifugal pump?",
    "Steps to change a centrifugal pump's mechanical seal",
    "The quarterly sales report is due on Friday.",
    "泵的振动 温度 123.45 ok",
]


@dataclass
class FirstUse:
    cache: Path
    encoders: list[Encoder]
    errors: list[BaseException]


@pytest.fixture(scope="module")
def first_use(tmp_path_factory: pytest.TempPathFactory) -> FirstUse:
    """Two threads load the int8 encoder at once from an empty cache dir (one export per test
    run, shared by this module), where a killed process left a half-written export behind."""
    cache = tmp_path_factory.mktemp("encoders")
    (cache / ".export-killed").mkdir()
    (cache / ".export-killed" / "model.int8.onnx").write_bytes(b"half a model")
    settings = get_settings(embed_backend="onnx-int8", encoder_cache_dir=cache)
    out = FirstUse(cache, [], [])

    def load() -> None:
        try:
            out.encoders.append(load_encoder(settings))
        except BaseException as e:  # pragma: no cover - asserted empty below
            out.errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.fixture(scope="module")
def int8(first_use: FirstUse) -> Encoder:
    assert not first_use.errors, first_use.errors
    return first_use.encoders[0]


def test_backend_selected_by_setting_and_recorded_in_the_name(
    int8: Encoder, encoder: Encoder
) -> None:
    assert (encoder.backend, encoder.name) == ("torch", "minilm")
    assert (int8.backend, int8.name, int8.dim) == ("onnx-int8", "minilm+onnx-int8", 384)
    assert split_encoder_name(int8.name) == ("minilm", "onnx-int8")
    assert split_encoder_name("/models/a+b") == ("/models/a+b", "torch")  # not a backend
    assert encoder_name("minilm", "torch") == "minilm"
    # the Redis query cache keeps the two backends' vectors apart
    assert int8.cache_key("q") != encoder.cache_key("q")


def test_int8_vectors_agree_with_fp32(int8: Encoder, encoder: Encoder) -> None:
    a, b = int8.encode(SENTENCES), encoder.encode(SENTENCES)
    assert a.shape == (4, 384) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cos = np.sum(a * b, axis=1)
    assert cos.min() > 0.97, cos
    # and it still ranks: the paraphrase is closer than the unrelated sentence
    assert float(a[0] @ a[1]) > float(a[0] @ a[2]) + 0.4


def test_bucketed_batches_keep_the_input_order(int8: Encoder) -> None:
    """Texts of very different lengths over several windows: each output row is the vector of
    the text at that position (closest to that text embedded alone, among all texts)."""
    topics = ["pump seal", "fan vibration", "invoice due", "rotor torque", "coolant leak"]
    texts = [
        f"{topics[i % 5]} {i} " + "details of the procedure " * ((7 * i) % 23) for i in range(45)
    ]
    batched = int8.encode(texts, batch_size=4)  # 45 texts: windows of 32, batches of 4
    alone = np.stack([int8.encode([t])[0] for t in texts])
    sims = batched @ alone.T
    assert list(np.argmax(sims, axis=1)) == list(range(len(texts)))
    assert float(np.min(np.diag(sims))) > 0.98


def test_a_single_text_runs_on_the_one_thread_session_with_the_same_numbers(
    first_use: FirstUse, int8: Encoder
) -> None:
    """A query goes to a one-thread session of the same file: same vector as the text
    embedded inside a batch of one (the batch session), to float precision."""
    from context_core.knowledge import embedding

    (path,) = first_use.cache.glob("*.int8.onnx")
    runner = embedding._RUNNERS[str(path)]
    ids = runner.tokenize([SENTENCES[0]])
    single = runner._single_session()
    assert single is not runner._session
    assert single.get_session_options().intra_op_num_threads == 1
    alone = runner.encode([SENTENCES[0]])
    feeds = {k: v for k, v in _feeds(ids).items() if k in runner._inputs}
    batch = runner._session.run(None, feeds)  # the batch session, threads as configured
    pooled = batch[0].mean(axis=1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    assert np.allclose(alone, pooled, atol=1e-5)


def _feeds(ids: list[list[int]]) -> dict[str, np.ndarray]:
    x = np.array(ids, dtype=np.int64)
    return {"input_ids": x, "attention_mask": np.ones_like(x), "token_type_ids": np.zeros_like(x)}


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_length_buckets_cover_each_index_once_shortest_first(batch: int) -> None:
    lengths = [5, 1, 9, 1, 7, 3, 3, 12, 2, 8]
    buckets = length_buckets(lengths, batch)
    flat = [int(i) for b in buckets for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(len(b) <= batch for b in buckets)
    assert [lengths[i] for i in flat] == sorted(lengths)
    with pytest.raises(ValueError, match="batch_size"):
        length_buckets(lengths, 0)


def test_a_collection_refuses_the_other_backend(
    tmp_path: Path, int8: Encoder, encoder: Encoder
) -> None:
    with EdgeStore(tmp_path / "qdrant") as store:
        store.create_collection("kb", dim=int8.dim, model=int8.name)
        info = store.info("kb")
        assert info is not None and info.model == "minilm+onnx-int8"
        with pytest.raises(ModelMismatchError, match="CTX_EMBED_BACKEND=onnx-int8") as e:
            store.create_collection("kb", dim=encoder.dim, model=encoder.name)
        assert "'torch'" in str(e.value)
    with pytest.raises(ModelMismatchError, match="CTX_EMBED_BACKEND=torch to query it"):
        check_model("kb", recorded_model="minilm", recorded_dim=384, model=int8.name, dim=384)
    with pytest.raises(ModelMismatchError, match="CTX_EMBED_MODEL=bge-m3"):
        check_model("kb", recorded_model="bge-m3", recorded_dim=1024, model=int8.name, dim=384)


def test_concurrent_first_use_exports_one_whole_file(first_use: FirstUse) -> None:
    """Both threads got the same, whole, loadable file; the leftover temp dir of a killed
    export was neither used nor in the way, and no temp dir of this export is left."""
    assert not first_use.errors and len(first_use.encoders) == 2
    runners = [e._runner for e in first_use.encoders]
    assert runners[0] is not None and runners[0] is runners[1]  # one session per file
    path = runners[0].path
    assert path.parent == first_use.cache and path.name.startswith("minilm-")
    assert path.name.endswith(".int8.onnx")
    assert sorted(p.name for p in first_use.cache.iterdir()) == [".export-killed", path.name]

    import onnx

    onnx.checker.check_model(str(path))  # a whole model, not a partial write
    assert path.stat().st_size > 10_000_000


def test_a_cached_export_loads_without_torch(first_use: FirstUse, int8: Encoder) -> None:
    """A worker whose int8 export is already cached never imports torch or
    sentence-transformers (tokenizer and pooling facts come from the packaged files), and
    embeds and tokenises exactly as the encoder loaded through torch does."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from context_core.config import get_settings\n"
        "from context_core.knowledge.embedding import load_encoder\n"
        "enc = load_encoder(get_settings(embed_backend='onnx-int8', "
        f"encoder_cache_dir={str(first_use.cache)!r}))\n"
        f"texts = {SENTENCES!r}\n"
        "vecs = enc.encode(texts).tolist()\n"
        "ids = [enc.tokenize(t) for t in texts]\n"
        "offs = [enc.token_offsets(t) for t in texts]\n"
        "heavy = ('torch', 'sentence_transformers', 'transformers')\n"
        "mods = [m for m in heavy if m in sys.modules]\n"
        "print(json.dumps([enc.name, enc.dim, enc.max_tokens, mods, vecs, ids, offs]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    name, dim, max_tokens, mods, vecs, ids, offs = json.loads(out.stdout.strip().splitlines()[-1])
    assert mods == []
    assert (name, dim, max_tokens) == (int8.name, int8.dim, int8.max_tokens)
    assert np.allclose(np.asarray(vecs, dtype=np.float32), int8.encode(SENTENCES), atol=1e-6)
    assert ids == [int8.tokenize(t) for t in SENTENCES]
    assert [[tuple(p) for p in o] for o in offs] == [int8.token_offsets(t) for t in SENTENCES]


def test_the_export_is_reused_not_redone(first_use: FirstUse, encoder: Encoder) -> None:
    runner = first_use.encoders[0]._runner
    assert runner is not None
    before = runner.path.stat().st_mtime_ns
    source = MODEL_REGISTRY["minilm"].resolve()
    again = ensure_int8_export(encoder.model, "minilm", source, first_use.cache)
    assert again == runner.path and again.stat().st_mtime_ns == before  # found, not redone


def test_recipe_keeps_the_first_layers_ffn_outputs_fp32_and_the_rest_int8(
    first_use: FirstUse, encoder: Encoder
) -> None:
    """Recipes 2-3 in the quantised graph itself: the MatMuls still holding an fp32 weight are
    exactly the FFN outputs of layers 0-2 (their weights are the torch ones, unchanged); every
    other weight MatMul of the six layers runs on int8 weights."""
    import onnx
    from onnx import TensorProto, numpy_helper

    runner = first_use.encoders[0]._runner
    assert runner is not None
    graph = onnx.load(str(runner.path)).graph
    weights = {t.name: t for t in graph.initializer}
    fp32_weight = [
        numpy_helper.to_array(weights[i])
        for n in graph.node
        if n.op_type == "MatMul"
        for i in n.input
        if i in weights
    ]
    bert = encoder.model[0].auto_model
    expected = [
        bert.encoder.layer[i].output.dense.weight.detach().numpy().T
        for i in range(FP32_FFN_OUTPUT_LAYERS)
    ]
    assert FP32_FFN_OUTPUT_LAYERS == 3 and len(fp32_weight) == 3
    for got, want in zip(fp32_weight, expected, strict=True):
        assert got.dtype == np.float32 and np.array_equal(got, want)
    int8_matmuls = [n for n in graph.node if n.op_type == "MatMulInteger"]
    # recipe 3 (fused graph): attention output, FFN in, FFN out per layer, minus the three
    # kept fp32; q, k and v are one packed int8 weight per layer's QAttention
    assert len(int8_matmuls) == 3 * 6 - 3
    for n in int8_matmuls:
        assert weights[n.input[1]].data_type == TensorProto.INT8, n.name
    attention = [n for n in graph.node if n.op_type == "QAttention"]
    assert len(attention) == 6 and not [n for n in graph.node if n.op_type == "Attention"]
    for n in attention:
        assert weights[n.input[1]].data_type == TensorProto.INT8, n.name


def test_the_cache_name_changes_with_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = MODEL_REGISTRY["minilm"].resolve()
    now = export_path("minilm", source, tmp_path)
    assert now.name.startswith(f"minilm-r{onnx_encoder.EXPORT_RECIPE}-")
    monkeypatch.setattr(onnx_encoder, "EXPORT_RECIPE", onnx_encoder.EXPORT_RECIPE - 1)
    before = export_path("minilm", source, tmp_path)
    assert before != now and before.name.split("-")[-1] != now.name.split("-")[-1]


def test_a_model_without_the_layers_of_the_recipe_is_refused(encoder: Encoder) -> None:
    bert = encoder.model[0].auto_model
    assert [
        round(ln.in_features / ln.out_features) for ln in ffn_output_linears(bert, [0, 5]).values()
    ] == [4, 4]
    with pytest.raises(ModelLoadError, match="has 6 layers; set CTX_EMBED_BACKEND=torch"):
        ffn_output_linears(bert, range(7))


# --- CTX_EMBED_BACKEND=auto (the default) ---------------------------------------------------


def _auto_settings(tmp_path: Path, cache: Path, backend: str = "auto") -> Settings:
    return get_settings(
        data_dir=tmp_path / "ctx",
        reports_dir=tmp_path / "reports",
        redis_url=None,
        embed_backend=backend,
        encoder_cache_dir=cache,
    )


def _build_collection(settings: Settings, enc: Encoder, tmp_path: Path) -> None:
    """The main collection of ``settings``' data dir, built (created and filled) by ``enc``."""
    with EdgeStore(settings.qdrant_dir) as store:
        km = KnowledgeMemory(store, enc, settings, Gateway(audit_path=tmp_path / "audit.jsonl"))
        km.ensure_collections()
        records = [
            PointRecord(point_id("sop", i), vec, {"source": "sop", "text": text, "chunk_index": i})
            for i, (text, vec) in enumerate(zip(SENTENCES, enc.encode(SENTENCES), strict=True))
        ]
        km.upsert_chunks(km.main, records)


def test_the_default_backend_is_auto() -> None:
    assert Settings.model_fields["embed_backend"].default == "auto"


@pytest.mark.parametrize("builder", ["torch", "onnx-int8"])
def test_auto_queries_a_collection_with_the_backend_that_built_it(
    builder: str, tmp_path: Path, first_use: FirstUse, int8: Encoder, encoder: Encoder
) -> None:
    """A collection built before int8 was the default (torch) keeps answering under auto,
    with torch; one built with int8 is queried with int8. Each finds its own text first, at
    ~1.0 (int8 a little less: dynamic quantisation scales activations per batch, so a text
    embedded alone is not bit-equal to the same text embedded among the others)."""
    settings = _auto_settings(tmp_path, first_use.cache)
    _build_collection(settings, encoder if builder == "torch" else int8, tmp_path)
    with build_platform(settings, embed_cache=False) as platform:
        assert platform.encoder.backend == builder
        for text in SENTENCES:
            (hit,) = platform.knowledge.search(text, limit=1, include_hot=False)
            assert hit.payload["text"] == text
            assert hit.score > (0.999 if builder == "torch" else 0.99)
        info = platform.store.info(settings.collection_main)
        assert info is not None and info.model == encoder_name("minilm", builder)


def test_auto_builds_a_new_collection_with_int8(tmp_path: Path, first_use: FirstUse) -> None:
    settings = _auto_settings(tmp_path, first_use.cache)
    with build_platform(settings, embed_cache=False) as platform:
        platform.knowledge.ensure_collections()
        assert platform.encoder.backend == "onnx-int8"
        for name in (settings.collection_main, settings.collection_hot):
            info = platform.store.info(name)
            assert info is not None and info.model == "minilm+onnx-int8"


def test_an_explicit_backend_other_than_the_collections_is_refused(
    tmp_path: Path, first_use: FirstUse, encoder: Encoder
) -> None:
    _build_collection(_auto_settings(tmp_path, first_use.cache), encoder, tmp_path)
    settings = _auto_settings(tmp_path, first_use.cache, backend="onnx-int8")
    with build_platform(settings, embed_cache=False, ensure_collections=False) as platform:
        assert platform.encoder.backend == "onnx-int8"  # explicit: not the collection's
        with pytest.raises(ModelMismatchError, match="CTX_EMBED_BACKEND=torch to query it"):
            platform.knowledge.ensure_collections()


def test_auto_falls_back_to_torch_with_a_warning_when_the_export_cannot_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No writable encoder cache (a file where the directory should be): auto embeds with
    torch and says why; an explicit onnx-int8 fails with the reason instead."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    settings = _auto_settings(tmp_path, blocker / "encoders")
    with caplog.at_level("WARNING", logger="context_core.knowledge.embedding"):
        enc = load_encoder(settings)
    assert enc.backend == "torch"
    assert "CTX_EMBED_BACKEND=auto embeds with torch (fp32): could not export" in caplog.text
    with pytest.raises(ModelLoadError, match="could not export the int8 ONNX encoder"):
        load_encoder(_auto_settings(tmp_path, blocker / "encoders", backend="onnx-int8"))
    # a collection that asks for int8 is never served by the fallback
    with pytest.raises(ModelLoadError, match="could not export"):
        load_encoder(settings, recorded="minilm+onnx-int8")


def test_the_quantisers_preprocessing_advice_stays_out_of_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ONNX Runtime's quantiser logs advice on the root logger on every export: dropped
    (that record only; the filter is gone again afterwards)."""
    import logging

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 4), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "a.onnx")  # fmt: skip
    with caplog.at_level(logging.INFO):
        onnx_encoder._quantise(tmp_path / "a.onnx", tmp_path / "b.onnx")
        logging.getLogger().warning("Please consider to run pre-processing before quantization")
    assert (tmp_path / "b.onnx").is_file()
    # the quantiser's own record was dropped; the same words logged after the export are not
    assert [r.getMessage() for r in caplog.records if "pre-processing" in r.getMessage()] == [
        "Please consider to run pre-processing before quantization"
    ]


# --- the ingest benchmark's profile of the export ---------------------------------------------


def test_op_profile_of_the_export_sums_its_kernels_by_op_type(first_use: FirstUse) -> None:
    """benchmarks.ingest_throughput's explanation: ONNX Runtime's profiler on the real export,
    the warm-up run left out, shares by op type that add up to the whole."""
    from benchmarks._ort_profile import op_profile

    (path,) = first_use.cache.glob("*.int8.onnx")
    runner = first_use.encoders[0]._runner
    assert runner is not None
    ids = runner.tokenize(SENTENCES)
    out = op_profile(path, ids, threads=1, runs=2)
    assert out["shape"] == [4, max(len(x) for x in ids)] and out["runs"] == 2
    assert sum(out["ops"].values()) == pytest.approx(1.0)
    # the recipe's int8 ops are where a quantised model spends its time
    assert {"QAttention", "DynamicQuantizeMatMul"} <= set(out["ops"])
    shares = list(out["ops"].values())
    assert shares == sorted(shares, reverse=True)
    assert 0 < out["kernel_ms"] <= out["wall_ms"] * 1.05
    with pytest.raises(ValueError, match="non-empty batch"):
        op_profile(path, [], runs=1)


def test_kernel_times_count_kernels_after_the_warm_up_only() -> None:
    from benchmarks._ort_profile import kernel_times

    events = [
        {"cat": "Node", "name": "a_kernel_time", "ts": 5, "dur": 100, "args": {"op_name": "X"}},
        {"cat": "Node", "name": "a_fence_before", "ts": 20, "dur": 7, "args": {"op_name": "X"}},
        {"cat": "Node", "name": "a_kernel_time", "ts": 20, "dur": 3, "args": {"op_name": "X"}},
        {"cat": "Node", "name": "b_kernel_time", "ts": 30, "dur": 4, "args": {"op_name": "Y"}},
        {"cat": "Session", "name": "model_run", "ts": 20, "dur": 50},
    ]
    assert kernel_times(events, after_us=10) == {"X": 3.0, "Y": 4.0}
    assert kernel_times(events) == {"X": 103.0, "Y": 4.0}


def test_gemm_rates_time_the_same_product_as_int8_and_fp32() -> None:
    from benchmarks._ort_profile import gemm_rates

    out = gemm_rates(64, 32, 128, threads=1, repeats=2)
    assert out["int8_gmacs"] > 0 and out["fp32_gmacs"] > 0
    assert out["ratio"] == pytest.approx(out["int8_gmacs"] / out["fp32_gmacs"])
    assert out["max_rel_err"] < 0.05  # the same product, not just two timings


# --- old exports do not pile up ---------------------------------------------------------------


def _aged(path: Path, days: float, now: float) -> Path:
    t = now - days * 86_400
    os.utime(path, (t, t))
    return path


def test_exports_unused_for_a_month_are_pruned_when_another_is_made(tmp_path: Path) -> None:
    now = time.time()

    def file(name: str, days: float, data: bytes = b"x") -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return _aged(path, days, now)

    # the one just made is never removed, however its times read
    keep = file(f"minilm-r{onnx_encoder.EXPORT_RECIPE}-new.int8.onnx", 400)
    old = file("minilm-r2-0123456789abcdef.int8.onnx", 31)  # an older recipe, unused
    recent = file("minilm-r3-fedcba9876543210.int8.onnx", 40)  # another venv's, in use
    onnx_encoder.mark_used(recent)  # loaded now: its atime moves, its mtime stays
    assert recent.stat().st_mtime < now - 39 * 86_400 and recent.stat().st_atime >= now - 5
    killed = tmp_path / ".export-abandoned"  # a killed export's temp dir
    killed.mkdir()
    (killed / "model.onnx").write_bytes(b"half")
    _aged(killed, 2, now)
    (tmp_path / ".export-running").mkdir()  # an export in progress right now
    other = file("notes.txt", 400)  # not an export: not ours to remove

    removed = onnx_encoder.prune_exports(tmp_path, keep=keep, now=now)
    assert sorted(p.name for p in removed) == sorted([old.name, killed.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [keep.name, recent.name, ".export-running", other.name]
    )
    assert onnx_encoder.prune_exports(tmp_path / "absent", keep=keep) == []


def test_mark_used_on_a_read_only_file_is_quiet(tmp_path: Path) -> None:
    onnx_encoder.mark_used(tmp_path / "gone.int8.onnx")  # no such file: nothing raised
