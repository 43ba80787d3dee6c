"""Redis: the one connection, several commands in one round trip, the event-loop client."""
