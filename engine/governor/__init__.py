"""The resource governor: when the engine may compute, and how hard."""
