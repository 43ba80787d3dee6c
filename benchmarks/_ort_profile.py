"""Where an ONNX encoder's time goes: ONNX Runtime's own profiler, summed by operator type.

Used by ``benchmarks.ingest_throughput`` to put the profile that explains its ratio next to
the ratio. A batch is run once to warm up and then ``runs`` times with profiling on; only
the kernel times of the timed runs count (the warm-up allocates and plans).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from context_core.knowledge.onnx_encoder import padded_feeds, session_options


def kernel_times(events: Sequence[dict[str, Any]], *, after_us: float = 0.0) -> dict[str, float]:
    """Microseconds per operator type from a profile's events: the ``*_kernel_time`` node
    events that start at or after ``after_us`` (the fences around them are not kernel time)."""
    out: dict[str, float] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        if float(e.get("ts", 0)) < after_us:
            continue
        op = str((e.get("args") or {}).get("op_name", "?"))
        out[op] = out.get(op, 0.0) + float(e.get("dur", 0))
    return out


def op_profile(
    model: Path, ids: Sequence[Sequence[int]], *, threads: int = 0, runs: int = 3
) -> dict[str, Any]:
    """Profile ``runs`` runs of one batch (token ids, unpadded) through ``model``.

    Returns ``ops`` (op type -> share of kernel time, largest first), ``kernel_ms`` and
    ``wall_ms`` per run, ``runs`` and the batch's ``shape``."""
    import onnxruntime as ort

    if not ids or runs < 1:
        raise ValueError("op_profile needs a non-empty batch and runs >= 1")
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as tmp:
        opts = session_options(threads)  # the encoder's own, with the profiler on
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "encoder")
        session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        inputs = [i.name for i in session.get_inputs()]
        feeds, _mask = padded_feeds(ids, inputs)
        session.run(None, feeds)  # warm-up: not counted
        t0 = time.perf_counter_ns()
        for _ in range(runs):
            session.run(None, feeds)
        wall_ms = (time.perf_counter_ns() - t0) / 1e6 / runs
        path = Path(session.end_profiling())
        events = json.loads(path.read_text(encoding="utf-8"))
    # the first model run is the warm-up: count what starts after it ends
    model_runs = sorted(
        (float(e["ts"]), float(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    if len(model_runs) != runs + 1:
        raise RuntimeError(
            f"expected {runs + 1} model runs in the profile, found {len(model_runs)}"
        )
    after_us = sum(model_runs[0])
    times = kernel_times(events, after_us=after_us)
    total = sum(times.values())
    if total <= 0:
        raise RuntimeError(f"the ONNX Runtime profile of {model.name} holds no kernel times")
    ops = dict(sorted(((k, v / total) for k, v in times.items()), key=lambda kv: -kv[1]))
    return {
        "ops": ops,
        "kernel_ms": total / 1e3 / runs,
        "wall_ms": wall_ms,
        "runs": runs,
        "shape": [len(ids), max(len(x) for x in ids)],
    }


def gemm_rates(
    m: int, k: int, n: int, *, threads: int = 0, repeats: int = 5, seed: int = 0
) -> dict[str, float]:
    """Multiply-adds per second of one ``[m, k] x [k, n]`` product as the int8 export runs it
    (``DynamicQuantizeMatMul``: activations quantised per call, int8 weights) and as fp32
    ``MatMul``, same shapes, same session options; best of ``repeats`` after a warm-up.

    The ratio is the ceiling of what int8 weights can buy on this CPU (with VNNI or AMX the
    int8 kernels are several times fp32's; with AVX2 alone they are not)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32) * 0.05
    scale = np.float32(np.abs(w).max() / 127.0)
    w8 = np.clip(np.round(w / scale), -127, 127).astype(np.int8)

    def graph(node: Any, inits: list[Any]) -> Any:
        return helper.make_model(
            helper.make_graph(
                [node],
                "gemm",
                [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                inits,
            ),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        )

    models = {
        "int8": graph(
            helper.make_node(
                "DynamicQuantizeMatMul", ["a", "w", "s", "z"], ["y"], domain="com.microsoft"
            ),
            [
                numpy_helper.from_array(w8, "w"),
                numpy_helper.from_array(np.array([scale], dtype=np.float32), "s"),
                numpy_helper.from_array(np.array([0], dtype=np.int8), "z"),
            ],
        ),
        "fp32": graph(
            helper.make_node("MatMul", ["a", "w"], ["y"]),
            [numpy_helper.from_array((w8.astype(np.float32) * scale), "w")],
        ),
    }
    opts = session_options(threads)
    out: dict[str, float] = {}
    results: dict[str, np.ndarray] = {}
    for name, model in models.items():
        sess = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        results[name] = sess.run(None, {"a": a})[0]
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            sess.run(None, {"a": a})
            best = min(best, time.perf_counter() - t0)
        out[f"{name}_gmacs"] = m * k * n / best / 1e9
    out["ratio"] = out["int8_gmacs"] / out["fp32_gmacs"]
    # both graphs compute the same product (up to the activations' quantisation)
    ref = results["fp32"]
    out["max_rel_err"] = float(np.abs(results["int8"] - ref).max() / max(np.abs(ref).max(), 1e-12))
    return out
