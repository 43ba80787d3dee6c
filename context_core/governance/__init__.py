"""Data governance: where personal and organisational data lives (the inventory), erasure on
request and its ledger (replayed after a restore)."""

from context_core.governance.erasure import ErasureReceipt, ErasureTarget, erase_user, replay_ledger
from context_core.governance.inventory import INVENTORY, StoreEntry, render_table
from context_core.governance.ledger import ErasureLedger

__all__ = [
    "INVENTORY",
    "ErasureLedger",
    "ErasureReceipt",
    "ErasureTarget",
    "StoreEntry",
    "erase_user",
    "render_table",
    "replay_ledger",
]
