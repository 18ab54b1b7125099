"""The command line: flags -> typed option groups -> the API (bisector.app) -> printed results."""

from bisector.cli.main import main

__all__ = ["main"]
