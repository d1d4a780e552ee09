"""The benchmark's website: nginx serving static pages, or the package's Python test site.

Both serve the link graph of :func:`scrapy_dist.testing.site.links` at ``/page/<i>`` and
record every page fetch with its time, so a benchmark computes rates, duplicates and
missing pages from the server's side:

- :class:`NginxSite`: the pages written once as static files, served by an ``nginx``
  subprocess (not a daemon) on one or more free ports, keep-alive on, access log with
  ``$msec`` timestamps. Fast enough not to be a crawl's bottleneck.
- :class:`PythonSite`: :class:`scrapy_dist.testing.site.TestSite` (asyncio, in a thread of
  this process) with per-hit timestamps; it can delay every page, which nginx cannot.

One site object can listen on several ports, each a separate copy of the site (hits are
kept apart by port): independent in-memory crawls use one copy each.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from scrapy_dist.testing.redis_server import free_port
from scrapy_dist.testing.site import TestSite, page_html

__all__ = [
    "Hit",
    "NginxSite",
    "PythonSite",
    "Site",
    "find_nginx",
    "measure_capacity",
    "write_pages",
]

_HOST = "127.0.0.1"
_LOG_FORMAT = "$msec $server_port $status $request_uri"
_PAGE = re.compile(r"^/page/\d+$")


@dataclass(frozen=True)
class Hit:
    """One page fetch seen by the site.

    Attributes:
        time: ``time.time()`` of the request.
        copy: Index of the site copy (port) it reached.
        path: The request path, ``/page/<i>``.
    """

    time: float
    copy: int
    path: str


class Site(Protocol):
    """What a benchmark needs from a site."""

    kind: str
    pages: int

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def base_urls(self) -> list[str]: ...

    def hits(self) -> list[Hit]: ...


def find_nginx() -> str | None:
    """The ``nginx`` binary (``$NGINX``, PATH, or ``/usr/sbin/nginx``), or None."""
    configured = os.environ.get("NGINX")
    if configured:
        return configured
    found = shutil.which("nginx")
    if found:
        return found
    default = Path("/usr/sbin/nginx")
    return str(default) if default.exists() else None


def write_pages(pages: int, root: Path) -> None:
    """Write ``root/page/<i>`` for every page of a ``pages``-page site."""
    directory = root / "page"
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(pages):
        (directory / str(i)).write_bytes(page_html(i, pages))


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((_HOST, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class NginxSite:
    """``nginx`` serving a ``pages``-page static site on ``copies`` ports.

    Args:
        pages: Number of pages.
        root: Directory holding ``page/<i>`` (see :func:`write_pages`); it must be
            readable by nginx's worker user.
        copies: Number of ports (independent copies of the site).
        binary: nginx binary; default :func:`find_nginx`.
    """

    kind = "nginx"

    def __init__(self, pages: int, root: Path, copies: int = 1, binary: str | None = None) -> None:
        found = binary or find_nginx()
        if found is None:
            raise FileNotFoundError("nginx not found")
        self.binary = found
        self.pages = pages
        self.root = root
        self.ports = [free_port() for _ in range(copies)]
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_urls(self) -> list[str]:
        """``http://127.0.0.1:<port>`` of each copy."""
        return [f"http://{_HOST}:{port}" for port in self.ports]

    def _config(self, directory: Path) -> str:
        listens = "".join(f"    listen {_HOST}:{port};\n" for port in self.ports)
        temp = "".join(
            f"  {name}_temp_path {directory / name};\n"
            for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        return (
            "daemon off;\nmaster_process on;\nworker_processes 1;\n"
            f"pid {directory / 'nginx.pid'};\nerror_log {directory / 'error.log'} warn;\n"
            "events { worker_connections 4096; }\n"
            "http {\n"
            "  default_type text/html;\n  sendfile on;\n  tcp_nodelay on;\n"
            "  keepalive_timeout 300s;\n  keepalive_requests 10000000;\n"
            f"{temp}"
            f"  log_format bench '{_LOG_FORMAT}';\n"
            "  server {\n"
            f"{listens}"
            f"    root {self.root};\n"
            f"    access_log {directory / 'access.log'} bench;\n"
            "    location / { try_files $uri =404; }\n"
            "  }\n"
            "}\n"
        )

    def start(self, timeout: float = 10.0) -> None:
        """Start nginx with a fresh access log and wait until every port accepts."""
        self._dir = Path(tempfile.mkdtemp(prefix="scrapy-dist-nginx-"))
        config = self._dir / "nginx.conf"
        config.write_text(self._config(self._dir))
        self._process = subprocess.Popen(
            [
                self.binary,
                "-c",
                str(config),
                "-p",
                str(self._dir),
                "-e",
                str(self._dir / "error.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            for port in self.ports:
                _wait_port(port, timeout)
        except OSError:
            error = self._process.stderr.read().decode() if self._process.stderr else ""
            self.stop()
            raise RuntimeError(f"nginx did not start: {error}") from None

    def stop(self) -> None:
        """Stop nginx (SIGQUIT: graceful, flushes the log; SIGKILL after 5 s). Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGQUIT)
                try:
                    process.wait(5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            if process.stderr is not None:
                process.stderr.close()

    def cleanup(self) -> None:
        """Stop, then delete the run directory (config and access log)."""
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def hits(self) -> list[Hit]:
        """Every page fetch in the access log so far, in log order."""
        if self._dir is None:
            return []
        copy_of = {str(port): index for index, port in enumerate(self.ports)}
        result = []
        try:
            text = (self._dir / "access.log").read_text()
        except OSError:
            return []
        for line in text.splitlines():
            parts = line.split(" ")
            if len(parts) != 4 or not _PAGE.match(parts[3]):
                continue
            result.append(Hit(float(parts[0]), copy_of.get(parts[1], 0), parts[3]))
        return result


class _TimedSite(TestSite):
    """:class:`TestSite` that also records the time of every page hit."""

    def __init__(self, pages: int, delay: float = 0.0) -> None:
        super().__init__(pages, delay=delay)
        self.times: list[tuple[float, str]] = []
        self._times_lock = threading.Lock()

    def _count(self, target: str) -> None:
        super()._count(target)
        with self._times_lock:
            self.times.append((time.time(), self._path(target)))


class PythonSite:
    """The package's asyncio test site, in threads of this process, ``copies`` times.

    Args:
        pages: Number of pages.
        copies: Number of independent copies (one port each).
        delay: Seconds every page waits before its response (other connections go on).
    """

    kind = "python"

    def __init__(self, pages: int, copies: int = 1, delay: float = 0.0) -> None:
        self.pages = pages
        self.delay = delay
        self._sites = [_TimedSite(pages, delay) for _ in range(copies)]

    @property
    def base_urls(self) -> list[str]:
        """``http://127.0.0.1:<port>`` of each copy."""
        return [site.url for site in self._sites]

    def start(self) -> None:
        for site in self._sites:
            site.start()

    def stop(self) -> None:
        for site in self._sites:
            site.stop()

    def cleanup(self) -> None:
        self.stop()

    def hits(self) -> list[Hit]:
        result = []
        for index, site in enumerate(self._sites):
            with site._times_lock:
                times = list(site.times)
            result += [Hit(t, index, path) for t, path in times if _PAGE.match(path)]
        return result


def measure_capacity(url: str, seconds: float = 3.0, connections: int = 16) -> tuple[float, str]:
    """Requests per second the site serves for ``url``.

    Uses ``wrk`` (one thread, ``connections`` keep-alive connections) when installed,
    else Python ``http.client`` threads (a lower bound: the client is the limit).

    Returns:
        The rate and a description of the tool used.
    """
    wrk = shutil.which("wrk")
    if wrk:
        output = subprocess.run(
            [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", url],
            capture_output=True,
            text=True,
            timeout=seconds + 30,
            check=False,
        ).stdout
        match = re.search(r"Requests/sec:\s+([\d.]+)", output)
        if match:
            return float(match.group(1)), f"wrk -t1 -c{connections}"
    return _python_capacity(
        url, seconds, min(connections, 4)
    ), f"{min(connections, 4)} Python threads"


def _python_capacity(url: str, seconds: float, threads: int) -> float:
    counts = [0] * threads
    deadline = time.monotonic() + seconds

    def run(index: int) -> None:
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=5) as response:
                response.read()
            counts[index] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / seconds
