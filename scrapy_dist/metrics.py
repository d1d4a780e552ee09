"""Prometheus metrics of a crawl, served by each worker, for dashboards and autoscaling.

Enable with::

    EXTENSIONS = {"scrapy_dist.metrics.PrometheusMetrics": 500}
    METRICS_ENABLED = True
    METRICS_HOST = "0.0.0.0"    # default 127.0.0.1: only this host can scrape
    METRICS_PORT = 9410

Every ``METRICS_INTERVAL`` seconds the extension reads the crawl's state from Redis in
one round trip (:func:`scrapy_dist.monitor.read_status`) and keeps the rendered text;
``GET /metrics`` serves that text (Prometheus' text exposition format) and never waits
for Redis. The gauges are crawl-wide, labelled ``crawl`` (every worker of a crawl
reports the same values; aggregate with ``max``): queue depth, seeds, leased, dead,
live workers, pages and items per second over the last minute, items stored,
dupefilter size, Bloom fill and estimated false-positive rate, and ``scrapy_dist_up``.
Two counters are this worker's own: ``scrapy_dist_worker_pages_total`` and
``scrapy_dist_worker_items_total``. ``scrapy-dist metrics SPIDER`` serves the same
gauges without a worker (to scale a crawl up from zero workers). See
``docs/deployment.md``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import redis
from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet.error import CannotListenError
from twisted.web.resource import Resource
from twisted.web.server import Site

from scrapy_dist.assembly import assemble
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.monitor import CONTENT_TYPE, CrawlLayout, gauges, prometheus_text, read_status
from scrapy_dist.settings import Config, check_metrics
from scrapy_dist.stats import ITEMS_STAT, PAGES_STAT

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.task import LoopingCall
    from twisted.web import http
    from twisted.web.server import Request
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: This worker's own counters: metric name -> (help, local stat).
WORKER_COUNTERS = {
    "scrapy_dist_worker_pages_total": ("Pages this worker fetched.", PAGES_STAT),
    "scrapy_dist_worker_items_total": ("Items this worker scraped.", ITEMS_STAT),
}


class MetricsResource(Resource):
    """``GET /metrics``: the text a callable renders; 404 for any other path."""

    isLeaf = True

    def __init__(self, render: Callable[[], str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._render = render

    def render_GET(self, request: Request) -> bytes:
        if request.path.rstrip(b"/") != b"/metrics":
            request.setResponseCode(404)
            return b"not found: scrape /metrics\n"
        header = CONTENT_TYPE.encode()
        request.setHeader(b"content-type", header)  # type: ignore[no-untyped-call]
        return self._render().encode("utf-8")


class _QuietSite(Site):
    """A site that does not log every scrape."""

    def log(self, request: http.Request) -> None:
        return None


class PrometheusMetrics:
    """Serves the crawl's metrics over HTTP (see the module docstring).

    Args:
        client: the crawl's Redis client.
        layout: the crawl's keys and types.
        config: the settings (for the dupefilter backend).
        stats: this worker's stats collector (for its own counters).
        host: address to listen on.
        port: TCP port (0: any free port; :attr:`port` says which after it started).
        interval: seconds between reads of the crawl's state.

    Raises:
        ConfigurationError: a non-positive ``interval`` or a port out of range.
    """

    def __init__(
        self,
        *,
        client: redis.Redis,
        layout: CrawlLayout,
        config: Config,
        stats: StatsCollector,
        host: str,
        port: int,
        interval: float,
    ) -> None:
        check_metrics(port, interval)
        self.client = client
        self.layout = layout
        self.config = config
        self.stats = stats
        self.host = host
        self.requested_port = port
        self.interval = interval
        #: The port actually listened on, once started.
        self.port: int | None = None
        self._values: dict[str, float] = gauges(None)
        self._listening: Any = None
        self._ticker: LoopingCall | None = None
        self._failing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        parts = assemble(crawler)
        metrics = parts.config.metrics
        if not metrics.enabled:
            # off by default, also when the add-on enables it: no warning (Scrapy warns
            # about a NotConfigured only if it has a message)
            raise NotConfigured
        if not crawler.settings.getbool("TWISTED_REACTOR_ENABLED", True):
            raise NotConfigured("PrometheusMetrics serves with Twisted: it needs its reactor")
        ext = cls(
            client=parts.client,
            layout=CrawlLayout.for_crawler(crawler),
            config=parts.config,
            stats=crawler.stats,
            host=metrics.host,
            port=metrics.port,
            interval=metrics.interval,
        )
        crawler.signals.connect(ext.start, signal=signals.engine_started)
        crawler.signals.connect(ext.stop, signal=signals.engine_stopped)
        return ext

    def refresh(self) -> None:
        """Read the crawl's state from Redis now (one round trip, plus the dupefilter's)."""
        try:
            status = read_status(self.client, self.layout, self.config)
        except (redis.RedisError, ConfigurationError, ValueError) as e:
            if not self._failing:
                logger.warning(
                    "Metrics: could not read crawl %(crawl)s from Redis: %(error)s",
                    {"crawl": self.layout.keys.crawl, "error": e},
                )
            self._failing = True
            self._values = gauges(None)
            return
        self._failing = False
        self._values = gauges(status)

    def render(self) -> str:
        """The metrics text: the last read gauges, and this worker's counters now."""
        counters = {
            name: (help_text, float(self.stats.get_value(stat) or 0))
            for name, (help_text, stat) in WORKER_COUNTERS.items()
        }
        return prometheus_text(self.layout.keys.crawl, self._values, counters)

    def start(self) -> None:
        """Listen on the port and start the refresh timer; a port that is taken is
        logged as an error and the crawl goes on without metrics."""
        from twisted.internet import reactor
        from twisted.internet.task import LoopingCall

        site = _QuietSite(MetricsResource(self.render))  # type: ignore[no-untyped-call]
        try:
            self._listening = cast("Any", reactor).listenTCP(
                self.requested_port, site, interface=self.host
            )
        except CannotListenError as e:
            logger.error(
                "Metrics: cannot listen on %(host)s:%(port)d (%(error)s); set METRICS_PORT "
                "to a free port (0 picks one). Going on without metrics",
                {"host": self.host, "port": self.requested_port, "error": e},
            )
            return
        self.port = int(self._listening.getHost().port)
        logger.info(
            "Metrics of crawl %(crawl)s on http://%(host)s:%(port)d/metrics",
            {"crawl": self.layout.keys.crawl, "host": self.host, "port": self.port},
        )
        self._ticker = LoopingCall(self.refresh)
        self._ticker.start(self.interval, now=True)

    def stop(self) -> None:
        """Stop the timer and the server."""
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if self._listening is not None:
            self._listening.stopListening()
            self._listening = None
