"""/api/openapi.json, generated from the route table (api.py) and the Structs of
engine/wire/rest.py, so that what is published is what is served."""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import msgspec

from engine import __version__

if TYPE_CHECKING:
    from engine.backbone.routes import Route

REF = "#/components/schemas/{name}"
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "project": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$"},
    "peer": {"type": "string", "maxLength": 64},
    "epoch": {"type": "integer", "minimum": 0},
    "session": {"type": "integer", "minimum": 1, "description": "the id of one of my log-ins"},
    "path": {"type": "string", "maxLength": 1024, "description": "a file's path in the project's manifest"},
}
SECURITY: dict[str, list[dict[str, list[str]]]] = {
    "user": [{"bearer": []}],
    "optional user": [{"bearer": []}, {}],
    "peer": [{"peerId": [], "peerToken": []}],
}


@dataclass(frozen=True)
class RawBody:
    """A body or answer that is not one of the JSON Structs."""

    media_type: str
    description: str


def published_path(path: str) -> str:
    """A route's path as OpenAPI writes it: ``{path:.+}`` (aiohttp's, matching slashes too) is ``{path}``."""
    return re.sub(r"{(\w+):[^}]*}", r"{\1}", path)


def spec(routes: tuple[Route, ...]) -> dict[str, Any]:
    structs = sorted({t for r in routes for t in [*r.replies.values(), r.body] if isinstance(t, type)},
                     key=lambda t: t.__name__)
    schemas, components = msgspec.json.schema_components(structs, ref_template=REF)
    ref = dict(zip(structs, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(published_path(route.path), {})[route.method.lower()] = _operation(route, ref)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Cotrain backbone", "version": __version__,
                 "description": "Accounts, projects, the peers' control socket, learning curves, "
                                "checkpoints and the contribution ledger of a Cotrain collaboration."},
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "peerToken": {"type": "apiKey", "in": "header", "name": "X-Cotrain-Peer-Token"},
                "peerId": {"type": "apiKey", "in": "header", "name": "X-Cotrain-Peer-Id"},
            },
            "schemas": components,
        },
        "paths": paths,
    }


def _operation(route: Route, ref: dict[type, dict]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.handler.__name__,
        "summary": route.summary,
        "responses": {str(status): _response(status, answer, ref)
                      for status, answer in route.replies.items()},
    }
    parameters = [{"name": name, "in": "path", "required": True, "schema": PATH_PARAMETERS[name]}
                  for name in re.findall(r"{(\w+)}", published_path(route.path))]
    parameters += [{"name": q.name, "in": "query", "required": False, "description": q.description,
                    "schema": q.schema()} for q in route.query]
    if parameters:
        operation["parameters"] = parameters
    if route.auth.value in SECURITY:
        operation["security"] = SECURITY[route.auth.value]
    if isinstance(route.body, type):
        operation["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": ref[route.body]}}}
    elif isinstance(route.body, RawBody):
        operation["requestBody"] = {"required": True, "description": route.body.description,
                                    "content": {route.body.media_type: {}}}
    return operation


def _response(status: int, answer: type | RawBody | str, ref: dict[type, dict]) -> dict[str, Any]:
    if isinstance(answer, type):
        doc = (answer.__doc__ or "").strip().split("\n")[0]
        return {"description": doc or HTTPStatus(status).phrase,
                "content": {"application/json": {"schema": ref[answer]}}}
    if isinstance(answer, RawBody):
        return {"description": answer.description, "content": {answer.media_type: {}}}
    return {"description": answer}
