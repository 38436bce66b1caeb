"""README's "Start your own project", run exactly as written: from a folder of text files to
a backbone serving the project, and a volunteer's peer training on it. A model hub stand-in
sees every request that any of them (and `cotrain project check`) would make to a hub: none."""

import asyncio
import json
import os
import re
import shlex
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


def readme_commands(name: str = "own-project") -> list[str]:
    block = re.search(rf"<!-- {name} -->\n```\n(.*?)```\n<!-- /{name} -->", README.read_text(), re.S)
    assert block, f"README.md has no {name} block"
    return [line for line in block.group(1).splitlines() if line.strip()]


async def run(command: str, cwd: Path, env: dict) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(*shlex.split(command), cwd=cwd, env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)


async def test_the_readme_commands_take_a_folder_of_texts_to_a_running_collaboration(tmp_path):
    with hub_standin() as hub:
        await readme_collaboration(tmp_path, hub.env())
    assert hub.requests == [], "a Cotrain process asked a model hub for something"


async def readme_collaboration(tmp_path: Path, hub_env: dict) -> None:
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
    assert (tmp_path / "projects/my-project/tokenizer.json").is_file()

    backbone = await run(commands[2], tmp_path, env)
    peer = None
    try:
        assert backbone.stdout is not None
        line = await asyncio.wait_for(backbone.stdout.readline(), 60)
        url = re.search(rb"backbone listening on (\S+)", line)
        assert url, line
        peer = await spawn_peer(url.group(1).decode(), "my-project", "volunteer", tmp_path,
                                "--max-epochs", "2", "--save-state", str(tmp_path / "my-model.state"),
                                env={**hub_env, "COTRAIN_HOME": str(tmp_path / "volunteer")})
        await peer.reached(2, timeout=240)
    finally:
        if peer is not None:
            await terminate(peer)
        backbone.terminate()
        await asyncio.wait_for(backbone.wait(), 30)
    assert all(line["peers"] == 1 and line["loss"] > 0 for line in peer.epochs)
    # Its operator sees each step without -v.
    said = (await asyncio.wait_for(backbone.stdout.read(), 30)).decode()
    assert re.search(r"my-project: step 2, \d+ samples from 1 peer, loss \d", said), said[-3000:]
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
