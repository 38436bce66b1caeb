"""The Cotrain desktop app: tray, windows and the supervisor of the engine's worker process."""
