"""Routing: from the step an agent is about to take to a bundle of provenanced context."""
