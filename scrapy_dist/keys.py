"""Every Redis key name, built in one place.

A *crawl* is the spider name, or ``<spider>:<job>`` when ``SCHEDULER_JOB_ID`` or
``SCHEDULER_JOB_TIMESTAMP`` isolates runs, so ``books:20261122:requests`` and
``books:20261123:requests`` never meet. Key templates (scrapy-redis's settings) take the
crawl name as ``%(spider)s``; ``%(name)s`` is accepted as the same value.

=========================  ===========  ==============================================
key                        type         holds
=========================  ===========  ==============================================
``<crawl>:start_urls``     list/set/    seeds pushed by users (raw URL or JSON object)
                           zset
``<crawl>:requests``       zset / list  the shared frontier: ``<id><payload>`` entries
``<crawl>:dupefilter``     set / hash   the dupefilter: raw fingerprints of requests ever
                           / BF         enqueued (``set`` backend), a Bloom chain's
                                        parameters and counts (bitmap Bloom), or a
                                        RedisBloom filter
``<dupefilter>:<s>:<i>``   string       bitmap Bloom: bits of stage ``s``, segment ``i``
``<crawl>:seq``            string       counter giving each queued entry its id
``<crawl>:leases``         zset         lease id -> deadline: entries a worker holds
``<crawl>:leased``         hash         lease id -> ``origin|score|worker|entry``
``<crawl>:deliveries``     hash         lease id -> times handed to a worker
``<crawl>:held:<worker>``  set          lease ids granted to one worker (its index, so
                                        release and renewal touch only its leases)
``<crawl>:epoch``          string       random id written by the crawl's first worker;
                                        every frontier write checks it (a crawl that
                                        finished, was flushed or evicted has none)
``<crawl>:progress``       hash         crawl counters (done, retried, dead) and the
                                        completion state (idle_since, finished_at)
``<crawl>:workers``        hash         worker id -> last heartbeat (server time, s)
``<crawl>:dead``           list         JSON records of seeds/requests that failed
``<crawl>:items``          list         items as JSON lines (``RedisPipeline``;
                                        ``REDIS_ITEMS_KEY`` may name another key)
``<crawl>:stats``          hash         crawl-wide stats of every worker, typed
                                        (``RedisStatsCollector``)
``<crawl>:timeline``       zset         second -> ``"<s> <pages> <items>"`` samples of
                                        the stats' totals, for crawl rates
=========================  ===========  ==============================================
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import redis

from scrapy_dist.addon import settings_for
from scrapy_dist.connection import client_for
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

_by_crawler: WeakKeyDictionary[Crawler, RedisKeys] = WeakKeyDictionary()


def expand(template: str, crawl: str, *, setting: str = "key template") -> str:
    """Fill a key template with the crawl name.

    Raises:
        ConfigurationError: the template has a placeholder other than ``%(spider)s``
            or ``%(name)s``.
    """
    try:
        return template % {"spider": crawl, "name": crawl}
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigurationError(
            f"{setting} {template!r} is not a valid key template: use %(spider)s "
            f"for the crawl name ({e})"
        ) from e


@dataclass(frozen=True)
class RedisKeys:
    """The key names of one crawl (see the module docstring for what each holds)."""

    #: The crawl name: the spider name, plus ``:<job>`` for an isolated job.
    crawl: str
    requests: str
    dupefilter: str
    start_urls: str

    @property
    def seq(self) -> str:
        return f"{self.crawl}:seq"

    @property
    def workers(self) -> str:
        return f"{self.crawl}:workers"

    @property
    def dead(self) -> str:
        return f"{self.crawl}:dead"

    @property
    def unleased(self) -> str:
        """The frontier's (always empty) request queue when ``SCHEDULER_QUEUE_CLASS`` is a
        scrapy-redis style queue, which owns ``requests`` and pops without leases."""
        return f"{self.requests}:unleased"

    def bloom_segment(self, stage: int, segment: int) -> str:
        """Bits of a bitmap Bloom dupefilter: stage ``stage``, segment ``segment``.

        ``<dupefilter>:<stage>:<segment>``, next to the dupefilter key (which then holds
        the chain's parameters and counts), so a custom ``SCHEDULER_DUPEFILTER_KEY``
        and a Cluster hash tag apply to the bits too.
        """
        return f"{self.dupefilter}:{stage}:{segment}"

    @property
    def leases(self) -> str:
        return f"{self.crawl}:leases"

    @property
    def leased(self) -> str:
        return f"{self.crawl}:leased"

    @property
    def deliveries(self) -> str:
        return f"{self.crawl}:deliveries"

    def held(self, worker: str) -> str:
        """The lease ids granted to worker ``worker`` (its lease index)."""
        return f"{self.crawl}:held:{worker}"

    @property
    def epoch(self) -> str:
        return f"{self.crawl}:epoch"

    @property
    def progress(self) -> str:
        return f"{self.crawl}:progress"

    @property
    def items(self) -> str:
        """The items list under the default ``REDIS_ITEMS_KEY`` (see :meth:`custom`)."""
        return f"{self.crawl}:items"

    @property
    def stats(self) -> str:
        return f"{self.crawl}:stats"

    @property
    def timeline(self) -> str:
        return f"{self.crawl}:timeline"

    def custom(self, template: str, setting: str) -> str:
        """Expand a key template setting such as ``REDIS_ITEMS_KEY`` for this crawl."""
        return expand(template, self.crawl, setting=setting)

    def every(self) -> tuple[str, ...]:
        """Every key this class names for the crawl: each field but ``crawl``, and each
        property (the dupefilter backend's extra keys aside), e.g. to reset the crawl."""
        names = [f.name for f in fields(self) if f.name != "crawl"]
        names += [n for n, v in vars(type(self)).items() if isinstance(v, property)]
        return tuple(dict.fromkeys(getattr(self, n) for n in names))

    def frontier(self) -> tuple[str, ...]:
        """Keys that make up the crawl's shared state, removed when it is flushed
        (the dupefilter backend adds its own keys to these)."""
        return (self.requests, self.seq, self.leases, self.leased, self.deliveries, self.epoch)

    def start_urls_key(self, template: str) -> str:
        """Expand a spider's own ``redis_key`` template for this crawl."""
        return expand(template, self.crawl, setting="redis_key")

    @classmethod
    def build(
        cls,
        spider: str,
        *,
        job: str | None = None,
        requests: str = "%(spider)s:requests",
        dupefilter: str = "%(spider)s:dupefilter",
        start_urls: str = "%(name)s:start_urls",
    ) -> RedisKeys:
        """Build the keys of spider ``spider``'s crawl, isolated by ``job`` if given."""
        if not spider:
            raise ConfigurationError("a crawl needs a spider name to build its Redis keys")
        crawl = f"{spider}:{job}" if job else spider
        return cls(
            crawl=crawl,
            requests=expand(requests, crawl, setting="SCHEDULER_QUEUE_KEY"),
            dupefilter=expand(dupefilter, crawl, setting="SCHEDULER_DUPEFILTER_KEY"),
            start_urls=expand(start_urls, crawl, setting="REDIS_START_URLS_KEY"),
        )


def job_from_settings(settings: BaseSettings, now: datetime | None = None) -> str | None:
    """Return the job part of the crawl name, fixed from the settings at ``now`` (UTC).

    Raises:
        ConfigurationError: both ``SCHEDULER_JOB_ID`` and ``SCHEDULER_JOB_TIMESTAMP`` are set.
    """
    job_id = settings.get("SCHEDULER_JOB_ID")
    pattern = settings.get("SCHEDULER_JOB_TIMESTAMP")
    if job_id and pattern:
        raise ConfigurationError(
            "SCHEDULER_JOB_ID and SCHEDULER_JOB_TIMESTAMP are both set; use one of them"
        )
    if pattern:
        return (now or datetime.now(timezone.utc)).strftime(str(pattern))
    return str(job_id) if job_id else None


def keys_from_settings(
    settings: BaseSettings, spider: str, now: datetime | None = None
) -> RedisKeys:
    """Build a crawl's keys from (already defaulted) settings; used by the CLI and crawlers."""
    return RedisKeys.build(
        spider,
        job=job_from_settings(settings, now),
        requests=settings["SCHEDULER_QUEUE_KEY"],
        dupefilter=settings["SCHEDULER_DUPEFILTER_KEY"],
        start_urls=settings["REDIS_START_URLS_KEY"],
    )


def keys_for(crawler: Crawler) -> RedisKeys:
    """Return the crawler's keys, computed once from its final settings, so every
    component and every later call agrees on the job stamp even if the crawl runs past
    a stamp boundary.

    The crawl is named after the spider *instance* (a spider may set its ``name`` in
    ``__init__``), and a spider's ``redis_key`` (a class attribute or ``-a redis_key=``)
    names its seeds key. With ``SCHEDULER_JOB_TIMESTAMP``, the stamp is taken from the
    Redis server's clock (one ``TIME`` call, here, the first time the keys are needed),
    so workers whose clocks disagree still join the same crawl.

    Raises:
        RuntimeError: the settings are not final yet (see
            :func:`scrapy_dist.addon.settings_for`).
    """
    try:
        return _by_crawler[crawler]
    except KeyError:
        pass
    settings = settings_for(crawler)
    spider = getattr(crawler, "spider", None)
    name = spider.name if spider is not None else crawler.spidercls.name
    now = server_time(client_for(crawler)) if settings.get("SCHEDULER_JOB_TIMESTAMP") else None
    keys = keys_from_settings(settings, name, now)
    template = getattr(spider, "redis_key", None)
    if isinstance(template, (list, tuple)):  # keys in priority order: the first is the main
        template = template[0] if template else None
    if template and isinstance(template, str):
        keys = replace(keys, start_urls=keys.start_urls_key(str(template)))
    _by_crawler[crawler] = keys
    return keys


def server_time(client: redis.Redis) -> datetime | None:
    """The Redis server's clock (UTC), or ``None`` (with a warning) if it cannot be read,
    in which case this worker's clock is used: the worker then fails its start-up check
    anyway if Redis stays unreachable."""
    try:
        seconds, micros = client.time()
    except redis.RedisError as e:
        logger.warning(
            "Cannot read the Redis server's clock for SCHEDULER_JOB_TIMESTAMP (%(error)s); "
            "using this worker's clock",
            {"error": e},
        )
        return None
    return datetime.fromtimestamp(seconds + micros / 1e6, timezone.utc)
