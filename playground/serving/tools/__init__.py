"""Measurement tools (run by management commands), not part of serving a request."""
