"""Alias kept from before the trace package existed: ``python -m opbench.comm.trace`` = ``opbench trace``."""

import sys

from opbench.core.errors import run_cli
from opbench.trace.__main__ import main

if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.comm.trace"))
