"""``python -m opbench <subcommand> …`` is the same as the ``opbench`` console script."""

from opbench.core.cli import console_main

console_main()
