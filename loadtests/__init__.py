"""Locust load tests."""
