"""The tunable defaults, declared once.

:class:`~context_core.config.Settings` declares its fields with these values, and the classes
that can also be built without settings (tests, scripts: ``Gateway()``, ``WorkingMemory(client,
gateway)``, ``ContextRouter(...)``, ``ConfidencePolicy()``, ``LifecycleManager(...)``) take
their keyword defaults from here, so a default changed here changes everywhere. This module
imports nothing, so any module may import it.
"""

from __future__ import annotations

__all__ = [
    "ACCEPT_THRESHOLD",
    "BUNDLE_MAX_FRAGMENTS",
    "CORRECTION_MIN_CONFIDENCE",
    "L1_MAX_TRACE_TOKENS",
    "L3_TIMEOUT_MS",
    "MAX_RESPONSE_BYTES",
    "MAX_STEP_RESULT_BYTES",
    "SESSION_IDLE_S",
    "SKIP_THRESHOLD",
    "WM_CONTRACT_HISTORY_TTL_S",
    "WM_CONTRACT_TTL_S",
    "WM_DEFAULT_TTL_S",
    "WM_MIN_TTL_S",
    "WM_SERIES_WINDOW",
]

# L1 / L2 (CTX_WM_*, CTX_SESSION_IDLE_S, CTX_MAX_STEP_RESULT_BYTES, CTX_L1_MAX_TRACE_TOKENS)
WM_DEFAULT_TTL_S = 900
WM_SERIES_WINDOW = 1000
WM_MIN_TTL_S = 60
WM_CONTRACT_TTL_S = 7200
WM_CONTRACT_HISTORY_TTL_S = 30 * 86_400
SESSION_IDLE_S = 90
MAX_STEP_RESULT_BYTES = 16 * 1024
L1_MAX_TRACE_TOKENS = 2000
CORRECTION_MIN_CONFIDENCE = 0.6

# routing (CTX_L3_TIMEOUT_MS, CTX_BUNDLE_MAX_FRAGMENTS, CTX_ACCEPT/SKIP_THRESHOLD)
L3_TIMEOUT_MS = 100.0
BUNDLE_MAX_FRAGMENTS = 3
ACCEPT_THRESHOLD = 0.72
SKIP_THRESHOLD = 0.65

# gateway (CTX_MAX_RESPONSE_BYTES)
MAX_RESPONSE_BYTES = 10 * 1024
