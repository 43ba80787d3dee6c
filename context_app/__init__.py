"""context_app: the application above the library.

The ``ctx`` command line (:mod:`context_app.cli`), the HTTP service (:mod:`context_app.service`),
the demo and the local Airflow runner. It composes :mod:`context_core` (the library),
:mod:`evaluation` and :mod:`loadtests`; nothing below it imports it (see ARCHITECTURE.md and
the import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

__all__: list[str] = []
