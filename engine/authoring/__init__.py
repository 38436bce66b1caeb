"""``cotrain project``: writing, sharding, tokenizing and checking a project folder."""
