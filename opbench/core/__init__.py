"""Shared core: device layer, timing harness, report writer, user-error handling, CLI helpers."""
