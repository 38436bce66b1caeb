"""Versioned wire formats: control-plane messages, data-plane frames, REST bodies, state files.

Every shape that crosses a process boundary is a ``msgspec.Struct`` defined once here (the
worker protocol lives with the worker); decoding untrusted bytes checks types, ranges and
sizes in one call and raises ProtocolError, the one error type for bad input.
"""

from typing import Final

# 10: a reducer sets aside a lone part it has nothing to judge by (engine/averaging/robust.py):
# a checker of an older version would find such a reducer's results wrong.
WIRE_VERSION: Final = 10


class ProtocolError(ValueError):
    """Input from the network or a file that does not follow the wire format."""
