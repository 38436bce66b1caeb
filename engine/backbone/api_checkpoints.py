"""Checkpoints: listed for anyone, downloaded by connected peers a few times a minute (per
peer and per address group: a checkpoint may be a gigabyte, and peer ids are cheap where
connections are not), uploaded only when requested."""

from __future__ import annotations

import re

from aiohttp import web

from engine.backbone.checkpoints import CheckpointRejected
from engine.backbone.http import (
    authenticate_peer,
    backbone_of,
    client_group,
    json_error,
    json_reply,
    project_of,
)
from engine.backbone.store.checkpoint_records import checkpoint_url
from engine.wire.control import CheckpointInfo
from engine.wire.rest import CONTENT_SHA256_HEADER, PEER_ID_HEADER, STATE_SHA256_HEADER, CheckpointList

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _epoch(request: web.Request) -> int:
    text = request.match_info["epoch"]
    if not text.isdigit() or len(text) > 12:
        raise web.HTTPBadRequest(text="epoch must be a non-negative integer")
    return int(text)


async def list_checkpoints(request: web.Request) -> web.Response:
    spec = project_of(request)
    saved = backbone_of(request).store.checkpoints.listed(spec.id)
    return json_reply(CheckpointList(saved))


async def get_checkpoint(request: web.Request) -> web.StreamResponse:
    spec = project_of(request)
    backbone = backbone_of(request)
    peer_id = request.headers.get(PEER_ID_HEADER, "")
    authenticate_peer(request, spec, peer_id)
    epoch = _epoch(request)
    if peer_id not in backbone.sessions:
        return json_error(409, "download checkpoints while connected to the project")
    wait = backbone.throttle.checkpoint_download(peer_id, client_group(request))
    if wait:
        return json_error(429, f"too many checkpoint downloads; try again in {wait:.0f} s",
                          {"Retry-After": str(int(wait) + 1)})
    for info in backbone.store.checkpoints.listed(spec.id):
        if info.epoch == epoch:
            path = backbone.files.path(info.sha256)
            if not path.is_file():  # (a shared folder this process does not see whole)
                return json_error(503, f"the checkpoint of epoch {epoch} is recorded but its file "
                                       f"is not in this backbone's checkpoint folder")
            return web.FileResponse(path, headers={CONTENT_SHA256_HEADER: info.sha256})
    raise web.HTTPNotFound(text=f"no checkpoint of epoch {epoch}")


async def put_checkpoint(request: web.Request) -> web.Response:
    spec = project_of(request)
    backbone = backbone_of(request)
    peer_id = request.headers.get(PEER_ID_HEADER, "")
    authenticate_peer(request, spec, peer_id)
    epoch = _epoch(request)
    if not backbone.trackers[spec.id].expects_checkpoint(peer_id, epoch):
        raise web.HTTPConflict(text=f"no checkpoint of epoch {epoch} was requested from you")
    sha = request.headers.get(CONTENT_SHA256_HEADER, "")
    state_sha = request.headers.get(STATE_SHA256_HEADER, "")
    if not SHA256.match(sha) or not SHA256.match(state_sha):
        raise web.HTTPBadRequest(text=f"{CONTENT_SHA256_HEADER} and {STATE_SHA256_HEADER} must be sha256 "
                                      "hex digests")
    tracker = backbone.trackers[spec.id]
    if epoch > tracker.epoch:  # (its step still to settle: no failure of the chore)
        raise web.HTTPConflict(text=f"epoch {epoch} is not settled yet: upload once its step is",
                               headers={"Retry-After": "1"})
    if backbone.store.rounds.epoch_state(spec.id, epoch) != state_sha:
        tracker.checkpoint_upload(peer_id, epoch, started=False)  # (the chore goes to another)
        raise web.HTTPConflict(text="state hash is not the collaboration's at that epoch")
    limit = backbone.config.max_checkpoint_bytes
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length,
                                            text=f"checkpoint larger than {limit} bytes")
    if not tracker.checkpoint_upload(peer_id, epoch, started=True):
        raise web.HTTPConflict(text=f"your upload of the checkpoint of epoch {epoch} is under way")
    stored = False
    try:
        _, digest, size = await backbone.files.receive(
            epoch, request.content.iter_chunked(1 << 16), expected_sha256=sha,
            expected_state_sha256=state_sha, max_bytes=limit,
        )
        info = CheckpointInfo(epoch, digest, state_sha, size, checkpoint_url(spec.id, epoch))
        stored = await backbone.checkpoint_stored(spec.id, peer_id, info)
    except CheckpointRejected as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    finally:
        if not stored:  # (broken off, refused, or removed as it was stored)
            tracker.checkpoint_upload(peer_id, epoch, started=False)
    if not stored:
        raise web.HTTPServiceUnavailable(text="the checkpoint was removed as it was stored",
                                         headers={"Retry-After": "1"})
    return json_reply(info, status=201)
