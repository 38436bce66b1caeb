"""What the backbone keeps of a round's checks (engine/backbone/tracker/checks.py runs them):
each drawn part's checkers and verdicts, and the rule that decides a part from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.wire.control import Audit

if TYPE_CHECKING:
    from engine.backbone.tracker.scheduling import Vote


@dataclass
class PartCheck:
    index: int
    reducer: str
    asked: list[str] = field(default_factory=list)  # checkers, in the order asked
    audit: Audit | None = None  # as sent to the reducer and the checker asked last
    asked_until: float = 0.0
    verdicts: dict[str, bool] = field(default_factory=dict)
    unanswered: list[str] = field(default_factory=list)  # checkers that got no inputs
    silent: set[str] = field(default_factory=set)  # checkers that let their time lapse
    passed: bool | None = None
    why: str = ""

    def decide(self) -> None:
        """Two verdicts alike decide; one agreeing verdict with none against passes."""
        agree = sum(self.verdicts.values())
        disagree = len(self.verdicts) - agree
        if agree and not disagree:
            self.passed = True
        elif disagree >= 2 and disagree > agree:
            self.passed, self.why = False, f"{disagree} checkers found its result wrong"
        elif agree >= 2 and agree > disagree:
            self.passed = True


@dataclass
class RoundAudit:
    majority: Vote  # the majority state (and its proof): what the members applied
    parts: list[PartCheck]

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.parts)

    @property
    def failed(self) -> bool:
        return any(p.passed is False for p in self.parts)
