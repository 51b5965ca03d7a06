"""The local web server of ``hyperreg view``: a token-protected page over a :class:`ViewSession`.

:func:`make_server` builds a :class:`ViewServer` (standard library
``http.server.ThreadingHTTPServer``) bound to 127.0.0.1 unless told otherwise; every request
must carry the server's random token (``?token=…``, as Jupyter does) or it is refused with 403.
It answers a fixed set of routes only, never a path of the disk: the page (``/``), its two
static files (:func:`hyperreg.apps.view_page.static_file`, bundled with the package), and the
pair's derived data under ``/api/`` (JSON numbers and NIfTI volumes built in memory).
Registrations run in the request's thread behind the session's lock (one at a time); the page
waits for the answer. Must not import cli.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hyperreg.apps.view import Superseded, ViewSession
from hyperreg.apps.view_page import page_html, static_file

__all__ = ["LOOPBACK", "ViewServer", "make_server"]

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

_STATIC = {
    "niivue.umd.js": "application/javascript; charset=utf-8",
    "view.js": "application/javascript; charset=utf-8",
}
"""The only files served besides the page, by name (bundled in ``hyperreg/apps/view_static``)."""


class ViewServer(ThreadingHTTPServer):
    """An HTTP server for one :class:`~hyperreg.apps.view.ViewSession`.

    Attributes:
        session: The session it serves.
        token: The secret every request must carry.
        url: The page's address with the token (``http://host:port/?token=…``).
    """

    daemon_threads = True

    def __init__(self, session: ViewSession, host: str, port: int, token: str) -> None:
        super().__init__((host, port), _Handler)
        self.session = session
        self.token = token
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.server_address[1]}/?token={token}"

    def serve_in_thread(self) -> threading.Thread:
        """Serve in a daemon thread (for tests and notebooks); :meth:`shutdown` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="hyperreg-view-http")
        thread.daemon = True
        thread.start()
        return thread

    def close(self) -> None:
        """Stop serving (when serving), stop the session's background sweep, close the
        socket."""
        self.session.stop()
        self.server_close()


def make_server(
    session: ViewSession, host: str = LOOPBACK, port: int = 0, token: str | None = None
) -> ViewServer:
    """A :class:`ViewServer` for ``session`` on ``host:port`` (port 0: a free one).

    Args:
        session: The pair to serve.
        host: Address to bind; 127.0.0.1 (default) keeps the page on this machine.
        port: TCP port, 0 for any free port.
        token: The secret; None: 32 random URL-safe characters (``secrets``).

    Raises:
        OSError: If the address cannot be bound (port in use).
    """
    return ViewServer(session, host, port, token or secrets.token_urlsafe(24))


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        split = urlsplit(self.path)
        query = parse_qs(split.query)
        token = query.get("token", [""])[0]
        if not hmac.compare_digest(token.encode(), self.server.token.encode()):
            self._send(HTTPStatus.FORBIDDEN, b"403: missing or wrong token\n", "text/plain")
            return
        route = split.path
        try:
            self._route(method, route, query)
        except (ValueError, KeyError) as err:
            self._json({"error": str(err)}, HTTPStatus.BAD_REQUEST)
        except Superseded as err:  # the page asked for a newer λ meanwhile
            self._json({"error": str(err)}, HTTPStatus.CONFLICT)
        except Exception as err:  # the page shows the error; the server keeps running
            logger.exception("%s %s failed", method, route)
            self._json({"error": f"{type(err).__name__}: {err}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _route(self, method: str, route: str, query: dict[str, list[str]]) -> None:
        session = self.server.session

        def arg(name: str, default: str | None = None) -> str | None:
            return query.get(name, [default])[0]

        refined = arg("refined", "0") == "1"
        preview = arg("preview", "0") == "1"
        if method == "GET" and route == "/":
            token = self.server.token
            # the page script first (it asks for the first λ at once), NiiVue deferred
            head = (
                f'<script src="/static/view.js?token={token}"></script>'
                f'<script defer src="/static/niivue.umd.js?token={token}"></script>'
            )
            self._send(HTTPStatus.OK, page_html(head, "").encode(), "text/html; charset=utf-8")
        elif method == "GET" and route.startswith("/static/") and route[8:] in _STATIC:
            cache = "private, max-age=86400"  # bundled: the same for the server's lifetime
            self._send(HTTPStatus.OK, static_file(route[8:]), _STATIC[route[8:]], cache)
        elif method == "GET" and route == "/api/info":
            self._json(session.info())
        elif method == "GET" and route == "/api/result":
            self._json(session.page_result(_lam(arg("lam")), refined, preview))
        elif method == "GET" and route == "/api/curves":
            self._json(session.curves())
        elif method == "GET" and route == "/api/volume":
            lam = arg("lam")
            data = session.volume(arg("kind") or "", lam, refined, preview)
            self._send(HTTPStatus.OK, data, "application/octet-stream")
        elif method == "POST" and route == "/api/refine":
            self._json(session.page_result(_lam(arg("lam")), True))
        elif method == "POST" and route == "/api/save":
            paths = session.save(_lam(arg("lam")), refined)
            self._json({"files": [str(p) for p in paths]})
        else:
            self._send(HTTPStatus.NOT_FOUND, b"404: not found\n", "text/plain")

    def _json(self, value: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def _send(
        self, status: HTTPStatus, body: bytes, content_type: str, cache: str = "no-store"
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)


def _lam(text: str | None) -> str:
    """The ``lam`` parameter as sent (the session checks it: a number in [0, 1])."""
    if text is None:
        raise ValueError("the request needs lam=<λ in [0, 1]>")
    return text
