"""A researcher edits a project a backbone serves from its folder, with no restart: a new
folder is offered, an edit is served and its peers are sent to join again, and an edit
that changes the model of a collaboration holding a state is refused with its reason and
the way to start over, then and after a restart."""

import json
import logging

import aiohttp
import pytest

from engine.backbone import project_watch
from engine.wire import WIRE_VERSION
from tests.collab.harness import running_backbone
from tests.conftest import until

pytestmark = pytest.mark.timeout(120)


def write(folder, project_id="edits", layers=2, description="first"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "project.json").write_text(json.dumps({
        "id": project_id, "title": "Edits", "task": "demo-lm", "description": description,
        "task_params": {"layers": layers, "d_model": 32, "heads": 2, "ff": 64, "micro_batch": 4}}))


async def join(http, url, project="edits"):
    body = {"name": "x", "wire": WIRE_VERSION}
    async with http.post(f"{url}/api/projects/{project}/peers", json=body) as resp:
        return resp.status, await resp.json() if resp.status == 201 else await resp.text()


async def served(http, url, project="edits"):
    async with http.get(f"{url}/api/projects/{project}") as resp:
        return resp.status, await resp.json() if resp.status == 200 else await resp.text()


async def test_edits_are_served_without_a_restart_and_a_changed_model_is_refused(tmp_path, monkeypatch,
                                                                                 caplog):
    monkeypatch.setattr(project_watch, "WATCH_INTERVAL", 0.05)
    caplog.set_level(logging.INFO, logger="engine.backbone.project_watch")
    projects = tmp_path / "projects"
    write(projects / "edits")
    async with running_backbone(tmp_path / "bb", projects_dir=projects) as backbone, \
            aiohttp.ClientSession() as http:
        url = backbone.url
        _, joined = await join(http, url)
        socket = f"{url}/api/projects/edits/peers/{joined['peer_id']}/ws"
        headers = {"X-Cotrain-Peer-Token": joined["token"]}
        ws = await http.ws_connect(socket, headers=headers)
        backbone.store.rounds.set_collaboration("edits", 5, "ab" * 32)  # (a state, five steps in)

        # Not the model: served at once; the peer of the old version is sent to join again.
        write(projects / "edits", description="second")
        msg = await ws.receive(timeout=10)
        while msg.type == aiohttp.WSMsgType.TEXT:
            msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.CLOSE and "the project changed; join again" in msg.extra
        assert (await served(http, url))[1]["description"] == "second"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(socket, headers=headers)
        assert refused.value.status == 410  # (Gone: that peer joined the version before)
        status, rejoined = await join(http, url)
        assert status == 201 and rejoined["project"]["description"] == "second"
        again = await http.ws_connect(f"{url}/api/projects/edits/peers/{rejoined['peer_id']}/ws",
                                      headers={"X-Cotrain-Peer-Token": rejoined["token"]})
        assert not again.closed

        # The model: refused, saying what changed and how to start over; the last version stays.
        write(projects / "edits", layers=3, description="third")
        await until(lambda: "changes the model" in caplog.text, 10, "the refusal in the log")
        assert "collaboration at step 5 (task_params.layers: 2 -> 3)" in caplog.text
        assert 'give the project a new id ("id" in project.json)' in caplog.text
        assert (await served(http, url))[1]["description"] == "second"
        assert (await join(http, url))[1]["project"]["task_params"]["layers"] == 2

        # A new folder is offered.
        write(projects / "more", project_id="more")
        await until(lambda: "offering more" in caplog.text, 10, "the new project")
        assert (await served(http, url, "more"))[0] == 200
        await again.close()

    # After a restart, the changed model is not served, and a volunteer is told why.
    caplog.clear()
    async with running_backbone(tmp_path / "bb", projects_dir=projects) as backbone, \
            aiohttp.ClientSession() as http:
        status, why = await join(http, backbone.url)
        assert status == 409 and "changes the model of a collaboration at step 5" in why
        assert (await served(http, backbone.url))[0] == 409
        # Starting over under a new id: offered, from step 0.
        write(projects / "edits", project_id="edits-2", layers=3)
        await until(lambda: "offering edits-2" in caplog.text, 10, "the project under its new id")
        status, joined = await join(http, backbone.url, "edits-2")
        assert status == 201 and joined["project"]["task_params"]["layers"] == 3
        assert (await served(http, backbone.url, "edits-2"))[1]["epoch"] == 0
        assert (await served(http, backbone.url))[0] == 404
