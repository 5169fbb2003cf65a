"""The bounds of a number typed or read: beyond them a value is a typo (or hostile), and would cost minutes of work
or memory no machine has. The command line's parsers (core.cli), the fault specs (core.faults), the log readers and
the results readers all check against these (docs/conventions.md, "Units"). Imports nothing.
"""

from __future__ import annotations

MAX_MIB = float(1 << 30)  # 1 PiB: no checkpoint or buffer of one job is larger; beyond it is a typo, not a size
MAX_WORLD = 1 << 22  # 4 Mi ranks: far beyond any cluster; a bigger world is a typo (and would take minutes to model)
MAX_LAYERS = 1 << 12  # decoder layers: released models have at most ~130; 4096 is a typo (and minutes of tables)
MAX_SEQLEN = 1 << 24  # tokens per sequence: a config's seqlen meets the same bound (models.config.MAX_CONFIG_INT)
