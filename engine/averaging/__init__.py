"""Gradient averaging: how the vector is split among reducers, and the all-reduce round."""
