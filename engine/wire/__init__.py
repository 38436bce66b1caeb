"""Versioned wire formats: control-plane messages, data-plane frames, REST bodies, state files.

Every shape that crosses a process boundary is a ``msgspec.Struct`` defined once here (the
worker protocol lives with the worker); decoding untrusted bytes checks types, ranges and
sizes in one call and raises ProtocolError, the one error type for bad input.
"""

from typing import Final

WIRE_VERSION: Final = 9


class ProtocolError(ValueError):
    """Input from the network or a file that does not follow the wire format."""
