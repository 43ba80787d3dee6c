"""Lifecycle: the events of a session and what each does to L1, L2 and L3."""
