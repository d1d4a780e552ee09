"""The frozen config of one crawler (or one CLI run): :class:`Config`.

Built once per crawler (by :func:`scrapy_dist.assembly.assemble`) from the crawler's
*final* settings with every unset scrapy_dist setting at its default, or from a
:class:`~scrapy.settings.Settings` object for code without a crawler (the CLI). Its
sections (:data:`SECTIONS`; parsed in :mod:`scrapy_dist.config.topology`,
:mod:`scrapy_dist.config.scheduling` and :mod:`scrapy_dist.config.components`) are each
parsed and validated the first time they are read, then kept: an invalid setting fails
the component that uses it, when it is built (a bad ``METRICS_PORT`` does not stop a
crawl whose metrics are off). Typed reads of a setting that is not of its type raise
:class:`~scrapy_dist.exceptions.ConfigurationError` naming it.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy.settings import BaseSettings

from scrapy_dist.config.components import (
    ComponentsConfig,
    DupefilterConfig,
    ItemsConfig,
    MetricsConfig,
    SeedsConfig,
    SpiderConfig,
    StatsConfig,
    components_config,
    dupefilter_config,
    items_config,
    metrics_config,
    seeds_config,
    spider_config,
    stats_config,
)
from scrapy_dist.config.reading import settings_final, with_defaults
from scrapy_dist.config.scheduling import (
    FrontierConfig,
    KeysConfig,
    PolitenessConfig,
    QueueConfig,
    ReplicationConfig,
    RequestsConfig,
    SchedulerConfig,
    WorkersConfig,
    frontier_config,
    keys_config,
    politeness_config,
    queue_config,
    replication_config,
    requests_config,
    scheduler_config,
    workers_config,
)
from scrapy_dist.config.topology import ConnectionConfig, connection_config
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from scrapy.crawler import Crawler

_T = TypeVar("_T")


class _CheckedSettings(BaseSettings):
    """Settings whose typed getters raise :class:`ConfigurationError` naming the setting
    and its value (Scrapy's raise a bare ``ValueError``: ``-s
    SCHEDULER_WORKER_TIMEOUT=abc`` ended a worker or a command with a traceback that
    named no setting)."""

    def _typed(self, kind: str, name: Any, read: Callable[[], _T]) -> _T:
        try:
            return read()
        except (ValueError, TypeError, OverflowError) as e:
            raise ConfigurationError(f"{name} = {self.get(name)!r} is not {kind} ({e})") from None

    def getbool(self, name: Any, default: bool = False) -> bool:
        return self._typed(
            "a boolean", name, lambda: super(_CheckedSettings, self).getbool(name, default)
        )

    def getint(self, name: Any, default: int = 0) -> int:
        return self._typed(
            "an integer", name, lambda: super(_CheckedSettings, self).getint(name, default)
        )

    def getfloat(self, name: Any, default: float = 0.0) -> float:
        return self._typed(
            "a number", name, lambda: super(_CheckedSettings, self).getfloat(name, default)
        )

    def getlist(self, name: Any, default: Any = None) -> list[Any]:
        return self._typed(
            "a list", name, lambda: super(_CheckedSettings, self).getlist(name, default)
        )

    def getdict(self, name: Any, default: Any = None) -> dict[Any, Any]:
        return self._typed(
            "a dict", name, lambda: super(_CheckedSettings, self).getdict(name, default)
        )


class Config:
    """scrapy_dist's settings of one crawler (or one CLI run), frozen.

    Build it with :meth:`from_crawler` or :meth:`from_settings`; each section (see the
    module docstring) is parsed and validated the first time it is read.

    Raises (on reading a section):
        ConfigurationError: a setting of that section is invalid; the message names it.
    """

    _settings: BaseSettings

    def __init__(self, settings: BaseSettings) -> None:
        resolved = _CheckedSettings()
        resolved.update(with_defaults(settings))  # (each setting keeps its priority)
        resolved.freeze()
        object.__setattr__(self, "_settings", resolved)

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: Config is frozen")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}: Config is frozen")

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Config:
        """The config of ``settings`` (a project's, for the CLI), with the defaults."""
        return cls(settings)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Config:
        """The config of the crawler's final settings. Call it once per crawler (through
        :func:`scrapy_dist.assembly.assemble`).

        Raises:
            RuntimeError: the settings are not final yet (read from a spider's
                ``__init__``/``from_crawler``, before Scrapy applied the add-ons); read
                them from ``spider_opened`` on.
        """
        if not settings_final(crawler):
            raise RuntimeError(
                "scrapy_dist settings were read before Scrapy applied the add-ons (from a "
                "spider's __init__ or from_crawler); read them from spider_opened on"
            )
        return cls(crawler.settings)

    def with_values(self, values: Mapping[str, Any]) -> Config:
        """A new config of the same settings with ``values`` (setting name -> value)
        overriding them, e.g. to read a crawl another configuration wrote."""
        settings = self._settings.copy()
        settings.frozen = False
        settings.update(dict(values), priority=100)
        return Config(settings)

    @property
    def settings(self) -> BaseSettings:
        """The settings read, frozen, with scrapy_dist's defaults (for Scrapy's own
        settings and code that still takes settings)."""
        return self._settings

    @cached_property
    def connection(self) -> ConnectionConfig:
        return connection_config(self.settings)

    @cached_property
    def keys(self) -> KeysConfig:
        return keys_config(self.settings)

    @cached_property
    def components(self) -> ComponentsConfig:
        return components_config(self.settings)

    @cached_property
    def queue(self) -> QueueConfig:
        return queue_config(self.settings)

    @cached_property
    def frontier(self) -> FrontierConfig:
        return frontier_config(self.settings)

    @cached_property
    def workers(self) -> WorkersConfig:
        return workers_config(self.settings)

    @cached_property
    def replication(self) -> ReplicationConfig:
        return replication_config(self.settings)

    @cached_property
    def scheduler(self) -> SchedulerConfig:
        return scheduler_config(self.settings, self.workers, self.frontier)

    @cached_property
    def requests(self) -> RequestsConfig:
        return requests_config(self.settings)

    @cached_property
    def seeds(self) -> SeedsConfig:
        return seeds_config(self.settings)

    @cached_property
    def spider(self) -> SpiderConfig:
        return spider_config(self.settings)

    @cached_property
    def dupefilter(self) -> DupefilterConfig:
        return dupefilter_config(self.settings)

    @cached_property
    def items(self) -> ItemsConfig:
        return items_config(self.settings)

    @cached_property
    def stats(self) -> StatsConfig:
        return stats_config(self.settings)

    @cached_property
    def metrics(self) -> MetricsConfig:
        return metrics_config(self.settings)

    @cached_property
    def politeness(self) -> PolitenessConfig:
        return politeness_config(self.settings)

    def validate(self) -> Config:
        """Parse every section now (e.g. for a CLI check); return ``self``.

        Raises:
            ConfigurationError: the first invalid setting.
        """
        for name in SECTIONS:
            getattr(self, name)
        return self


#: The sections of :class:`Config`, in the order :meth:`Config.validate` reads them.
SECTIONS = (
    "connection",
    "keys",
    "components",
    "queue",
    "frontier",
    "workers",
    "replication",
    "scheduler",
    "requests",
    "seeds",
    "spider",
    "dupefilter",
    "items",
    "stats",
    "metrics",
    "politeness",
)
