"""What a round counts from each sender: the samples that reducers holding more than half
of the vector saw in its part. Peers count a step's samples by it and the backbone credits
by it, so a step takes exactly what its members are credited for (before the ledger bounds
their claims): two reducers that disagree about a sender -- one set its part aside, or it
reached one of them late -- cannot make a step of fewer samples than the credits given."""

from __future__ import annotations

from collections.abc import Mapping


def seen_by_reducers(reports: Mapping[str, Mapping[str, int]],
                     weights: Mapping[str, float]) -> dict[str, int]:
    """Per sender whose part reducers holding more than half of ``weights`` (their shares of
    the vector) took, the largest sample count they all report (0: a part with no samples);
    a sender they did not see is left out. A reducer that did not report saw nothing."""
    total = sum(weights.values())
    senders = {sender for report in reports.values() for sender in report}
    seen = {}
    for sender in senders:
        counts = sorted(((reports.get(r, {}).get(sender, -1), w) for r, w in weights.items() if w > 0),
                        reverse=True)
        held = 0.0
        for count, weight in counts:
            held += weight
            if held * 2 > total:
                if count >= 0:
                    seen[sender] = count
                break
    return seen
