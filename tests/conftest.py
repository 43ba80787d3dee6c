"""Shared fixtures: real servers only.

* ``redis_url``: Redis 7 at 127.0.0.1:6379 (DB 13, reserved for tests) when reachable,
  else an embedded Valkey started for the session.
* ``any_redis``: parametrised over *both* servers, for suites that must pass on each
  (the L2 suite). The embedded Valkey is always available; the system Redis param skips,
  saying why, when nothing listens on 6379.
* ``settings``: ``Settings`` on a per-test temp data dir, pointed at ``redis_url``.
* ``shared_data``: path to ``../shared/data`` or a skip naming the missing folder.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from context_app.airflow_local import LocalAirflow as AirflowHome
from context_core.config import Settings, get_settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SYSTEM_REDIS_URL = os.environ.get("CTX_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
T = TypeVar("T")


def _reachable(url: str) -> bool:
    try:
        c = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        ok = bool(c.ping())
        c.close()
        return ok
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(scope="session")
def embedded_valkey_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from context_core.redis_conn import RedisProvider

    d = tmp_path_factory.mktemp("valkey")
    provider = RedisProvider(get_settings(data_dir=d, redis_url=None))
    try:
        yield provider.url
    finally:
        provider.close()


@pytest.fixture(scope="session")
def system_redis_url() -> str:
    if not _reachable(SYSTEM_REDIS_URL):
        pytest.skip(f"no Redis answering at {SYSTEM_REDIS_URL} (set CTX_TEST_REDIS_URL)")
    return SYSTEM_REDIS_URL


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """The system Redis when reachable, else the embedded Valkey."""
    if _reachable(SYSTEM_REDIS_URL):
        return SYSTEM_REDIS_URL
    return str(request.getfixturevalue("embedded_valkey_url"))


@pytest.fixture(params=["redis7", "valkey"])
def any_redis(request: pytest.FixtureRequest) -> str:
    """Each L2 test runs once per real server kind."""
    if request.param == "redis7":
        return str(request.getfixturevalue("system_redis_url"))
    return str(request.getfixturevalue("embedded_valkey_url"))


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    return get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=redis_url
    )


@pytest.fixture
def session_id() -> str:
    """A fresh session id per test so tests never see each other's keys."""
    return f"t-{uuid.uuid4().hex[:12]}"


@dataclasses.dataclass(frozen=True)
class CrowdedRedis:
    """``any_redis`` plus 20,000 unrelated keys, so anything that SCANs the keyspace shows."""

    url: str
    prefix: str
    n_keys: int

    def scan_calls(self) -> int:
        """Server-wide SCAN calls so far (INFO commandstats ``cmdstat_scan``)."""
        c = redis.Redis.from_url(self.url)
        try:
            return int(c.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))
        finally:
            c.close()

    def run_without_scan(self, prepare: Callable[[], Callable[[], T]], attempts: int = 5) -> T:
        """``act = prepare()`` outside the window, then ``act()``, which must add no SCAN.

        The counter is server-wide and the system Redis is shared with other test runs whose
        fixtures SCAN, so a window that saw one is retried with a fresh ``prepare()``. Code
        that scans adds >= 1 call (>= 40 over these 20k keys) in *every* window: it cannot
        pass, however many attempts.
        """
        delta = -1
        for _ in range(attempts):
            act = prepare()
            before = self.scan_calls()
            result = act()
            delta = self.scan_calls() - before
            if delta == 0:
                return result
        raise AssertionError(f"SCAN was sent in each of {attempts} windows (last: {delta} calls)")


@pytest.fixture
def crowded_redis(any_redis: str) -> Iterator[CrowdedRedis]:
    """20k string keys under ``t-crowd-<uuid>:`` (10 min TTL as a safety net), deleted by
    name afterwards: no SCAN in set-up or teardown, so the counter only moves for the test."""
    prefix = f"t-crowd-{uuid.uuid4().hex[:10]}:"
    names = [f"{prefix}{i}" for i in range(20_000)]
    c = redis.Redis.from_url(any_redis)
    try:
        for start in range(0, len(names), 2_000):
            pipe = c.pipeline(transaction=False)
            for name in names[start : start + 2_000]:
                pipe.set(name, "x", ex=600)
            pipe.execute()
        yield CrowdedRedis(any_redis, prefix, len(names))
    finally:
        for start in range(0, len(names), 2_000):
            c.delete(*names[start : start + 2_000])
        c.close()


def cleanup_keys(url: str, pattern: str) -> None:
    """Delete test keys by SCAN (never KEYS *)."""
    c = redis.Redis.from_url(url)
    try:
        batch = list(c.scan_iter(match=pattern, count=500))
        if batch:
            c.delete(*batch)
    finally:
        c.close()


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (only in the project workspace)")
    return SHARED_DATA


# --- Airflow ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> AirflowHome:
    """A private AIRFLOW_HOME with a SQLite DB migrated once per session.

    Every DagBag parse and ``dag.test()`` runs in a fresh interpreter (Airflow freezes its
    configuration at import), through the same runner the main job uses.
    """
    home = tmp_path_factory.mktemp("airflow_home")
    return AirflowHome(home=home, dags_folder=REPO_ROOT / "dags").prepare()
