"""Versioned wire formats: control-plane messages, data-plane frames, tensor bundles."""

WIRE_VERSION = 1


class ProtocolError(ValueError):
    """Input from the network or a file that does not follow the wire format."""
