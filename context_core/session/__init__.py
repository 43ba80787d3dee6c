"""L1: the session state an agent holds right now, and its signed wire form."""
