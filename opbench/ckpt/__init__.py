"""Checkpoint save/load benchmark: torch.save, DCP and async DCP, to local disk or any fsspec URL.

state.py builds a deterministic, sharded training state; storage.py resolves where it goes; methods.py saves
and loads it the way trainers do; runner.py times one case across ranks; __main__.py is the CLI.
"""
