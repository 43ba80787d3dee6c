"""`ctx sweep-idle`: one idle sweep from the command line, on a real Redis."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from context_app.cli import app
from context_core.config import get_settings
from context_core.gateway.sanitize import Gateway
from context_core.lifecycle.manager import LifecycleManager
from context_core.redis.connection import RedisProvider
from context_core.working_memory import WorkingMemory


def test_sweep_idle_times_out_idle_sessions_and_keeps_their_contract(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", redis_url=redis_url)
    gw = Gateway.from_settings(settings)
    idle, active = f"t-cli-idle-{uuid.uuid4().hex[:8]}", f"t-cli-live-{uuid.uuid4().hex[:8]}"
    with RedisProvider(settings) as provider:
        wm = WorkingMemory.from_settings(settings, provider, gw)
        life = LifecycleManager.from_settings(settings, wm=wm, gateway=gw)
        states = {
            sid: life.handle("session_start", None, session_id=sid, user_id="u", user_query="q")
            for sid in (idle, active)
        }
        life.apply("tool_call", states[idle], name="t", args={}, result={"v": 1})
        time.sleep(1.3)
        life.apply("tool_call", states[active], name="t", args={}, result={"v": 2})
        monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
        monkeypatch.setenv("CTX_REDIS_URL", redis_url)
        res = CliRunner().invoke(app, ["sweep-idle", "--idle-s", "1"])
        try:
            assert res.exit_code == 0, res.output
            out = json.loads(res.output[res.output.index("{") :])
            assert out["ran"] is True
            assert idle in out["timed_out"] and active not in out["timed_out"]
            c = wm.session(idle).contract()
            assert c.status == "expired" and c.version == 1
            live = wm.session(idle).keys()
            assert live and all(":contract:" in k for k in live)  # only the contract stays
            assert wm.session(active).contract().status == "active"
        finally:
            for sid in (idle, active):
                wm.session(sid).clear()
                wm.forget_activity(sid)
