"""``cotrain worker``: the engine as a child process of the desktop app (see protocol.py)."""
