"""`cotrain project curve URL ID`: the learning curve a backbone serves, drawn and tabled in
the terminal (a researcher watching a run over SSH)."""

import asyncio

import pytest

from engine.cli import main
from engine.wire.control import Step
from tests.collab.harness import running_backbone, tiny_project


async def test_the_curve_is_drawn_falling_with_its_held_out_scores(tmp_path, capsys):
    project = tiny_project()
    async with running_backbone(tmp_path, project) as backbone:
        for epoch in range(1, 101):
            backbone.store.rounds.record_step(project.id, Step(epoch, epoch, 6.0 - epoch / 25, 48, 3, 0.2,
                                                               f"{epoch:064x}"))
        backbone.store.curve.record_heldout(project.id, 50, 4.25, 0.375, 3)
        code = await asyncio.to_thread(main, ["project", "curve", backbone.url, project.id])
        unknown = await asyncio.to_thread(main, ["project", "curve", backbone.url, "nope"])
    out, err = capsys.readouterr()
    assert code == 0 and unknown == 1, err
    assert "tiny-lm: 100 steps, training loss" in out
    drawn = [line for line in out.splitlines() if "┤" in line or "│" in line]
    assert drawn[0].startswith("   5.9") and drawn[-1].startswith("   2.0"), out  # (means of its columns)
    top, bottom = drawn[0][10:], drawn[-1][10:]
    assert top[0] == "█" and top[-1] == " " and " " not in bottom, "the loss falls from left to right"
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert rows["50"][1:4] == ["4.0000", "4.2500", "37.5%"] and rows["100"][1] == "2.0000"
    assert "/api/projects/nope/curve: 404" in err


@pytest.mark.parametrize("url, says", [("http://127.0.0.1:9", "cannot reach http://127.0.0.1:9")])
def test_a_backbone_that_cannot_be_reached_is_said_so(capsys, url, says):
    assert main(["project", "curve", url, "tiny-lm"]) == 1
    assert says in capsys.readouterr().err
