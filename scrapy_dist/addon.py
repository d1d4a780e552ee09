"""How scrapy_dist's defaults reach a crawler.

Projects either enable :class:`DistAddon` (``ADDONS = {"scrapy_dist.addon.DistAddon": 0}``),
which installs the scheduler, the dupefilter and every default at ``"addon"`` priority,
or just name the scheduler and dupefilter classes in their settings, as with
scrapy-redis. Either way components read settings through :func:`settings_for`, so a
setting the project leaves unset has the value in :mod:`scrapy_dist.default_settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from scrapy_dist import default_settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

_resolved: WeakKeyDictionary[Crawler, BaseSettings] = WeakKeyDictionary()


class DistAddon:
    """Scrapy add-on: use the Redis scheduler and dupefilter with scrapy_dist's defaults."""

    def update_settings(self, settings: BaseSettings) -> None:
        """Install the components and defaults; project settings still override them.

        The metrics extension is enabled too; it stays off until ``METRICS_ENABLED``.
        """
        from scrapy_dist.metrics import PrometheusMetrics

        settings.set("SCHEDULER", "scrapy_dist.scheduler.Scheduler", "addon")
        settings.set("DUPEFILTER_CLASS", "scrapy_dist.dupefilter.RFPDupeFilter", "addon")
        settings.setmodule(default_settings, "addon")
        settings.set_in_component_priority_dict("EXTENSIONS", PrometheusMetrics, 500)


def with_defaults(settings: BaseSettings) -> BaseSettings:
    """Return a copy of ``settings`` in which every unset scrapy_dist setting has its default."""
    resolved = settings.copy()
    resolved.frozen = False  # a copy of a frozen crawler's settings starts frozen
    resolved.setmodule(default_settings, "default")
    return resolved


def settings_for(crawler: Crawler) -> BaseSettings:
    """Return the crawler's settings with scrapy_dist's defaults, computed once per crawler."""
    try:
        return _resolved[crawler]
    except KeyError:
        resolved = _resolved[crawler] = with_defaults(crawler.settings)
        resolved.freeze()
        return resolved
