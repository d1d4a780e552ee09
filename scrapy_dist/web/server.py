"""The HTTP server of ``scrapy-dist web``: the page, its assets and its JSON twins.

Standard library only (:class:`http.server.ThreadingHTTPServer` on a thread), assets
read from the package (``scrapy_dist/web/static``), so it runs offline.

Routes: ``GET /`` the page; ``GET /static/<name>`` its assets; ``GET /api/<view>`` one
view as JSON (``summary``, ``workers``, ``frontier``, ``redis``, ``dead``, ``history``,
``control``, ``config``); ``POST /api/control`` (pause, resume, drain with a reason),
``POST /api/dead/requeue`` (all, or some indexes), ``POST /api/dead/purge`` (with the
count confirmed).

Safety: read-only unless built with ``actions``. An action needs the action token in
the ``X-Scrapy-Dist-Token`` header (the page takes it from the URL's fragment, which
browsers never send), and, with basic auth, the credentials too; it must be a JSON
``POST`` whose ``Origin``, when sent, is the page's own; every request must name this
loopback server in ``Host`` (a DNS-rebinding page names its own). Custom headers and JSON bodies
cannot be sent cross-site without a CORS preflight, which this server never grants.
:func:`check_bind` refuses actions on a non-loopback address without basic auth.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import redis

from scrapy_dist import deadletter
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.status import json_default

if TYPE_CHECKING:
    from scrapy_dist.web.views import Dashboard

logger = logging.getLogger(__name__)

#: The header that carries the action token.
TOKEN_HEADER = "X-Scrapy-Dist-Token"
#: The assets served under ``/static/`` (nothing else is read from the package).
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "index.html": "text/html; charset=utf-8",
}
#: Largest request body read (an action's JSON).
BODY_MAX = 64 * 1024
#: Sent with every answer: no framing, no sniffing, scripts and styles from here only.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, actions: bool, auth: str | None) -> None:
    """Refuse to serve actions on an address other machines can reach without basic
    auth.

    Raises:
        ConfigurationError: actions on a non-loopback ``host`` and no ``auth``.
    """
    if actions and auth is None and not is_loopback(host):
        raise ConfigurationError(
            f"--actions on {host}, an address other machines can reach, needs --auth "
            "USER:PASSWORD (or SCRAPY_DIST_WEB_AUTH): bind 127.0.0.1, or add auth"
        )


class WebServer:
    """The dashboard's server, on a thread of its own.

    Args:
        dashboard: the crawl's views.
        host: the address to bind (``127.0.0.1`` by default in the command).
        port: the port (``0``: a free one, see :attr:`port`).
        actions: serve the actions (else every ``POST`` is refused).
        token: the action token.
        auth: ``USER:PASSWORD`` for basic auth on every request (``None``: none).
        refresh: seconds between the page's reads.
        by: who the page's control changes are recorded as.
    """

    def __init__(
        self,
        dashboard: Dashboard,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        actions: bool = False,
        token: str = "",
        auth: str | None = None,
        refresh: float = 1.0,
        by: str = "web",
    ) -> None:
        check_bind(host, actions=actions, auth=auth)
        if actions and not token:
            raise ConfigurationError("actions need a token")
        self.dashboard = dashboard
        self.actions = actions
        self.token = token
        self.auth = auth
        self.refresh = refresh
        self.by = by
        handler = type("Handler", (_Handler,), {"web": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host = host
        self.port = int(self.httpd.server_address[1])
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The page's address (without the token)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def hosts(self) -> set[str]:
        """The ``Host`` values this server answers."""
        names = {self.host, "localhost", "127.0.0.1", "[::1]"} if is_loopback(self.host) else set()
        names.add(f"[{self.host}]" if ":" in self.host else self.host)
        return {f"{name}:{self.port}" for name in names} | names

    def start(self) -> None:
        """Serve on a daemon thread."""
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    web: WebServer
    server_version = "scrapy-dist-web"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug(format, *args)

    # -- answers ---------------------------------------------------------------------

    def _send(
        self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, value: Any) -> None:
        body = json.dumps(value, default=json_default).encode()
        self._send(code, body, "application/json")

    def _error(self, code: int, message: str) -> None:
        self._json(code, {"error": message})

    # -- checks ----------------------------------------------------------------------

    def _host_ok(self) -> bool:
        """On a loopback address, the ``Host`` must name it (a DNS-rebinding page's
        names its own); elsewhere basic auth guards the actions."""
        if not is_loopback(self.web.host):
            return True
        return self.headers.get("Host", "") in self.web.hosts()

    def _auth_ok(self) -> bool:
        if self.web.auth is None:
            return True
        given = self.headers.get("Authorization", "")
        expected = "Basic " + base64.b64encode(self.web.auth.encode()).decode()
        return hmac.compare_digest(given.encode(), expected.encode())

    def _gate(self) -> bool:
        """Host and basic auth; answers and returns ``False`` when refused."""
        if not self._host_ok():
            self._error(HTTPStatus.MISDIRECTED_REQUEST, "unknown Host")
            return False
        if not self._auth_ok():
            self._send(
                HTTPStatus.UNAUTHORIZED,
                b'{"error": "authentication required"}',
                "application/json",
                {"WWW-Authenticate": 'Basic realm="scrapy-dist", charset="UTF-8"'},
            )
            return False
        return True

    # -- GET ---------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._gate():
            return None
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path in ("/", "/index.html"):
            return self._asset("index.html")
        if path.startswith("/static/"):
            return self._asset(path[len("/static/") :])
        if not path.startswith("/api/"):
            return self._error(HTTPStatus.NOT_FOUND, "no such page")
        view = path[len("/api/") :]
        try:
            value = self._view(view, query)
        except ValueError as e:
            return self._error(HTTPStatus.BAD_REQUEST, str(e))
        except (redis.RedisError, ConfigurationError) as e:
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"{type(e).__name__}: {e}")
        if value is None:
            return self._error(HTTPStatus.NOT_FOUND, f"no view {view!r}")
        self._json(HTTPStatus.OK, value)
        return None

    def _view(self, view: str, query: dict[str, str]) -> Any:
        d = self.web.dashboard
        offset, limit = int(query.get("offset", 0)), query.get("limit")
        if view == "summary":
            return d.summary()
        if view == "workers":
            return d.workers(offset, int(limit or 100))
        if view == "frontier":
            return d.frontier()
        if view == "redis":
            return d.server()
        if view == "dead":
            return d.dead(offset, int(limit or 50))
        if view == "history":
            return d.history(int(limit or 720))
        if view == "control":
            return d.control()
        if view == "config":
            return {
                "crawl": d.layout.keys.crawl,
                "actions": self.web.actions,
                "refresh": self.web.refresh,
                "token_header": TOKEN_HEADER,
            }
        return None

    def _asset(self, name: str) -> None:
        ctype = ASSETS.get(name)
        if ctype is None:
            return self._error(HTTPStatus.NOT_FOUND, "no such asset")
        body = files("scrapy_dist.web.static").joinpath(name).read_bytes()
        self._send(HTTPStatus.OK, body, ctype)
        return None

    # -- POST --------------------------------------------------------------------------

    def do_POST(self) -> None:
        if not self._gate():
            return None
        if not self.web.actions:
            return self._error(HTTPStatus.FORBIDDEN, "read-only: start with --actions")
        token = self.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(token.encode(), self.web.token.encode()):
            return self._error(HTTPStatus.FORBIDDEN, f"missing or wrong {TOKEN_HEADER}")
        origin = self.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != self.headers.get("Host"):
            return self._error(HTTPStatus.FORBIDDEN, "cross-origin request refused")
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            return self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send application/json")
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= BODY_MAX:
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object")
            value = self._action(urlsplit(self.path).path, body)
        except (ValueError, TypeError, ConfigurationError, deadletter.NoSuchRecord) as e:
            return self._error(HTTPStatus.BAD_REQUEST, str(e))
        except deadletter.ListContended as e:
            return self._error(HTTPStatus.CONFLICT, str(e))
        except redis.RedisError as e:
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"{type(e).__name__}: {e}")
        if value is None:
            return self._error(HTTPStatus.NOT_FOUND, "no such action")
        logger.info("web action %s: %s", self.path, value)
        self._json(HTTPStatus.OK, value)
        return None

    def _action(self, path: str, body: dict[str, Any]) -> Any:
        d = self.web.dashboard
        if path == "/api/control":
            state, reason = body.get("state"), body.get("reason", "")
            if not isinstance(state, str) or not isinstance(reason, str):
                raise ValueError("expected {'state': ..., 'reason': ...}")
            return d.set_control(state, reason, self.web.by)
        if path == "/api/dead/requeue":
            if body.get("all") is True:
                return d.requeue(None)
            indexes = body.get("indexes")
            if not isinstance(indexes, list) or not indexes:
                raise ValueError("expected {'all': true} or {'indexes': [...]}")
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in indexes):
                raise ValueError("indexes must be integers")
            return d.requeue(indexes)
        if path == "/api/dead/purge":
            expected = body.get("count")
            if not isinstance(expected, int) or isinstance(expected, bool):
                raise ValueError("expected {'count': N}, the count you confirmed")
            return d.purge(expected)
        return None
