"""A project's files on a peer: fetched on demand, checked, kept within the disk limit."""
