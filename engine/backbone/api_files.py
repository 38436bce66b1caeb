"""A project's files (its shards, held-out set and tokenizer), for the peers that may join it.

Only what the project's manifest names is served, from its folder; aiohttp answers Range
requests, so an interrupted download resumes where it stopped. How many transfers one
address runs at once is bounded by its connections (engine/backbone/connections.py).
"""

from __future__ import annotations

from aiohttp import web

from engine.backbone.api_projects import member_of
from engine.backbone.http import backbone_of, project_of

# Shards are named by content in the manifest (its sha256): a cache may keep them a day.
CACHE_CONTROL = "private, max-age=86400"


async def project_file(request: web.Request) -> web.StreamResponse:
    spec = project_of(request)
    member_of(request, spec)
    folder = backbone_of(request).folders.get(spec.id)
    place = request.match_info["path"]
    if folder is None or place not in folder.local_files():
        raise web.HTTPNotFound(text=f"project {spec.id!r} has no file {place!r}")
    return web.FileResponse(folder.root / place, headers={"Cache-Control": CACHE_CONTROL})
