"""A stranger claiming a perfect held-out score after every step, next to three honest
peers training the catalog's digits: the learning curve shows what the honest peers
measured, never its number."""

import sys

import msgspec
import pytest

from engine.project_folders import load_project_folder
from engine.wire.codec import encode
from tests.collab.test_digits import digits_folder
from tests.hostile.collaboration import Collaboration

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


async def test_a_stranger_claiming_perfect_scores_does_not_draw_the_learning_curve(tmp_path, report_figure):
    folder = load_project_folder(digits_folder(tmp_path / "projects"))
    spec = msgspec.structs.replace(folder.spec, evaluate_every=2)
    (folder.root / "project.json").write_bytes(encode(spec))
    collab = Collaboration(tmp_path, folder=load_project_folder(folder.root))
    try:
        collab.start(warm_up_epochs=1)
        liar = collab.start_peer("liar", command=[sys.executable, "-m", "tests.hostile.heldout_liar"])
        await collab.until(lambda: liar.log.read_text(errors="replace").count("claimed a perfect score") >= 8,
                           240, "eight perfect claims")
        await collab.until(lambda: len(scored(collab)) >= 6, 120, "six scored epochs")
        assert all(p.alive for p in collab.peers)
        # While the honest peers train beside it (once they stop, its state is its own).
        points = scored(collab)
    finally:
        collab.stop()
    report_figure(f"held-out accuracy recorded at {len(points)} epochs: "
                  f"{', '.join(f'{e}: {a:.1%}' for e, (_, a) in sorted(points.items()))}")
    # It is one of the three scorers of about three in four scored states: the median is an
    # honest peer's figure every time.
    assert all(accuracy < 1.0 and loss > 0.001 for loss, accuracy in points.values()), points


def scored(collab: Collaboration) -> dict[int, tuple[float, float]]:
    rows = collab.db().execute("SELECT epoch, loss, accuracy FROM heldout").fetchall()
    return {epoch: (loss, accuracy) for epoch, loss, accuracy in rows}

