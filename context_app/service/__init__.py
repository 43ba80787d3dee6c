"""The context service over HTTP (FastAPI): ``create_app(settings)`` builds the ASGI app."""

from context_app.service.app import create_app

__all__ = ["create_app"]
