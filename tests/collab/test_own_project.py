"""README's "Start your own project", run exactly as written: from a folder of text files to
a backbone serving the project, and a volunteer's peer training on it. A model hub stand-in
sees every request that any of them (and `cotrain project check`) would make to a hub: none."""

import asyncio
import os
import re
import shlex
import sys
from pathlib import Path
from pydoc_data.topics import topics

import pytest

from engine.wire.tensors import decode_file
from tests.collab.processes import spawn_peer, terminate
from tests.hub_standin import hub_standin

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[str]:
    block = re.search(r"<!-- own-project -->\n```\n(.*?)```\n<!-- /own-project -->", README.read_text(), re.S)
    assert block, "README.md has no own-project block"
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
    # The volunteer keeps the model it trained: the state of its last step, whole.
    saved = decode_file((tmp_path / "my-model.state").read_bytes())
    last = peer.epochs[-1]
    assert (saved.index.meta.epoch, saved.state_sha256()) == (last["epoch"], last["state_sha256"])
