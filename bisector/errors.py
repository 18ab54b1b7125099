"""Errors that map to the documented exit codes (DESIGN §9).

Every expected failure is one of these; the CLI turns it into a one-paragraph message and its exit code.
Anything else is a bug and shows a traceback only with --verbose.
"""

from __future__ import annotations


class BisectorError(Exception):
    """Base class: a message meant for the user and an exit code."""

    exit_code = 2


class UsageError(BisectorError):
    """Bad flags, files or environment (a missing package or provider). Exit 2."""

    exit_code = 2


class BackendFailure(BisectorError):
    """A backend that is present but fails: build failure, canary failure, runtime error. Exit 3."""

    exit_code = 3


class AccuracyFailure(BisectorError):
    """No passing configuration (within budget), or a verify that failed. Exit 1."""

    exit_code = 1


class BuildFailure(BackendFailure):
    """An engine or session could not be built for a plan: a distinct verdict, never an accuracy failure."""
