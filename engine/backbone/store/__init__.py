"""The backbone's durable state: repositories.py opens it."""
