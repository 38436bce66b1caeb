"""README's "Start your own project", run exactly as written: from a folder of text files to
a backbone serving the project, two volunteers' peers training the preset as written for 25
steps (one state at every step, held-out scores on the curve, an edit of the project served
as it runs), and the model exported for transformers. A model hub stand-in sees every
request that any of them (and `cotrain project check`) would make to a hub: none."""

import asyncio
import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path
from pydoc_data.topics import topics

import pytest
import torch
from transformers import AlbertForPreTraining, AutoConfig, AutoTokenizer

from engine.training.state import tensors_of
from engine.wire.tensors import MODEL_PREFIX, decode_file
from tests.collab.processes import spawn_peer, terminate
from tests.hub_standin import hub_standin

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "README.md"
STEPS = 25
EDITED_AT = 6


def readme_commands(name: str = "own-project") -> list[str]:
    block = re.search(rf"<!-- {name} -->\n```\n(.*?)```\n<!-- /{name} -->", README.read_text(), re.S)
    assert block, f"README.md has no {name} block"
    return [line for line in block.group(1).splitlines() if line.strip()]


async def run(command: str, cwd: Path, env: dict) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(*shlex.split(command), cwd=cwd, env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)


@pytest.mark.timeout(900)
async def test_the_readme_commands_take_a_folder_of_texts_to_a_running_collaboration(tmp_path, report_figure):
    with hub_standin() as hub:
        await readme_collaboration(tmp_path, hub.env(), report_figure)
    assert hub.requests == [], "a Cotrain process asked a model hub for something"


async def readme_collaboration(tmp_path: Path, hub_env: dict, report_figure) -> None:
    commands = readme_commands()
    assert len(commands) == 3
    texts = tmp_path / "my-texts"
    texts.mkdir()
    for name in sorted(topics)[:60]:
        (texts / f"{name}.txt").write_text(topics[name])
    env = {**os.environ, **hub_env, "COTRAIN_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in [*commands[:2], "cotrain project check projects/my-project"]:
        done = await run(command, tmp_path, env)
        out, _ = await asyncio.wait_for(done.communicate(), 120)
        assert done.returncode == 0, (command, out.decode())
    project = tmp_path / "projects/my-project"
    assert (project / "tokenizer.json").is_file()

    backbone = await run(commands[2], tmp_path, env)
    peers = []
    try:
        assert backbone.stdout is not None
        url = None
        while url is None:  # (after the projects it offers)
            line = await asyncio.wait_for(backbone.stdout.readline(), 60)
            assert line, "the backbone stopped"
            url = re.search(rb"backbone listening on (\S+)", line)
        # Two volunteers for 25 steps of the preset as written: its checkpoints (every 10 steps)
        # meet its held-out scoring (every 10) twice, which once stopped both peers.
        saves = ["--save-state", str(tmp_path / "my-model.state")]
        for name, saving in (("volunteer", saves), ("second", [])):
            peers.append(await spawn_peer(url.group(1).decode(), "my-project", name, tmp_path,
                                          "--max-epochs", str(STEPS), *saving,
                                          env={**hub_env, "COTRAIN_HOME": str(tmp_path / name)}))
        # The researcher edits the project as it runs: the backbone serves the edit with no
        # restart, and the volunteers join its new version from the state they hold (no
        # checkpoint exists yet to go back to).
        await asyncio.gather(*(p.reached(EDITED_AT, timeout=300) for p in peers))
        edited = json.loads((project / "project.json").read_text())
        edited["description"] = "Edited while it trains."
        (project / "project.json").write_text(json.dumps(edited, indent=2))
        await asyncio.gather(*(p.reached(STEPS, timeout=600) for p in peers))
        await asyncio.gather(*(asyncio.wait_for(p.process.wait(), 60) for p in peers))
        curve = await run(f"cotrain project curve {url.group(1).decode()} my-project", tmp_path, env)
        shown, _ = await asyncio.wait_for(curve.communicate(), 60)
    finally:
        await terminate(*peers)
        backbone.terminate()
        await asyncio.wait_for(backbone.wait(), 30)
    peer = peers[0]
    assert [p.process.returncode for p in peers] == [0, 0], "a volunteer stopped before its last step"
    assert all(line["loss"] > 0 for p in peers for line in p.epochs)
    for p in peers:  # (each peer went on from where it was: no step taken twice)
        steps = [line["epoch"] for line in p.epochs]
        assert steps == sorted(set(steps)), steps
        assert "before the project changed" in (tmp_path / f"{p.name}.log").read_text()
        assert any((tmp_path / p.name / "shards").iterdir())  # (the shards it drew, in its own cache)
    # One state at every step, and the model learns.
    hashes: dict[int, set[str]] = {}
    for p in peers:
        for line in p.epochs:
            hashes.setdefault(line["epoch"], set()).add(line["state_sha256"])
    assert all(len(found) == 1 for found in hashes.values()), hashes
    losses = [line["loss"] for line in peer.epochs]
    first, last = statistics.mean(losses[:3]), statistics.mean(losses[-3:])
    report_figure(f"albert-mini preset, 2 peers: loss {first:.2f} over the first 3 steps, {last:.2f} "
                  f"over the last 3 of {STEPS}")
    assert last < first - 0.5
    assert max(line["peers"] for line in peer.epochs) == 2
    # The researcher sees the held-out loss at two steps at least, in the terminal.
    assert curve.returncode == 0, shown.decode()
    scored = re.findall(r"^\s*(\d+)\s+\S+\s+(\d+\.\d+)\s", shown.decode(), re.M)
    assert len(scored) >= 2, shown.decode()
    # Its operator sees each step without -v.
    said = (await asyncio.wait_for(backbone.stdout.read(), 30)).decode()
    assert re.search(r"my-project: step 2, \d+ samples from [12] peers?, loss \d", said), said[-3000:]
    assert "my-project: serving its edited" in said, said[-3000:]
    # The volunteer keeps the model it trained: the state of its last step, whole.
    saved = decode_file((tmp_path / "my-model.state").read_bytes())
    last = peer.epochs[-1]
    assert (saved.index.meta.epoch, saved.state_sha256()) == (last["epoch"], last["state_sha256"])
    await export_and_load(tmp_path, env, saved)


async def export_and_load(tmp_path: Path, env: dict, saved) -> None:
    """The README's export, then transformers loads the folder as any model of its own."""
    (export,) = readme_commands("own-project-export")
    done = await run(export.replace("--out", "--state my-model.state --out"), tmp_path, env)
    out, _ = await asyncio.wait_for(done.communicate(), 120)
    assert done.returncode == 0, out.decode()
    folder = tmp_path / "my-model"
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["AlbertForPreTraining"]  # the preset's masked LM and sentence order
    model, loading = AlbertForPreTraining.from_pretrained(folder, output_loading_info=True)
    assert not any(loading.values()), loading  # no missing, unexpected or mismatched weights
    trained = tensors_of(saved)
    for name, value in model.state_dict().items():
        assert torch.equal(value, trained[f"{MODEL_PREFIX}{name}"]), name
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (tokenizer.pad_token, tokenizer.mask_token) == ("[PAD]", "[MASK]")
    assert tokenizer.pad_token_id == model.config.pad_token_id and len(tokenizer) == model.config.vocab_size
    ids = tokenizer("The for statement")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id and len(ids) > 2
    assert json.loads((folder / "cotrain_state.json").read_text())["state_sha256"] == saved.state_sha256()
