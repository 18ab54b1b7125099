import sys

from bisector.cli.main import entry

sys.exit(entry())
