"""context_core: structured, addressable, decaying and auditable memory for agents."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
