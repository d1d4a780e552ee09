"""A fast local website with a deterministic link graph, for crawl tests and benchmarks.

Pages live at ``/page/<i>`` for ``i`` in ``0..pages-1``; :func:`links` gives each
page's outgoing links. :class:`TestSite` serves them from a background thread with a
small asyncio HTTP/1.1 server (keep-alive, pipelining) and counts the hits of every
page, so a test can check that each page was fetched exactly once. Run
``python -m scrapy_dist.testing.site --pages N`` to serve from a separate process;
``GET /__hits`` and ``GET /__reset`` then inspect and reset the counters.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType, TracebackType

    from typing_extensions import Self

__all__ = ["TestSite", "bfs", "links", "main", "page_html"]

_RANDOM_LINKS = 5
_MAX_HEADER_BYTES = 64 * 1024
_PAGE_PREFIX = "/page/"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def links(i: int, pages: int) -> list[int]:
    """Outgoing links of page ``i`` in a site of ``pages`` pages, in page order.

    The list always starts with the navigation link 1, then the next page ``i+1`` and
    the children ``2i+1`` and ``2i+2`` (so every page is reachable from page 0), then 5
    pages drawn from ``random.Random(i)``, then one of those links again. Links past
    the last page are dropped; duplicates are kept on purpose. No page links to page 0,
    the seed of the tests' crawls: as on Scrapy's scheduler, a link back to a seed
    (``dont_filter``, so never recorded as seen) is crawled once more, and the tests
    count each page once.

    Args:
        i: Page number, ``0 <= i < pages``.
        pages: Number of pages of the site, at least 1.

    Returns:
        Page numbers, each ``< pages``; the same for the same arguments.

    Raises:
        ValueError: ``pages < 1`` or ``i`` is out of range.
    """
    if pages < 1:
        raise ValueError(f"a site needs at least one page, not {pages}")
    if not 0 <= i < pages:
        raise ValueError(f"page {i} is not in 0..{pages - 1}")
    rng = random.Random(i)
    candidates = [1, i + 1, 2 * i + 1, 2 * i + 2]
    candidates += [rng.randrange(1, pages) for _ in range(_RANDOM_LINKS)] if pages > 1 else []
    result = [j for j in candidates if j < pages]
    if result:
        result.append(result[rng.randrange(len(result))])
    return result


def bfs(start: int, pages: int) -> set[int]:
    """Pages reachable from ``start`` (itself included) by following :func:`links`.

    Args:
        start: First page.
        pages: Number of pages of the site.

    Returns:
        The page numbers.

    Raises:
        ValueError: ``start`` is out of range.
    """
    seen = {start}
    todo = collections.deque([start])
    while todo:
        for j in links(todo.popleft(), pages):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return seen


def page_html(i: int, pages: int, hosts: Sequence[str] = (), port: int = 0) -> bytes:
    """The HTML of page ``i``: a ``<title>``, an ``<h1>`` with the number, and its links
    (relative; with ``hosts``, absolute: page ``j`` on host ``hosts[j % len(hosts)]``).

    Returns:
        UTF-8 encoded HTML.
    """

    def href(j: int) -> str:
        if not hosts:
            return f"/page/{j}"
        return f"http://{hosts[j % len(hosts)]}:{port}/page/{j}"

    anchors = "".join(f'<li><a href="{href(j)}">Page {j}</a></li>' for j in links(i, pages))
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>Page {i}</title></head>'
        f"<body><h1>Page {i}</h1><ul>{anchors}</ul></body></html>"
    ).encode()


def _response(
    status: int, body: bytes, content_type: str, *, keep_alive: bool, head: bool = False
) -> bytes:
    headers = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode("ascii")
    return headers if head else headers + body


class _Request:
    """One parsed request line plus the only header fields the server cares about."""

    __slots__ = ("keep_alive", "method", "target")

    def __init__(self, method: str, target: str, keep_alive: bool) -> None:
        self.method = method
        self.target = target
        self.keep_alive = keep_alive


class _HttpProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 server side of one connection: keep-alive, pipelined GETs."""

    def __init__(self, site: TestSite) -> None:
        self.site = site
        self.buffer = bytearray()
        self.pending: collections.deque[_Request] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.site._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.site._connections.discard(self)
        self.transport = None
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buffer += data
        while not self.closing:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > _MAX_HEADER_BYTES:
                    self._fail(400)
                    return
                break
            head = bytes(self.buffer[:end]).decode("latin-1")
            request = self._parse(head)
            if request is None:
                self._fail(400)
                return
            total = end + 4 + self._content_length(head)
            if len(self.buffer) < total:
                break  # the body (ignored) is not all here yet
            del self.buffer[:total]
            self.pending.append(request)
            if not request.keep_alive:
                self.closing = True
        self._serve()

    @staticmethod
    def _parse(head: str) -> _Request | None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return None
        method, target, version = parts
        connection = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "connection":
                connection = value.strip().lower()
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in connection
        else:
            keep_alive = "close" not in connection
        return _Request(method, target, keep_alive)

    @staticmethod
    def _content_length(head: str) -> int:
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                try:
                    return max(0, int(value.strip()))
                except ValueError:
                    return 0
        return 0

    def _fail(self, status: int) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.write(_response(status, b"", "text/plain", keep_alive=False))
            self.transport.close()

    def _serve(self) -> None:
        if self.task is not None:
            return
        if self.site.delay > 0:
            self.task = asyncio.get_running_loop().create_task(self._serve_delayed())
            return
        while self.pending and self.transport is not None:
            self._write(self.pending.popleft())

    async def _serve_delayed(self) -> None:
        try:
            while self.pending and self.transport is not None:
                request = self.pending.popleft()
                if self.site._is_page(request.target):
                    self.site._count(request.target)
                    await asyncio.sleep(self.site.delay)
                self._write(request, counted=True)
        finally:
            self.task = None

    def _write(self, request: _Request, *, counted: bool = False) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(self.site._respond(request, counted=counted))
        if not request.keep_alive:
            transport.close()
            self.transport = None


class TestSite:
    """A local website of ``pages`` pages linked by :func:`links`, served from a thread.

    Every request for ``/page/<i>`` (existing or not) counts as a hit of its path,
    before any delay. ``/__hits`` (JSON of :meth:`hits`) and ``/__reset`` are not
    counted. Other paths, pages ``>= pages`` and non-GET/HEAD methods get an error.

    Args:
        pages: Number of pages, at least 1.
        delay: Seconds each page response waits, without blocking other connections.
        host: Address to listen on.
        port: Port to listen on; 0 picks a free one.

    Raises:
        ValueError: ``pages < 1`` or ``delay < 0``.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self, pages: int = 1000, *, delay: float = 0.0, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        if pages < 1:
            raise ValueError(f"a site needs at least one page, not {pages}")
        if delay < 0:
            raise ValueError(f"delay must be >= 0, not {delay}")
        self.pages = pages
        self.delay = delay
        self.host = host
        #: Names of this server's address that links use in turn (page ``j`` on
        #: ``hosts[j % len(hosts)]``; empty: relative links), e.g. for a crawl spread
        #: over hosts: ``["127.0.0.1", "127.0.1", "0x7f000001"]``.
        self.hosts: Sequence[str] = ()
        self._requested_port = port
        self._port: int | None = None
        self._lock = threading.Lock()
        self._hits: collections.Counter[str] = collections.Counter()
        self._first_hit: float | None = None
        self._last_hit: float | None = None
        self._log: list[tuple[float, str]] = []
        self._bodies: dict[int, bytes] = {}
        self._connections: set[_HttpProtocol] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        """``http://<host>:<port>``, without a trailing slash.

        Raises:
            RuntimeError: The site is not started.
        """
        if self._port is None:
            raise RuntimeError("TestSite is not started")
        return f"http://{self.host}:{self._port}"

    @property
    def port(self) -> int:
        """The listening port.

        Raises:
            RuntimeError: The site is not started.
        """
        if self._port is None:
            raise RuntimeError("TestSite is not started")
        return self._port

    def page_url(self, i: int) -> str:
        """Absolute URL of page ``i``."""
        return f"{self.url}{_PAGE_PREFIX}{i}"

    def expected_paths(self, start: int = 0) -> set[str]:
        """Paths of every page reachable from page ``start``: all pages for ``start=0``.

        Returns:
            Paths like ``/page/7``.
        """
        return {f"{_PAGE_PREFIX}{j}" for j in bfs(start, self.pages)}

    def hits(self) -> dict[str, int]:
        """Requests received so far per path (``/page/...`` paths only).

        Returns:
            A copy, path -> count.
        """
        with self._lock:
            return dict(self._hits)

    def hit_log(self) -> list[tuple[float, str]]:
        """Every hit so far as ``(time.monotonic(), path)``, in the order they came: when
        the site read each request, to measure the gaps between them.

        Returns:
            A copy.
        """
        with self._lock:
            return list(self._log)

    def reset_hits(self) -> None:
        """Forget every hit counted so far."""
        with self._lock:
            self._hits.clear()
            self._log.clear()
            self._first_hit = None
            self._last_hit = None

    def first_hit_time(self) -> float | None:
        """``time.time()`` of the first hit counted since the last reset, or None."""
        with self._lock:
            return self._first_hit

    def last_hit_time(self) -> float | None:
        """``time.time()`` of the latest counted hit, or None when there is none."""
        with self._lock:
            return self._last_hit

    def start(self) -> Self:
        """Start serving in a background thread with its own event loop.

        Returns:
            This object, with :attr:`url` known.

        Raises:
            RuntimeError: Already started.
            OSError: The address cannot be bound.
        """
        if self._thread is not None:
            raise RuntimeError("TestSite is already started")
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                server = loop.run_until_complete(
                    loop.create_server(
                        lambda: _HttpProtocol(self),
                        self.host,
                        self._requested_port,
                        reuse_address=True,
                        backlog=1024,
                    )
                )
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            self._server = server
            self._port = server.sockets[0].getsockname()[1]
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._shutdown(loop, server)

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"TestSite-{id(self):x}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            self._loop = None
            raise failure[0]
        return self

    def _shutdown(self, loop: asyncio.AbstractEventLoop, server: asyncio.Server) -> None:
        server.close()
        for connection in list(self._connections):
            if connection.transport is not None:
                connection.transport.abort()
        tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()

    def stop(self) -> None:
        """Close the server and every connection, and join the thread. Idempotent."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        self._thread = None
        self._loop = None
        self._server = None
        self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<TestSite pages={self.pages} port={self._port}>"

    @staticmethod
    def _path(target: str) -> str:
        if target.startswith(("http://", "https://")):
            slash = target.find("/", target.find("//") + 2)
            target = target[slash:] if slash >= 0 else "/"
        return target.split("?", 1)[0].split("#", 1)[0]

    def _is_page(self, target: str) -> bool:
        return self._path(target).startswith(_PAGE_PREFIX)

    def _count(self, target: str) -> None:
        path = self._path(target)
        now, read_at = time.time(), time.monotonic()
        with self._lock:
            self._hits[path] += 1
            self._log.append((read_at, path))
            self._last_hit = now
            if self._first_hit is None:
                self._first_hit = now

    def _page_number(self, path: str) -> int | None:
        number = path[len(_PAGE_PREFIX) :]
        if not number.isdigit() or (len(number) > 1 and number[0] == "0"):
            return None
        i = int(number)
        return i if i < self.pages else None

    def _respond(self, request: _Request, *, counted: bool) -> bytes:
        status, body, content_type = self._route(request, counted=counted)
        return _response(
            status,
            body,
            content_type,
            keep_alive=request.keep_alive,
            head=request.method == "HEAD",
        )

    def _route(self, request: _Request, *, counted: bool) -> tuple[int, bytes, str]:
        if request.method not in ("GET", "HEAD"):
            return 405, b"", "text/plain"
        path = self._path(request.target)
        if path.startswith(_PAGE_PREFIX):
            if not counted:
                self._count(path)
            i = self._page_number(path)
            if i is None:
                return 404, b"not found\n", "text/plain"
            body = self._bodies.get(i)
            if body is None:
                body = self._bodies[i] = page_html(i, self.pages, self.hosts, self.port)
            return 200, body, "text/html; charset=utf-8"
        if path == "/__hits":
            return 200, json.dumps(self.hits(), sort_keys=True).encode(), "application/json"
        if path == "/__reset":
            self.reset_hits()
            return 200, b"{}", "application/json"
        return 404, b"not found\n", "text/plain"


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a :class:`TestSite` until SIGTERM or SIGINT.

    Prints exactly one line, ``listening on http://127.0.0.1:<port>``, once serving.

    Args:
        argv: Command-line arguments; default ``sys.argv[1:]``.

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m scrapy_dist.testing.site", description="Serve a local test website."
    )
    parser.add_argument("--pages", type=int, default=1000, help="number of pages (default 1000)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each page")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with TestSite(args.pages, delay=args.delay, host=args.host, port=args.port) as site:
            sys.stdout.write(f"listening on {site.url}\n")
            sys.stdout.flush()
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
