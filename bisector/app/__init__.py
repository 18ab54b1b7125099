"""The application: a Python API (precision, verify, evaluate, profile) under the thin CLI commands."""
