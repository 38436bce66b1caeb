"""A model hub stand-in on loopback: it answers nothing useful and remembers every request, so
a test can show that a Cotrain process asked a hub for nothing (``HF_ENDPOINT`` points there)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HubStandIn:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self.requests: list[str] = []

    def env(self) -> dict[str, str]:
        """A process environment that sends hub traffic here and asks for it: hub kernels on,
        offline mode off (Cotrain must turn both off itself)."""
        return {"HF_ENDPOINT": self.url, "USE_HUB_KERNELS": "YES", "HF_HUB_OFFLINE": "0",
                "TRANSFORMERS_OFFLINE": "0"}


@contextlib.contextmanager
def hub_standin() -> Iterator[HubStandIn]:
    standin: HubStandIn

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            standin.requests.append(f"{self.command} {self.path}")
            self.send_error(404)

        do_GET = do_HEAD = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    standin = HubStandIn(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
