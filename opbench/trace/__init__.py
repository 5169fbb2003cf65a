"""NCCL/RCCL debug-log analysis (``opbench trace``) and the nccl-tests / rccl-tests output parser
(``opbench nccl-tests``). Torch-free: both run where PyTorch is not installed yet.

``analyze`` / ``trace_sizes`` / ``iter_records`` (in ``analyze``) are the API; ``__main__`` and
``nccl_tests.main`` are the command lines.
"""
