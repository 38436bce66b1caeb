"""`cotrain backbone --tensorboard DIR`: a researcher watching in TensorBoard sees each step's
training loss, samples and peers, and the held-out scores, the same figures the backbone's
curve holds. The event files are read here as TensorBoard reads them (TFRecord frames of
Event protos), not through the writer's code."""

import struct
from pathlib import Path

import pytest
from tensorboardX.proto.event_pb2 import Event

from engine.cli import main
from tests.collab.harness import running_backbone, start_peer, stop_all
from tests.projects import albert_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
SMALL = {"config": {"vocab_size": 8000, "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64},
         "seq_len": 32, "micro_batch": 4}


def scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, from every event file in ``folder``."""
    found: dict[str, dict[int, float]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            event = Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4  # (length, its CRC, the record, its CRC)
            for value in event.summary.value:
                found.setdefault(value.tag, {})[event.step] = value.simple_value
    return found


async def test_the_curve_is_written_as_tensorboard_events(tmp_path):
    folder = albert_folder(tmp_path / "projects", task_params=SMALL, target_batch_size=8, evaluate_every=2)
    events = tmp_path / "tensorboard"
    async with running_backbone(tmp_path / "bb", projects_dir=folder.root.parent,
                                tensorboard_dir=events) as backbone:
        peer = start_peer(backbone.url, "albert-mini", "p0", max_epochs=4, threads=1)
        try:
            assert await peer.finish(timeout=120) == "reached epoch 4"
        finally:
            await stop_all(peer)
        curve = backbone.store.curve.points("albert-mini")
    seen = scalars(events / "albert-mini")
    assert seen["train/loss"] == pytest.approx({p.epoch: p.loss for p in curve}, rel=1e-6)
    assert seen["train/samples"] == {p.epoch: p.samples for p in curve}
    assert seen["train/peers"] == {p.epoch: 1 for p in curve} and sorted(seen["train/loss"]) == [1, 2, 3, 4]
    scored = {p.epoch: p.heldout_loss for p in curve if p.heldout_loss is not None}
    assert scored and seen["heldout/loss"] == pytest.approx(scored, rel=1e-6)


def test_the_option_is_documented_in_the_command_line(capsys):
    with pytest.raises(SystemExit):
        main(["backbone", "--help"])
    assert "--tensorboard DIR" in capsys.readouterr().out
