"""Device: the emulate search with the process's usable cores set to N (the shared pool's size, or each session's
threads with BISECTOR_SHARED_POOL=0), to see which pool size a many-core host wants. Eighteenth round.

    python3 pool_sizes.py N precision MODEL --fp16 ...       (the `bisector` command's arguments after N)
"""

import sys

import bisector.cores

N = int(sys.argv[1])
bisector.cores.usable_cores = lambda: N  # before any module takes its own reference to it

from bisector.cli.main import entry  # noqa: E402

sys.argv = ["bisector"] + sys.argv[2:]
sys.exit(entry())
