"""Locust campaigns against the context service."""
