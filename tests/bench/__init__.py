"""Benchmarks: ``python -m tests.bench`` runs them all; each module also runs alone."""
