"""Delta recall: tokens of full bundles vs delta bundles, and what a delta route costs.

All real parts, wired by ``build_platform`` as in the service: Redis (``--redis-url``), Qdrant
Edge in a temp dir holding the bundled sample export (ingested by ``run_refresh``), MiniLM.
Tokens are counted with the project's counter
(:class:`context_core.lifecycle.tokens.TraceTokenCounter` over the encoder's own tokenizer), on
the JSON a client receives:

* **response**: the whole answer (``to_json()`` vs ``to_delta_dict()`` encoded);
* **fragments**: what an agent re-sends to its LLM: the full bundle's ``fragments`` vs the
  delta's ``fragments`` + ``unchanged`` + ``removed``.

Workloads:

* **scripted session**: ``context_app.demo`` (the README's pump investigation: 4 routed
  steps of 4 different intents, events in between), every route asked with
  ``delta=True, since_bundle=<previous step's bundle>``;
* **long-session mix**: what a load-test agent of the ``long_sessions`` profile does
  (``loadtests/user.py``), uncompressed: 94 steps per session (47 min / 30 s think time),
  each a ``read_sensor`` tool result (step result + series point + cached API response),
  then a route of the next intent of ``INTENT_CYCLE`` for the session's device, and a
  confirmed answer to hot knowledge every 4th step (so L3 hits change over the session).
  Two bases: the previous step's bundle (any intent), and the previous bundle of the same
  intent (the log keeps 8; the cycle has 5 intents).

Every delta answer is applied to its base (:class:`context_core.routing.delta.BundleMirror`) and
checked against the full bundle of the same route, so the token figures are for answers that
reproduce the full bundles exactly.

Latency: on the long session's last state, ``route(generate_report)`` and
``route(compare_vibration)`` with and without delta, timed round-robin in the same run (the
delta route also writes the session's bundle log: one more script call).

Run: ``python -m benchmarks.delta_recall [--sessions 3] [--steps 94] [--routes 400]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import markdown_table, print_table, summarize_ms, write_section
from loadtests.agent_steps import DEVICES, INTENT_CYCLE, QUERIES  # the campaigns' agent

DEFAULT_REDIS = "redis://127.0.0.1:6379/12"  # not the test suite's DB 13
AGENT = "bench-agent"


class _Tokens:
    """Full vs delta token counts of the routes seen, per workload."""

    def __init__(self, count: Callable[[str], int]) -> None:
        self.count = count
        self.n = 0
        self.full_wire = self.delta_wire = self.full_llm = self.delta_llm = 0
        self.refs = self.sent = self.full_answers = 0
        # per kind of fragment: [sent in full, by reference, LLM tokens full, LLM tokens delta]
        self.kinds: dict[str, list[int]] = {}

    def add(self, bundle: Any, mirror: Any) -> None:
        import json

        from context_core.routing.delta import DELTA_ONLY
        from context_core.session.wire import encode_json

        full = json.loads(bundle.to_json())
        delta = json.loads(encode_json(bundle.to_delta_dict()))
        if mirror.apply(delta) != full["fragments"]:
            raise AssertionError(f"delta of step {bundle.step} does not rebuild the bundle")

        def tokens(value: Any) -> int:
            return self.count(encode_json(value).decode())

        self.n += 1
        self.full_wire += tokens(full)
        self.delta_wire += tokens(delta)
        # what the agent appends to its LLM conversation for this step
        self.full_llm += tokens(full["fragments"])
        changed = [{k: v for k, v in f.items() if k not in DELTA_ONLY} for f in delta["fragments"]]
        refs = [r["id"] for r in delta["unchanged"]]
        self.delta_llm += tokens(
            {"fragments": changed, "unchanged": refs, "removed": delta["removed"]}
        )
        self.refs += len(delta["unchanged"])
        self.sent += len(delta["fragments"])
        self.full_answers += bool(delta["full"])
        by_pos = {f["pos"]: f for f in delta["fragments"]}
        for pos, frag in enumerate(full["fragments"]):
            k = self.kinds.setdefault(_kind(frag["source"]), [0, 0, 0, 0])
            k[2] += tokens(frag)
            if pos in by_pos:
                k[0] += 1
                k[3] += tokens(frag)
            else:
                k[1] += 1
                k[3] += tokens(frag["source"])

    def kind_rows(self, budget: int, base: str) -> list[dict[str, Any]]:
        return [
            {
                "budget": budget,
                "base": base,
                "fragment kind": kind,
                "sent / by ref": f"{k[0]} / {k[1]}",
                "LLM tokens full": k[2],
                "LLM tokens delta": k[3],
                "delta / full": f"{k[3] / max(1, k[2]):.3f}",
            }
            for kind, k in sorted(self.kinds.items(), key=lambda kv: -kv[1][2])
        ]

    def row(self, budget: int, what: str, base: str) -> dict[str, Any]:
        n = max(1, self.n)
        return {
            "budget": budget,
            "workload": what,
            "base": base,
            "routes (full answers)": f"{self.n} ({self.full_answers})",
            "fragments sent / by ref": f"{self.sent} / {self.refs}",
            "LLM tokens full": self.full_llm,
            "LLM tokens delta": self.delta_llm,
            "LLM delta / full": f"{self.delta_llm / max(1, self.full_llm):.3f}",
            "LLM tokens saved / route": round((self.full_llm - self.delta_llm) / n, 1),
            "wire tokens full": self.full_wire,
            "wire tokens delta": self.delta_wire,
            "wire delta / full": f"{self.delta_wire / max(1, self.full_wire):.3f}",
        }


def _kind(source: str) -> str:
    """``L1 user_query``, ``L2 series``, ``L2 pref``, ``L3 knowledge_main``, ``NS``."""
    layer, _, rest = source.partition(":")
    if layer == "L1":
        return f"L1 {rest.removeprefix('session.')}"
    if layer == "L2":
        parts = rest.split(":")
        return "L2 pref" if parts[0] == "pref" else f"L2 {parts[2] if len(parts) > 2 else '?'}"
    if layer == "L3":
        return f"L3 {rest.partition(':')[0]}"
    return layer


class _DeltaRouter:
    """The platform's router, asked for a delta against the previous route's bundle on
    every call (what a delta-using agent sends); everything else is the router's."""

    def __init__(self, router: Any, on_bundle: Callable[[Any], None]) -> None:
        self._router = router
        self._on_bundle = on_bundle
        self.last: str | None = None

    def route(self, state: Any, intent: str, **kw: Any) -> Any:
        b = self._router.route(state, intent, delta=True, since_bundle=self.last, **kw)
        self.last = b.delta.bundle_id
        self._on_bundle(b)
        return b

    def __getattr__(self, name: str) -> Any:
        return getattr(self._router, name)


def _scripted(platform: Any, tokens: _Tokens, sid: str) -> None:
    from context_app.demo import run_demo
    from context_core.routing.delta import BundleMirror

    mirror = BundleMirror()
    router = platform.router
    platform.__dict__["router"] = _DeltaRouter(router, lambda b: tokens.add(b, mirror))
    try:
        run_demo(platform.settings, platform=platform, session_id=sid)
    finally:
        platform.__dict__["router"] = router


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _long_session(
    platform: Any, steps: int, confirm_every: int, rng: Any, tokens: _Tokens, same_intent: bool
) -> tuple[Any, str]:
    """One long_sessions agent session (loadtests/user.py's steps, through the library),
    each route asked as a delta against the previous step's bundle, or (``same_intent``)
    against the previous bundle of the same intent."""
    from context_core.errors import ContextMissError
    from context_core.routing.delta import BundleMirror
    from context_core.session.state import AuthContext

    life, router = platform.lifecycle, platform.router
    sid = f"bench-delta-{_tag()}"
    device = rng.choice(DEVICES)
    state = life.apply(
        "session_start",
        None,
        session_id=sid,
        user_id=f"user-{rng.randint(1, 500)}",
        user_query=rng.choice(QUERIES),
        auth=AuthContext(AGENT),
        device_id=device,
    ).state
    shared = BundleMirror()
    mirrors = {i: BundleMirror() if same_intent else shared for i in INTENT_CYCLE}
    for i in range(steps):
        now = time.time()
        rms = round(rng.uniform(2.0, 8.0), 2)
        args = {"device": device, "window_s": 60}
        state = life.apply(
            "tool_call",
            state,
            name="read_sensor",
            args=args,
            result={"device": device, "rms_mm_s": rms, "status": "running"},
            series={f"{device}.vibration": [(now - 1.0, rms * 0.97), (now, rms)]},
        ).state
        intent = INTENT_CYCLE[i % len(INTENT_CYCLE)]
        params: dict[str, Any] = {"device": device}
        if intent == "call_api":
            params.update(endpoint="read_sensor", api_params=args)
        mirror = mirrors[intent]
        try:
            b = router.route(
                state,
                intent,
                params=params,
                agent_id=AGENT,
                delta=True,
                since_bundle=mirror.last_id,
            )
        except ContextMissError:
            continue
        tokens.add(b, mirror)
        if confirm_every and (i + 1) % confirm_every == 0:
            answer = {
                "text": f"Confirmed for {device}: vibration RMS {rms} mm/s is within limits "
                f"after the bearing and coupling check (field note {rng.getrandbits(32)}).",
                "section": device.split("-")[0],
                "title": "Vibration check confirmed by the operator",
            }
            life.confirm_answers(state, [answer])
    return state, sid


def _interleaved(fns: list[Callable[[], Any]], n: int, warmup: int = 20) -> list[list[float]]:
    for _ in range(warmup):
        for fn in fns:
            fn()
    out: list[list[float]] = [[] for _ in fns]
    pc = time.perf_counter
    for _ in range(n):
        for j, fn in enumerate(fns):
            t0 = pc()
            fn()
            out[j].append((pc() - t0) * 1000.0)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.delta_recall",
        description="Delta recall: tokens of full vs delta bundles on the scripted session "
        "and a long_sessions agent's steps, and route latency with and without delta; "
        "writes the 'delta' section of reports/benchmarks.md.",
    )
    ap.add_argument("--sessions", type=int, default=3, help="long sessions to simulate")
    ap.add_argument("--steps", type=int, default=94, help="steps per long session")
    ap.add_argument("--routes", type=int, default=400, help="timed routes per row")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--budgets",
        default="3,8",
        help="bundle budgets (CTX_BUNDLE_MAX_FRAGMENTS) to measure, comma-separated; the "
        "first one is also timed (default 3,8: the default budget and a larger one)",
    )
    ap.add_argument("--redis-url", default=DEFAULT_REDIS, help=f"default {DEFAULT_REDIS}")
    ap.add_argument("--no-write", action="store_true", help="print only, leave the report")
    args = ap.parse_args(argv)

    import random

    from context_core.config import get_settings
    from context_core.ingest.pipeline import run_refresh
    from context_core.lifecycle.tokens import TraceTokenCounter
    from context_core.platform import build_platform
    from context_core.sample_data import sample_export_path

    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    common = dict(
        data_dir=tmp, reports_dir=tmp / "reports", redis_url=args.redis_url, l3_timeout_ms=200.0
    )
    # one platform per bundle budget over the same data dir (the Edge shard is shared)
    platforms = {b: build_platform(get_settings(**common, bundle_max_fragments=b)) for b in budgets}
    platform = platforms[budgets[0]]
    sids: list[str] = []
    try:
        summary = run_refresh(
            sample_export_path(),
            settings=platform.settings,
            store=platform.store,
            encoder=platform.encoder,
            gateway=platform.gateway,
            progress=False,
        )
        counter = TraceTokenCounter(platform.encoder.count_tokens)
        rows = []
        kind_rows: list[dict[str, Any]] = []
        state = None
        for budget, p in platforms.items():
            p.warm_up()
            scripted = _Tokens(counter)
            sids.append(f"bench-delta-{_tag()}")
            _scripted(p, scripted, sids[-1])
            rows.append(scripted.row(budget, "scripted session (demo)", "previous step"))
            for same_intent in (False, True):
                rng = random.Random(args.seed)  # the same sessions for both bases
                mix = _Tokens(counter)
                for _ in range(args.sessions):
                    last_state, sid = _long_session(p, args.steps, 4, rng, mix, same_intent)
                    sids.append(sid)
                    if budget == budgets[0]:
                        state = last_state
                base = "previous bundle, same intent" if same_intent else "previous step"
                what = f"long_sessions mix ({args.sessions} x {args.steps} steps)"
                rows.append(mix.row(budget, what, base))
                if budget == budgets[0]:
                    kind_rows += mix.kind_rows(budget, base)

        # latency: same state, with and without delta, round-robin
        router = platform.router
        assert state is not None
        device = state.last_device_id
        last: dict[str, str | None] = {"generate_report": None, "compare_vibration": None}

        def plain(intent: str) -> Callable[[], Any]:
            return lambda: router.route(state, intent, params={"device": device}, agent_id=AGENT)

        def delta(intent: str) -> Callable[[], Any]:
            def run() -> None:
                b = router.route(
                    state,
                    intent,
                    params={"device": device},
                    agent_id=AGENT,
                    delta=True,
                    since_bundle=last[intent],
                )
                last[intent] = b.delta.bundle_id
                delta_ms.append(b.timings_ms["delta"])

            return run

        delta_ms: list[float] = []
        gc.collect()
        load_before = os.getloadavg()[0]
        timed = [
            summarize_ms(t)
            for t in _interleaved(
                [
                    plain("generate_report"),
                    delta("generate_report"),
                    plain("compare_vibration"),
                    delta("compare_vibration"),
                ],
                args.routes,
            )
        ]
        lat_rows = []
        for i, intent in enumerate(("generate_report", "compare_vibration")):
            p, d = timed[2 * i], timed[2 * i + 1]
            for what, s in ((f"route({intent})", p), (f"route({intent}, delta=True)", d)):
                lat_rows.append(
                    {"what": what, "n": s["n"], "p50 ms": s["p50_ms"], "p99 ms": s["p99_ms"]}
                )
            lat_rows[-1]["p50 / p99 ratio delta : plain"] = (
                f"{d['p50_ms'] / p['p50_ms']:.2f} / {d['p99_ms'] / p['p99_ms']:.2f}"
            )
        dm = summarize_ms(delta_ms[-2 * args.routes :])
        lat_rows.append(
            {
                "what": "of which: the bundle-log script + hashes (timings_ms.delta)",
                "n": dm["n"],
                "p50 ms": dm["p50_ms"],
                "p99 ms": dm["p99_ms"],
            }
        )
        facts = [
            {
                "figure": "knowledge",
                "value": f"sample export: {summary.pages_seen} pages, "
                + f"{summary.chunks_written} chunks",
            },
            {"figure": "token counter", "value": f"{counter.source} ({platform.encoder.name})"},
            {
                "figure": "load average (1 min) before / after timing, 2 cores",
                "value": f"{load_before:.1f} / {os.getloadavg()[0]:.1f}",
            },
        ]
        print_table("tokens: full vs delta bundles", rows)
        print_table("where the tokens go", kind_rows)
        print_table("route latency with and without delta (same run, round-robin)", lat_rows)
        print_table("facts", facts)
        if not args.no_write:
            body = (
                "Tokens of full bundles vs delta bundles (`route(..., delta=True, "
                "since_bundle=...)`, `context_core.routing.delta`), counted with the project's "
                "`TraceTokenCounter` over MiniLM's tokenizer. *LLM tokens* = what the agent "
                "appends to its LLM conversation for the step: the full bundle's `fragments` "
                "(JSON), or the delta's new/changed fragments + the ids of the unchanged and "
                "removed ones; *wire tokens* = the whole JSON answer (the delta's carries "
                "`hash`/`pos` per fragment and a `{id, hash, layer, freshness_hours, pos}` "
                "reference per unchanged one). Every delta was applied to its base and checked "
                "equal to the full bundle. *budget* = `CTX_BUNDLE_MAX_FRAGMENTS` (3 is the "
                "default). The scripted session is `context_app.demo` (4 steps, 4 intents). "
                "The long-session mix is a `long_sessions` load-test agent's steps "
                "(`loadtests/user.py`, 47 min / 30 s think time = 94 steps: a `read_sensor` "
                "tool result, a route of the next `INTENT_CYCLE` intent, a confirmed hot "
                "answer every 4th step) through the library with real Redis, Qdrant Edge and "
                "the bundled sample export; *base* = which bundle the client names as "
                "`since_bundle` (the same sessions, seeded, for both).\n\n"
                + markdown_table(rows)
                + "\nWhere the tokens go (long-session mix, budget "
                + f"{budgets[0]}): every step writes a new step result (a new key) and series "
                "points (a growing value), and `current_step` moves, so those are sent again "
                "whatever the base; the contract, the user query, the device and same-query "
                "L3 hits repeat.\n\n"
                + markdown_table(kind_rows)
                + "\nRoute latency with and without delta, same state and run, round-robin "
                "(the delta route adds one Redis script call: read the base manifest, log "
                "this one):\n\n" + markdown_table(lat_rows) + "\n" + markdown_table(facts)
            )
            write_section("delta", "Delta recall: tokens saved and route cost", body)
    finally:
        client = platform.redis
        for sid in sids:
            for k in client.scan_iter(match=f"wm:{{{sid}}}:*", count=500):
                client.delete(k)
            client.zrem(platform.wm.activity_key, sid)
        for p in reversed(list(platforms.values())):
            p.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
