"""``opbench selftest``: is this machine's install right? Every backend on a tiny case, checked and roughly timed."""
