"""The gateway: what may enter memory (redaction) and what may leave it (output sanitizer)."""
