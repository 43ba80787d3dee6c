"""The fallback trigger (the design's on_fallback): a step query that refers to earlier
teaching, with no usable main-collection L3 hit, tells the agent to confirm its answer with
the user and where to post it. Detection is a pure function (table test); the routes use
real Redis, Qdrant Edge and MiniLM (fixtures from test_router)."""

# ruff: noqa: F811  (pytest fixtures imported from test_router are parameters here)

from __future__ import annotations

import pytest
from test_router import KNOWLEDGE, Env, env  # noqa: F401 (fixtures)

from context_core.ingest.hot import on_fallback
from context_core.routing.bundle import teaching_cue
from context_core.routing.confidence import ConfidencePolicy


@pytest.mark.parametrize(
    ("text", "cue"),
    [
        ("As I told you, the east pump runs hot", "As I told you"),
        ("do it like I showed you yesterday", "like I showed you"),
        ("like I said, check the seal", "like I said"),
        ("as I've already explained, use 4.5 mm/s", "as I've already explained"),
        ("Remember what I said about the coupling?", "Remember what I said"),
        ("remember how I showed you the bypass", "remember how I showed"),
        ("Earlier I explained the lockout steps", "Earlier I explained"),
        ("last time, I told you the torque", "last time, I told"),
        ("I already told you the limit", "I already told"),
        ("I have shown you this before", "I have shown you this before"),
        ("the procedure I taught you", "I taught you"),
        ("as we discussed, swap the bearing", "as we discussed"),
        ("上次我说的那个泵怎么样了", "上次我"),
        ("按我之前说过的步骤做", "之前说过"),
        ("我教过你怎么换密封", "我教过你"),
        ("我已经跟你说过了", "我已经跟你说过"),
        ("记得我说的阈值吗", "记得我说"),
        ("就像我说的那样处理", "就像我说的"),
        # not a reference to earlier teaching
        ("What is the vibration limit for PUMP-0042?", None),
        ("I showed the report to the manager", None),
        ("Tell me what the manual says about seals", None),
        ("The last time the pump tripped was Monday", None),
        ("before I explained anything the pump tripped", None),
        ("上次维修记录在哪里", None),
        ("泵的振动限值是多少", None),
        ("", None),
    ],
)
def test_teaching_cue_table(text: str, cue: str | None) -> None:
    assert teaching_cue(text) == cue


QUERY = "As I told you, what torque does the impeller lock nut need?"


def _best_main(env: Env, query: str) -> float:
    return max(h.score for h in env.knowledge.search(query, limit=5))


def test_fallback_triggers_without_a_usable_main_hit(env: Env) -> None:
    best = _best_main(env, QUERY)
    policy = ConfidencePolicy(accept=min(1.0, best + 0.1), skip=best + 0.05, source="test")
    with env.router(policy=policy) as router:
        b = router.route(env.state(), "default", params={"query": QUERY})
    fb = b.context_used["fallback"]
    assert fb["triggered"] is True
    assert fb["confirm_at"] == f"/v1/sessions/{env.session_id}/confirmations"
    assert "'As I told you'" in fb["reason"] and f"{best:.3f}" in fb["reason"]
    assert b.by_layer("L3") == ()  # every hit below skip: L3 left out
    (rec,) = env.traces()
    assert rec["fallback"] == fb


def test_user_query_is_the_step_query_when_params_have_none(env: Env) -> None:
    best = _best_main(env, QUERY)
    policy = ConfidencePolicy(accept=min(1.0, best + 0.1), skip=best + 0.05, source="test")
    with env.router(policy=policy) as router:
        b = router.route(env.state(query=QUERY), "default")
        plain = router.route(env.state(query="impeller lock nut torque"), "default")
    assert b.context_used["fallback"]["triggered"] is True
    assert "fallback" not in plain.context_used  # no cue: nothing to confirm
    assert env.traces()[1]["fallback"] is None


def test_no_fallback_when_main_knowledge_answers(env: Env) -> None:
    query = "like I showed you: " + KNOWLEDGE[0][2]
    assert _best_main(env, query) > 0.65
    with env.router() as router:
        b = router.route(env.state(), "default", params={"query": query})
    assert "fallback" not in b.context_used
    assert b.by_layer("L3")
    assert env.traces()[0]["fallback"] is None


def test_a_hot_answer_does_not_count_as_usable(env: Env) -> None:
    """Unreviewed hot answers are for reference only: the fallback still fires."""
    best = _best_main(env, QUERY)
    policy = ConfidencePolicy(accept=min(1.0, best + 0.1), skip=best + 0.05, source="test")
    on_fallback(QUERY, "Torque it to 95 N·m.", "confirmed", knowledge=env.knowledge, section="PUMP")
    with env.router(policy=policy) as router:
        b = router.route(env.state(), "default", params={"query": QUERY})
    hot = [f for f in b.by_layer("L3") if f.source.startswith("L3:hot_knowledge:")]
    assert hot and hot[0].relevance > policy.skip and hot[0].label == "low_confidence"
    assert b.context_used["fallback"]["triggered"] is True


def test_no_fallback_without_a_search(env: Env) -> None:
    """A degraded route (no knowledge memory) does not know that L3 has nothing."""
    with env.router(knowledge=None) as router:
        b = router.route(env.state(), "default", params={"query": QUERY})
    assert b.degraded and "fallback" not in b.context_used
    assert env.traces()[0]["fallback"] is None
