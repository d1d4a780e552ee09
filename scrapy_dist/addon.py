"""The Scrapy add-on that installs scrapy_dist's components and defaults.

Projects either enable :class:`DistAddon` (``ADDONS = {"scrapy_dist.addon.DistAddon": 0}``),
which installs the scheduler, the dupefilter and every default at ``"addon"`` priority,
or just name the scheduler and dupefilter classes in their settings, as with
scrapy-redis. Either way components read their settings through
:class:`scrapy_dist.config.core.Config`, so a setting the project leaves unset has the
value in :mod:`scrapy_dist.default_settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.utils.misc import load_object

from scrapy_dist import default_settings
from scrapy_dist.config.reading import settings_final, with_defaults

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["DistAddon", "settings_final", "with_defaults"]

#: Components the add-on installs, by import path.
SCHEDULER = "scrapy_dist.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"
METRICS_EXTENSION = "scrapy_dist.metrics.PrometheusMetrics"
PARENT_LINKS = "scrapy_dist.parents.ParentLinks"
SHARED_ROBOTS = "scrapy_dist.robots.SharedRobotsTxt"


class DistAddon:
    """Scrapy add-on: use the Redis scheduler and dupefilter with scrapy_dist's defaults."""

    def update_settings(self, settings: BaseSettings) -> None:
        """Install the components and defaults; project settings still override them.

        The metrics extension is enabled too; it stays off until ``METRICS_ENABLED``.
        So is :class:`~scrapy_dist.parents.ParentLinks` (a spider middleware), and
        :class:`~scrapy_dist.robots.SharedRobotsTxt` (a downloader middleware, off
        without ``ROBOTSTXT_OBEY``). The
        stats collector stays the project's: ``STATS_CLASS =
        "scrapy_dist.stats.RedisStatsCollector"`` shares the crawl's stats and rates.
        """
        settings.set("SCHEDULER", SCHEDULER, "addon")
        settings.set("DUPEFILTER_CLASS", DUPEFILTER_CLASS, "addon")
        settings.setmodule(default_settings, "addon")
        # the class, not its path: Scrapy finds a project's own entry for it by class
        settings.set_in_component_priority_dict("EXTENSIONS", load_object(METRICS_EXTENSION), 500)
        # which request produced each request: fences a callback's requests by its lease
        settings.set_in_component_priority_dict("SPIDER_MIDDLEWARES", load_object(PARENT_LINKS), 0)
        # each site's robots.txt fetched once per crawl (after Scrapy's robots middleware)
        settings.set_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", load_object(SHARED_ROBOTS), 110
        )
