"""A peer: joins a backbone's project, syncs state, trains and averages with the others."""
