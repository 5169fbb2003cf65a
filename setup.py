"""The optional native reader of NCCL logs (opbench/trace/_scan.c, docs/trace.md "Native reader").

Everything else is in pyproject.toml. ``optional=True``: where no C compiler is found the install goes on without
it and ``opbench trace`` uses its Python reader, with the same results.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("opbench.trace._scan", ["opbench/trace/_scan.c"], optional=True)])
