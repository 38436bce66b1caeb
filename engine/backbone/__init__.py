"""The backbone: the always-on, GPU-less server that coordinates a collaboration."""
