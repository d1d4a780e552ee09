"""How scrapy_dist's defaults reach a crawler.

Projects either enable :class:`DistAddon` (``ADDONS = {"scrapy_dist.addon.DistAddon": 0}``),
which installs the scheduler, the dupefilter and every default at ``"addon"`` priority,
or just name the scheduler and dupefilter classes in their settings, as with
scrapy-redis. Either way components read settings through :func:`settings_for`, so a
setting the project leaves unset has the value in :mod:`scrapy_dist.default_settings`.

Scrapy builds the spider *before* it applies add-ons, so the settings a spider sees in
``from_crawler`` are not final. :func:`settings_for` therefore refuses to resolve
them until they are (:func:`settings_final`), and resolves them once after that: no
component can keep a copy taken before the add-ons ran.
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


def settings_final(crawler: Crawler) -> bool:
    """Whether the crawler's settings are final (its add-ons applied).

    Scrapy's ``Crawler.crawl()`` marks the crawler as crawling, creates the spider, then
    applies the add-ons, builds the stats collector and the extensions, and freezes the
    settings. So the settings are not final only while a crawling crawler has no spider
    yet, i.e. during the spider's own ``__init__``/``from_crawler``. (A crawler that is
    not crawling, such as one from ``scrapy.utils.test.get_crawler``, has applied its
    add-ons already.)
    """
    return bool(
        crawler.settings.frozen
        or getattr(crawler, "spider", None) is not None
        or not getattr(crawler, "crawling", False)
    )


def settings_for(crawler: Crawler) -> BaseSettings:
    """Return the crawler's final settings with scrapy_dist's defaults, computed once.

    Raises:
        RuntimeError: the settings are not final yet (read from a spider's
            ``__init__``/``from_crawler``, before Scrapy applied the add-ons); read them
            from ``spider_opened`` on.
    """
    try:
        return _resolved[crawler]
    except KeyError:
        pass
    if not settings_final(crawler):
        raise RuntimeError(
            "scrapy_dist settings were read before Scrapy applied the add-ons (from a "
            "spider's __init__ or from_crawler); read them from spider_opened on"
        )
    resolved = _resolved[crawler] = with_defaults(crawler.settings)
    resolved.freeze()
    return resolved
