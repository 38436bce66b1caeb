"""Local training mechanics: accumulation, the collaborative step, schedules and state."""
