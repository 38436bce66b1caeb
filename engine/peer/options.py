"""How a peer is asked to run: what `cotrain peer`'s flags and the app's settings set."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.governor.limits import Limits


@dataclass
class PeerOptions:
    backbone_url: str
    project_id: str
    name: str = ""
    max_epochs: int | None = None
    threads: int | None = None
    data_dir: str | None = None
    data_seed: int | None = None
    slowdown: float = 1.0  # behave like a device this many times slower (tests, benchmarks)
    ice_addresses: list[str] | None = None
    user_token: str | None = None
    reconnect_for: float = 600.0  # seconds to keep trying when the backbone goes away
    limits: Limits = field(default_factory=Limits)
    relay_only: bool = False  # connect to other peers through TURN only
    save_state: str | None = None  # a file to write the state we hold to as we leave
    # The state file this computer's previous peer held when the project changed under it:
    # the next one starts from it (engine/peer/state_sync.py carry_on).
    carried_state: bytes | None = None
    auxiliary: bool = False  # reduce parts of rounds only: no training (engine/peer/auxiliary.py)
