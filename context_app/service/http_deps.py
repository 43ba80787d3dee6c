"""FastAPI dependencies shared by the routes: the services, the calling agent, body size.

They never block (finding the services, hashing the API key, reading the already-buffered
body), so they are ``async`` and cost no worker-thread hop.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import APIKeyHeader

from context_app.service.deps import Services
from context_core.access.auth import AgentKey

__all__ = ["API_KEY", "BodyBytes", "Svc", "Who", "agent", "body_bytes", "services"]

API_KEY = APIKeyHeader(name="X-API-Key", auto_error=False, description="per-agent API key")


async def services(request: Request) -> Services:
    svc: Services | None = getattr(request.app.state, "services", None)
    if svc is None:  # pragma: no cover - only before the lifespan ran
        raise HTTPException(503, "service is starting")
    return svc


Svc = Annotated[Services, Depends(services)]


async def agent(key: Annotated[str | None, Depends(API_KEY)], svc: Svc) -> AgentKey:
    found = svc.keys.authenticate(key)
    if found is None:
        raise HTTPException(
            401,
            "missing or unknown X-API-Key header",
            headers={"WWW-Authenticate": "APIKey"},
        )
    return found


Who = Annotated[AgentKey, Depends(agent)]


async def body_bytes(request: Request) -> int:
    """Size of the request body (already buffered by the body guard and the JSON parse)."""
    return len(await request.body())


BodyBytes = Annotated[int, Depends(body_bytes)]
