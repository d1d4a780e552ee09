"""Reading settings: what every module of :mod:`scrapy_dist.config` (and the add-on) shares.

:func:`with_defaults` fills every unset scrapy_dist setting with its default,
:func:`load_setting` imports the object a setting names (an error names the setting), and
:func:`settings_final` says whether a crawler's settings are final: Scrapy builds the
spider *before* it applies add-ons, so the settings a spider sees in ``from_crawler`` are
not, and :meth:`scrapy_dist.config.core.Config.from_crawler` refuses to read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from scrapy_dist import default_settings
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings


def with_defaults(settings: BaseSettings) -> BaseSettings:
    """Return a copy of ``settings`` in which every unset scrapy_dist setting has its default."""
    resolved = settings.copy()
    resolved.frozen = False  # a copy of a frozen crawler's settings starts frozen
    resolved.setmodule(default_settings, "default")
    return resolved


def load_setting(setting: str, path: str) -> Any:
    """The object at import path ``path``, named by ``setting``.

    Raises:
        ConfigurationError: nothing can be imported there; the message names the setting.
    """
    try:
        return load_object(path)
    except Exception as e:  # (also an error raised by the module while it is imported)
        raise ConfigurationError(
            f"{setting} = {path!r} cannot be imported: {type(e).__name__}: {e}"
        ) from None


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
