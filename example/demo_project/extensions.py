"""The demo project's extensions."""

from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)


def _json_default(value: object) -> object:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return str(value)


class StatsFile:
    """Writes the crawler's final stats as JSON to the path in the ``DEMO_STATS_FILE`` setting.

    The file is written when the spider closes, after Scrapy's core stats
    (``finish_time``, ``elapsed_time_seconds``...) are set; datetimes become ISO strings.

    Args:
        crawler: The crawler whose stats are written.
        path: Destination file; its directory must exist.
    """

    def __init__(self, crawler: Crawler, path: Path) -> None:
        self.crawler = crawler
        self.path = path

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the extension, connected to ``spider_closed``.

        Raises:
            NotConfigured: ``DEMO_STATS_FILE`` is not set.
        """
        path = crawler.settings.get("DEMO_STATS_FILE")
        if not path:
            raise NotConfigured("DEMO_STATS_FILE is not set")
        extension = cls(crawler, Path(path))
        # Scrapy's CoreStats sets finish_time on spider_closed too; run after it.
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    def spider_closed(self, spider: Spider, reason: str) -> None:
        """Write the stats, plus the close reason under ``finish_reason``."""
        assert self.crawler.stats is not None
        stats: dict[str, Any] = dict(self.crawler.stats.get_stats())
        stats.setdefault("finish_reason", reason)
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(stats, default=_json_default, indent=2, sort_keys=True))
        temporary.replace(self.path)
        logger.info("Wrote the final stats to %s", self.path)
