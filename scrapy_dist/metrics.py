"""Prometheus metrics of a crawl, served by each worker, for dashboards and autoscaling.

Enable with::

    EXTENSIONS = {"scrapy_dist.metrics.PrometheusMetrics": 500}
    METRICS_ENABLED = True
    METRICS_HOST = "0.0.0.0"    # default 127.0.0.1: only this host can scrape
    METRICS_PORT = 9410

Every ``METRICS_INTERVAL`` seconds the extension reads the crawl's state from Redis in
one round trip (:func:`scrapy_dist.status.read_status`) and keeps the gauges;
``GET /metrics`` serves them (Prometheus' text exposition format) from a small HTTP
server on its own thread and never waits for Redis. The gauges are crawl-wide, labelled
``crawl`` (every worker of a crawl reports the same values; aggregate with ``max``):
queue depth, seeds, leased, dead, live workers, pages and items per second over the last
minute, items stored, dupefilter size, Bloom fill and estimated false-positive rate, and
``scrapy_dist_up``. Two counters are this worker's own:
``scrapy_dist_worker_pages_total`` and ``scrapy_dist_worker_items_total``.

``scrapy-dist metrics SPIDER`` serves the same gauges without a worker (to scale a crawl
up from zero workers) with the same renderer (:class:`CrawlMetrics`) and server
(:class:`MetricsServer`), reading Redis when scraped, at most every ``--interval``
seconds. See ``docs/deployment.md``.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import redis
from scrapy import signals
from scrapy.exceptions import NotConfigured

from scrapy_dist.assembly import assemble
from scrapy_dist.config.components import check_metrics
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.stats import ITEMS_STAT, PAGES_STAT
from scrapy_dist.status import CrawlLayout, read_status

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.task import LoopingCall
    from typing_extensions import Self

    from scrapy_dist.status import CrawlStatus

logger = logging.getLogger(__name__)

#: This worker's own counters: metric name -> (help, local stat).
WORKER_COUNTERS = {
    "scrapy_dist_worker_pages_total": ("Pages this worker fetched.", PAGES_STAT),
    "scrapy_dist_worker_items_total": ("Items this worker scraped.", ITEMS_STAT),
}

#: Content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The crawl-wide gauges: name -> help text.
GAUGES = {
    "scrapy_dist_up": "1 if the crawl's state was read from Redis at the last refresh, else 0.",
    "scrapy_dist_queue_depth": "Requests waiting in the crawl's shared queue.",
    "scrapy_dist_seeds": "Seeds waiting in the crawl's seeds key.",
    "scrapy_dist_leased": "Requests and seeds held by workers and not yet acknowledged.",
    "scrapy_dist_dead": "Records in the crawl's dead-letter list.",
    "scrapy_dist_workers": "Live workers (heartbeat within SCHEDULER_WORKER_TIMEOUT).",
    "scrapy_dist_workers_silent": "Live workers that missed two heartbeats (their leases "
    "return when they expire).",
    "scrapy_dist_workers_registered": "Workers in the crawl's registry, live or not.",
    "scrapy_dist_requests_done": "Requests acknowledged (fetched, dropped or failed for "
    "good; seeds not counted): status's done.",
    "scrapy_dist_pages_per_second": "Pages the whole crawl fetched per second over the last "
    "scrapy_dist_rate_window_seconds.",
    "scrapy_dist_items_per_second": "Items the whole crawl scraped per second over the last "
    "scrapy_dist_rate_window_seconds.",
    "scrapy_dist_rate_window_seconds": "Seconds the rates are measured over: a minute, or "
    "less while the crawl is younger.",
    "scrapy_dist_items_stored": "Items in the crawl's items list.",
    "scrapy_dist_slots_paused": "Download slots paused for every worker (a Retry-After, or "
    "a run of 429/503 responses).",
    "scrapy_dist_slots_counted": "Download slots the crawl counted requests of "
    "(SCHEDULER_SLOT_COUNTS).",
    "scrapy_dist_queue_slots_ready": "Download slots of a queue per slot that are ready "
    "to send (SlotQueue; 0 with another queue).",
    "scrapy_dist_queue_slots_waiting": "Download slots of a queue per slot that wait for "
    "their delay or pause (SlotQueue; 0 with another queue).",
    "scrapy_dist_dupefilter_size": "Fingerprints recorded in the dupefilter.",
    "scrapy_dist_bloom_fill": "Bloom dupefilter fingerprints divided by its capacity.",
    "scrapy_dist_bloom_false_positive_rate": "Estimated false-positive rate of the Bloom "
    "dupefilter.",
    "scrapy_dist_control_state": "Crawl control state: 0 running, 1 paused, 2 draining (an "
    "invalid control key reads as paused).",
    "scrapy_dist_control_since_seconds": "When the crawl control state was last set (Redis "
    "server time, seconds since the epoch).",
}


#: The gauges of each consumer group of the items stream (label ``group``): name -> help.
GROUP_GAUGES = {
    "scrapy_dist_items_stream_lag": "Items of the items stream not yet delivered to the "
    "consumer group (exact; NaN if too many to count).",
    "scrapy_dist_items_stream_pending": "Items delivered to the consumer group and not "
    "acknowledged.",
}


def group_gauges(status: CrawlStatus | None) -> dict[str, dict[str, float]]:
    """Per consumer group of the items stream: gauge name -> value (none without a
    stream)."""
    stream = status.item_stream if status is not None else None
    if stream is None:
        return {}
    return {
        g.name: {
            "scrapy_dist_items_stream_lag": math.nan if g.lag is None else g.lag,
            "scrapy_dist_items_stream_pending": g.pending,
        }
        for g in stream.groups
    }


def group_text(crawl: str, groups: Mapping[str, Mapping[str, float]]) -> str:
    """The per-group gauges (:func:`group_gauges`) in Prometheus' text format, labelled
    ``crawl`` and ``group``."""
    lines: list[str] = []
    for name, help_text in GROUP_GAUGES.items():
        if not groups:
            break
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for group, values in groups.items():
            label = f'{{crawl="{_label(crawl)}",group="{_label(group)}"}}'
            lines.append(f"{name}{label} {_sample(values[name])}")
    return "".join(line + "\n" for line in lines)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def gauges(status: CrawlStatus | None) -> dict[str, float]:
    """The gauge values of a status (``None``: Redis could not be read, only ``up``)."""
    if status is None:
        return {"scrapy_dist_up": 0}
    values: dict[str, float] = {
        "scrapy_dist_up": 1,
        "scrapy_dist_queue_depth": status.queued,
        "scrapy_dist_seeds": status.seeds,
        "scrapy_dist_leased": status.leased,
        "scrapy_dist_dead": status.dead,
        "scrapy_dist_workers": len(status.live_workers()),
        "scrapy_dist_workers_silent": status.silent_workers(),
        "scrapy_dist_workers_registered": len(status.workers),
        "scrapy_dist_requests_done": status.requests_done,
        "scrapy_dist_items_stored": status.items_stored,
        "scrapy_dist_slots_paused": len(status.paused_slots),
        "scrapy_dist_slots_counted": status.slots_counted,
        "scrapy_dist_queue_slots_ready": (status.queue_slots or {}).get("ready", 0),
        "scrapy_dist_queue_slots_waiting": (status.queue_slots or {}).get("waiting", 0),
        "scrapy_dist_dupefilter_size": status.dupefilter.count if status.dupefilter else 0,
    }
    if status.rates is not None:
        values["scrapy_dist_pages_per_second"] = status.rates.pages_per_second
        values["scrapy_dist_items_per_second"] = status.rates.items_per_second
        values["scrapy_dist_rate_window_seconds"] = status.rates.window
    df = status.dupefilter
    if df is not None and df.capacity:
        values["scrapy_dist_bloom_fill"] = df.count / df.capacity
        values["scrapy_dist_bloom_false_positive_rate"] = df.fpr_estimate
    values.update(control_gauges(status))
    return values


# -- crawl control (pause, resume, drain: scrapy_dist.control) --------------------------

#: Value of ``scrapy_dist_control_state`` per state.
CONTROL_STATE_VALUES = {"running": 0, "paused": 1, "draining": 2}


def control_gauges(status: CrawlStatus) -> dict[str, float]:
    """The crawl control gauges of a status (none if its control state was not read)."""
    control = status.control
    if control is None:
        return {}
    values: dict[str, float] = {
        "scrapy_dist_control_state": CONTROL_STATE_VALUES.get(control.state, 1)
    }
    if control.since is not None:
        values["scrapy_dist_control_since_seconds"] = control.since
    return values


def prometheus_text(
    crawl: str,
    values: Mapping[str, float],
    counters: Mapping[str, tuple[str, float]] | None = None,
) -> str:
    """Render gauges (and counters: name -> (help, value)) for one crawl in Prometheus'
    text exposition format, each with the label ``crawl``."""
    label = f'{{crawl="{_label(crawl)}"}}'
    lines: list[str] = []

    def emit(name: str, kind: str, help_text: str, value: float) -> Iterator[str]:
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} {kind}"
        yield f"{name}{label} {_sample(value)}"

    for name, help_text in GAUGES.items():
        if name in values:
            lines += emit(name, "gauge", help_text, values[name])
    for name, (help_text, value) in (counters or {}).items():
        lines += emit(name, "counter", help_text, value)
    return "\n".join(lines) + "\n"


class CrawlMetrics:
    """The metrics text of one crawl: the gauges of its last status read, and counters.

    The one renderer of both the extension and ``scrapy-dist metrics``.

    Args:
        crawl: the crawl name (the ``crawl`` label).
        read: reads the crawl's status (:func:`~scrapy_dist.status.read_status`, bound).
        counters: this process's counters now, ``name -> (help, value)`` (none if
            ``None``).
        max_age: if a number, :meth:`render` first reads the status again when the last
            read is that many seconds old (read when scraped); if ``None``, only
            :meth:`refresh` reads it (on a timer).
    """

    def __init__(
        self,
        crawl: str,
        read: Callable[[], CrawlStatus],
        *,
        counters: Callable[[], Mapping[str, tuple[str, float]]] | None = None,
        max_age: float | None = None,
    ) -> None:
        self.crawl = crawl
        self.read = read
        self.counters = counters
        self.max_age = max_age
        self._values: dict[str, float] = gauges(None)
        self._groups: dict[str, dict[str, float]] = {}
        self._read_at = -math.inf
        self._failing = False
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read the crawl's state now. If Redis (or a key's type) fails, only
        ``scrapy_dist_up`` = 0 is rendered, and a warning is logged (once, until a
        read succeeds again)."""
        groups: dict[str, dict[str, float]] = {}
        try:
            status = self.read()
            values = gauges(status)
            groups = group_gauges(status)
        except (redis.RedisError, ConfigurationError, ValueError) as e:
            if not self._failing:
                logger.warning(
                    "Metrics: could not read crawl %(crawl)s from Redis: %(error)s",
                    {"crawl": self.crawl, "error": e},
                )
            self._failing = True
            values = gauges(None)
        else:
            self._failing = False
        self._values = values
        self._groups = groups
        self._read_at = time.monotonic()

    def render(self) -> str:
        """The metrics text: the last read gauges (read first if older than
        :attr:`max_age`), and the counters now."""
        if self.max_age is not None:
            with self._lock:  # the server answers scrapes on several threads
                if time.monotonic() - self._read_at >= self.max_age:
                    self.refresh()
        counters = self.counters() if self.counters is not None else None
        text = prometheus_text(self.crawl, self._values, counters)
        return text + group_text(self.crawl, self._groups)


class _MetricsHandler(BaseHTTPRequestHandler):
    """``GET /metrics`` (query string ignored); 404 for any other path; no access log."""

    server: MetricsServer

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/") != "/metrics":
            self.send_error(404, "scrape /metrics")
            return
        body = self.server.render().encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class MetricsServer(ThreadingHTTPServer):
    """A small HTTP server of ``GET /metrics``: the text ``render`` returns, in
    :data:`CONTENT_TYPE`; 404 for any other path. One thread per scrape.

    Args:
        host: address to listen on (an IPv6 address if it contains ``:``).
        port: TCP port (0: any free port; :attr:`port` says which).
        render: the metrics text now (:meth:`CrawlMetrics.render`).

    Raises:
        OSError: the address cannot be bound (a port already taken, say), or is no
            address at all (a port out of range, a host name with a NUL): ``EINVAL``.
    """

    daemon_threads = True

    def __init__(self, host: str, port: int, render: Callable[[], str]) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.render = render
        self._thread: threading.Thread | None = None
        try:
            super().__init__((host, port), _MetricsHandler)
        except (OverflowError, TypeError, ValueError) as e:  # what socket.bind refuses
            raise OSError(errno.EINVAL, f"not an address to listen on ({e})") from e

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self.server_address[1])

    def start(self) -> None:
        """Serve on a daemon thread (returns at once); :meth:`stop` ends it."""
        self._thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="scrapy-dist metrics",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (waiting for :meth:`start`'s thread) and close the socket."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()


#: Ports a worker tries from ``METRICS_PORT`` on (several workers on one host each take
#: the next free one), before any free port.
PORT_SPAN = 16


def bind_first_free(host: str, port: int, render: Callable[[], str]) -> MetricsServer:
    """A :class:`MetricsServer` on the first free port of ``port .. port + PORT_SPAN - 1``,
    or on any free port if they are all taken (``port`` 0: any free port at once).

    Raises:
        OSError: the host cannot be listened on at all.
    """
    if port:
        for candidate in range(port, min(port + PORT_SPAN, 65536)):
            try:
                return MetricsServer(host, candidate, render)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
    return MetricsServer(host, 0, render)


class PrometheusMetrics:
    """Serves the crawl's metrics over HTTP (see the module docstring).

    Args:
        metrics: the crawl's renderer (read by :meth:`refresh`, on a timer).
        host: address to listen on.
        port: TCP port (0: any free port; :attr:`port` says which after it started).
        interval: seconds between reads of the crawl's state.

    Raises:
        ConfigurationError: a non-positive ``interval`` or a port out of range.
    """

    def __init__(self, *, metrics: CrawlMetrics, host: str, port: int, interval: float) -> None:
        check_metrics(port, interval)
        self.metrics = metrics
        self.host = host
        self.requested_port = port
        self.interval = interval
        #: The port actually listened on, once started.
        self.port: int | None = None
        self._server: MetricsServer | None = None
        self._ticker: LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        parts = assemble(crawler)
        config = parts.config.metrics
        if not config.enabled:
            # off by default, also when the add-on enables it: no warning (Scrapy warns
            # about a NotConfigured only if it has a message)
            raise NotConfigured
        if not crawler.settings.getbool("TWISTED_REACTOR_ENABLED", True):
            raise NotConfigured("PrometheusMetrics refreshes on Twisted's reactor: it needs it")
        client = parts.client
        layout = CrawlLayout.for_crawler(crawler)
        stats = crawler.stats

        def read() -> CrawlStatus:
            return read_status(client, layout, parts.config)

        ext = cls(
            metrics=CrawlMetrics(layout.keys.crawl, read, counters=lambda: worker_counters(stats)),
            host=config.host,
            port=config.port,
            interval=config.interval,
        )
        crawler.signals.connect(ext.start, signal=signals.engine_started)
        crawler.signals.connect(ext.stop, signal=signals.engine_stopped)
        return ext

    def refresh(self) -> None:
        """Read the crawl's state from Redis now (one round trip, plus the dupefilter's)."""
        self.metrics.refresh()

    def render(self) -> str:
        """The metrics text: the last read gauges, and this worker's counters now."""
        return self.metrics.render()

    def start(self) -> None:
        """Listen on the first free port from ``METRICS_PORT`` on (:func:`bind_first_free`,
        logged) and start the refresh timer; a host that cannot be listened on is logged
        as an error and the crawl goes on without metrics."""
        from twisted.internet.task import LoopingCall

        try:
            self._server = bind_first_free(self.host, self.requested_port, self.render)
        except OSError as e:
            logger.error(
                "Metrics: cannot listen on %(host)s (%(error)s). Going on without metrics",
                {"host": self.host, "error": e},
            )
            return
        self._server.start()
        self.port = self._server.port
        taken = (
            ""
            if self.port == self.requested_port or not self.requested_port
            else f" (METRICS_PORT {self.requested_port} is taken, by another worker?)"
        )
        logger.info(
            "Metrics of crawl %(crawl)s on http://%(host)s:%(port)d/metrics%(taken)s; "
            "one endpoint per crawl, whichever workers run: scrapy-dist metrics %(spider)s",
            {
                "crawl": self.metrics.crawl,
                "host": self.host,
                "port": self.port,
                "taken": taken,
                "spider": self.metrics.crawl.partition(":")[0],
            },
        )
        self._ticker = LoopingCall(self.refresh)
        self._ticker.start(self.interval, now=True)

    def stop(self) -> None:
        """Stop the timer and the server."""
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if self._server is not None:
            self._server.stop()
            self._server = None


def worker_counters(stats: StatsCollector) -> dict[str, tuple[str, float]]:
    """This worker's own counters now (:data:`WORKER_COUNTERS`)."""
    return {
        name: (help_text, float(stats.get_value(stat) or 0))
        for name, (help_text, stat) in WORKER_COUNTERS.items()
    }
