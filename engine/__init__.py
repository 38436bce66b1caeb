"""Cotrain engine: collaborative training over WebRTC, coordinated by a backbone."""

__version__ = "0.1.0"
