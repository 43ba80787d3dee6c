"""L1: the session state an agent holds right now, and its wire forms (signed, or sealed with
AES-GCM by :mod:`.seal`)."""
