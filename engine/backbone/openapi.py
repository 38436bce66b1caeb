"""The backbone's HTTP API as an OpenAPI 3.1 description, served at /api/openapi.json."""

from __future__ import annotations

from engine import __version__


def _json(schema: dict, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


ERROR = _json(_ref("Error"), "The request was refused; 'error' says why")
PROJECT_PARAM = {"name": "project", "in": "path", "required": True, "schema": {"type": "string"}}
EPOCH_PARAM = {"name": "epoch", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}}
BEARER = [{"bearer": []}]
PEER = [{"peerToken": [], "peerId": []}]


def spec() -> dict:
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
            "schemas": {
                "Error": {"type": "object", "required": ["error"],
                          "properties": {"error": {"type": "string"}}},
                "Credentials": {"type": "object", "required": ["username", "password"],
                                "properties": {"username": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{3,32}$"},
                                               "password": {"type": "string", "minLength": 8, "maxLength": 1024}}},
                "Token": {"type": "object", "properties": {"username": {"type": "string"},
                                                           "token": {"type": "string"}}},
                "Project": {"type": "object", "description": "A project with its live progress",
                            "properties": {"id": {"type": "string"}, "title": {"type": "string"},
                                           "description": {"type": "string"}, "task": {"type": "string"},
                                           "task_params": {"type": "object"},
                                           "target_batch_size": {"type": "integer"},
                                           "epoch": {"type": "integer"}, "peers": {"type": "integer"},
                                           "samples": {"type": "integer"},
                                           "samples_per_second": {"type": "number"},
                                           "eta_seconds": {"type": ["number", "null"]}}},
                "Leaderboard": {"type": "object", "properties": {
                    "total_samples": {"type": "integer"},
                    "entries": {"type": "array", "items": {"type": "object", "properties": {
                        "rank": {"type": "integer"}, "username": {"type": "string"},
                        "samples": {"type": "integer"}, "share": {"type": "number"},
                        "compute_seconds": {"type": "number"},
                        "last_seen": {"type": ["string", "null"], "format": "date-time"},
                        "online": {"type": "boolean"}}}}}},
                "Me": {"type": "object", "properties": {
                    "username": {"type": "string"},
                    "projects": {"type": "array", "items": {"type": "object", "properties": {
                        "project": {"type": "string"}, "samples": {"type": "integer"},
                        "compute_seconds": {"type": "number"}, "online_seconds": {"type": "number"},
                        "rank": {"type": ["integer", "null"]}, "online": {"type": "boolean"}}}},
                    "timeline": {"type": "array", "description": "Credited samples per project and hour",
                                 "items": {"type": "object", "properties": {
                                     "project": {"type": "string"}, "hour": {"type": "integer"},
                                     "samples": {"type": "integer"},
                                     "compute_seconds": {"type": "number"}}}}}},
                "Curve": {"type": "object", "properties": {"epochs": {"type": "array", "items": {
                    "type": "object", "properties": {"epoch": {"type": "integer"},
                                                     "loss": {"type": ["number", "null"]},
                                                     "samples": {"type": "integer"},
                                                     "peers": {"type": "integer"},
                                                     "round_seconds": {"type": "number"}}}}}},
            },
        },
        "paths": {
            "/api/health": {"get": {"summary": "Liveness and versions", "responses": {"200": _json({"type": "object"})}}},
            "/api/openapi.json": {"get": {"summary": "This description", "responses": {"200": _json({"type": "object"})}}},
            "/api/accounts": {"post": {
                "summary": "Create an account and log in",
                "requestBody": {"content": {"application/json": {"schema": _ref("Credentials")}}},
                "responses": {"201": _json(_ref("Token"), "Created"), "400": ERROR,
                              "409": _json(_ref("Error"), "Username taken")}}},
            "/api/sessions": {
                "post": {"summary": "Log in: a new token",
                         "requestBody": {"content": {"application/json": {"schema": _ref("Credentials")}}},
                         "responses": {"200": _json(_ref("Token")), "400": ERROR,
                                       "401": _json(_ref("Error"), "Wrong username or password"),
                                       "429": _json(_ref("Error"), "Too many failed attempts")}},
                "delete": {"summary": "Log out: revoke the presented token", "security": BEARER,
                           "responses": {"200": _json({"type": "object"}), "401": ERROR}}},
            "/api/me": {"get": {"summary": "My totals per project and contribution per hour",
                                "security": BEARER, "responses": {"200": _json(_ref("Me")), "401": ERROR}}},
            "/api/projects": {"get": {"summary": "The catalog with live progress",
                                      "responses": {"200": _json({"type": "object", "properties": {
                                          "projects": {"type": "array", "items": _ref("Project")}}})}}},
            "/api/projects/{project}": {"get": {"summary": "One project", "parameters": [PROJECT_PARAM],
                                                "responses": {"200": _json(_ref("Project")), "404": ERROR}}},
            "/api/projects/{project}/peers": {"post": {
                "summary": "Join as a peer: peer id, peer token, project and ICE servers",
                "parameters": [PROJECT_PARAM], "security": [{"bearer": []}, {}],
                "responses": {"201": _json({"type": "object"}), "400": ERROR, "401": ERROR, "404": ERROR}}},
            "/api/projects/{project}/peers/{peer}/ws": {"get": {
                "summary": "The peer's control WebSocket (see engine/ARCHITECTURE.md)",
                "parameters": [PROJECT_PARAM, {"name": "peer", "in": "path", "required": True,
                                               "schema": {"type": "string"}}],
                "responses": {"101": {"description": "Switching protocols"}, "401": ERROR, "409": ERROR}}},
            "/api/projects/{project}/curve": {"get": {"summary": "Loss per epoch", "parameters": [PROJECT_PARAM],
                                                      "responses": {"200": _json(_ref("Curve")), "404": ERROR}}},
            "/api/projects/{project}/leaderboard": {"get": {
                "summary": "Credited samples per user, best first",
                "parameters": [PROJECT_PARAM,
                               {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                               {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}}],
                "responses": {"200": _json(_ref("Leaderboard")), "400": ERROR, "404": ERROR}}},
            "/api/projects/{project}/checkpoints": {"get": {"summary": "Stored checkpoints",
                                                            "parameters": [PROJECT_PARAM],
                                                            "responses": {"200": _json({"type": "object"})}}},
            "/api/projects/{project}/checkpoints/{epoch}": {
                "get": {"summary": "Download a checkpoint (peers)", "security": PEER,
                        "parameters": [PROJECT_PARAM, EPOCH_PARAM],
                        "responses": {"200": {"description": "The state file"}, "401": ERROR, "404": ERROR}},
                "put": {"summary": "Upload a requested checkpoint (peers)", "security": PEER,
                        "parameters": [PROJECT_PARAM, EPOCH_PARAM],
                        "responses": {"201": _json({"type": "object"}), "400": ERROR, "401": ERROR,
                                      "409": ERROR, "413": ERROR}}},
        },
    }
