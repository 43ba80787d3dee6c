"""A real Qdrant server for the backend contract tests, when one is given.

``CTX_TEST_QDRANT_URL``: a scratch server (or cluster) for tests. Every collection on it is
dropped before and after each test, like the conftest's ``CTX_TEST_REDIS_URL`` database.

``CTX_QDRANT_URL`` (the application's own setting) is used only when the server holds no
collection at all when a test starts (a server with data is never touched), and then only the
collections a test created are dropped.

Neither set, or the server does not answer: the test is skipped, saying which.
``CTX_TEST_QDRANT_API_KEY`` (else ``CTX_QDRANT_API_KEY``) authenticates.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from context_core.knowledge.qdrant_server import QdrantServerStore

__all__ = ["server_store"]

NOT_SET = (
    "no Qdrant server: set CTX_TEST_QDRANT_URL (a scratch server: its collections are "
    "dropped) or CTX_QDRANT_URL (used only while it holds no collection) to run the server "
    "backend's contract tests against one"
)


def _names(store: QdrantServerStore) -> set[str]:
    return {c.name for c in store._client.get_collections().collections}


def _drop(store: QdrantServerStore, names: set[str]) -> None:
    for name in sorted(names):
        store._client.delete_collection(name)


def server_store() -> Iterator[QdrantServerStore]:
    """Yield a store on the configured server (see the module docstring) or skip."""
    scratch_url = os.environ.get("CTX_TEST_QDRANT_URL", "").strip()
    url = scratch_url or os.environ.get("CTX_QDRANT_URL", "").strip()
    if not url or url == ":memory:":
        pytest.skip(NOT_SET)
    api_key = os.environ.get("CTX_TEST_QDRANT_API_KEY") or os.environ.get("CTX_QDRANT_API_KEY")
    store = QdrantServerStore.connect(url, api_key=api_key or None, timeout=30)
    try:
        before = _names(store)
    except Exception as e:
        store.close()
        pytest.skip(f"the Qdrant server at {url} does not answer: {e}")
    if before and not scratch_url:
        store.close()
        pytest.skip(
            f"CTX_QDRANT_URL={url} holds collections ({', '.join(sorted(before))}); the "
            "contract tests create and drop collections, so they only use an empty server "
            "there: point CTX_TEST_QDRANT_URL at a scratch server"
        )
    if scratch_url:
        _drop(store, before)
        before = set()
    try:
        yield store
    finally:
        try:
            _drop(store, _names(store) - before)
        finally:
            store.close()
