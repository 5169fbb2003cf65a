"""Alias kept from before the trace package existed: ``python -m opbench.comm.nccl_tests`` =
``opbench nccl-tests``."""

import sys

from opbench.core.errors import run_cli
from opbench.trace.nccl_tests import main

if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.comm.nccl_tests"))
