"""Evaluation: calibration, CER, health reports."""
