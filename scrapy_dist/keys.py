"""Every Redis key name, built in one place.

A *crawl* is the spider name, or ``<spider>:<job>`` when ``SCHEDULER_JOB_ID`` or
``SCHEDULER_JOB_TIMESTAMP`` isolates runs, so ``books:20261122:requests`` and
``books:20261123:requests`` never meet. Key templates (scrapy-redis's settings) take the
crawl name as ``%(spider)s``; ``%(name)s`` is accepted as the same value.

Under Redis Cluster (or with ``REDIS_KEY_HASH_TAG = True``) the crawl name is wrapped in
a hash tag, ``{books}`` or ``{books:20261122}``, so every key of a crawl
(``{books}:requests``, ``{books}:start_urls``...) hashes to one slot and lives on one
node: the frontier's scripts touch several keys at once, which a cluster allows only
within one slot. :func:`crawl_slot` checks it when the crawl opens. Users push seeds to
the tagged key: ``redis-cli -c lpush '{books}:start_urls' URL`` (or ``scrapy-dist push``).

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
``<crawl>:starts``         set          fingerprints of the start requests of a plain
                                        spider queued in this run of the crawl (the
                                        first worker to add one crawls it)
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
from typing import TYPE_CHECKING, Any

import redis
from redis.crc import key_slot

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.settings import CLUSTER, Config, KeysConfig

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)


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


def bucket_key(dupefilter: str, gen: str, index: int) -> str:
    """Bucket ``index`` of generation ``gen`` of a ``buckets`` dupefilter:
    ``<dupefilter>:<gen>:<index>``, next to the dupefilter key like a Bloom segment (so
    a Cluster hash tag applies, and ``scrapy-dist reset`` finds both with one pattern).
    ``lua/_filters.lua`` builds the same names."""
    return f"{dupefilter}:{gen}:{index}"


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
    def starts(self) -> str:
        return f"{self.crawl}:starts"

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
        return (
            self.requests, self.seq, self.leases, self.leased, self.deliveries, self.epoch,
            self.starts,
        )  # fmt: skip

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
        hash_tag: bool = False,
    ) -> RedisKeys:
        """Build the keys of spider ``spider``'s crawl, isolated by ``job`` if given, the
        crawl name wrapped in a Cluster hash tag with ``hash_tag`` (unless it has one)."""
        if not spider:
            raise ConfigurationError("a crawl needs a spider name to build its Redis keys")
        crawl = f"{spider}:{job}" if job else spider
        if hash_tag and not has_hash_tag(crawl):
            crawl = f"{{{crawl}}}"
        return cls(
            crawl=crawl,
            requests=expand(requests, crawl, setting="SCHEDULER_QUEUE_KEY"),
            dupefilter=expand(dupefilter, crawl, setting="SCHEDULER_DUPEFILTER_KEY"),
            start_urls=expand(start_urls, crawl, setting="REDIS_START_URLS_KEY"),
        )


def has_hash_tag(name: str) -> bool:
    """Whether ``name`` has a Redis Cluster hash tag (a ``{...}`` with something inside,
    the first ``{`` and the first ``}`` after it), which then decides its slot."""
    start = name.find("{")
    if start < 0:
        return False
    end = name.find("}", start + 1)
    return end > start + 1


def hash_tag_on(config: Config) -> bool:
    """Whether the crawl names get a hash tag: ``REDIS_KEY_HASH_TAG``, or by default
    whether the settings name a Redis Cluster."""
    if config.keys.hash_tag is not None:
        return config.keys.hash_tag
    return config.connection.topology == CLUSTER


def slot_of(key: str | bytes) -> int:
    """The Redis Cluster hash slot of ``key`` (CRC16 of its hash tag or whole name)."""
    return int(key_slot(key.encode() if isinstance(key, str) else key))


def crawl_slot(keys: RedisKeys, extra: Sequence[str] = ()) -> int:
    """The one hash slot of every key of the crawl: :meth:`RedisKeys.every`, a worker's
    lease index, a Bloom segment, and ``extra`` (the items key...).

    Raises:
        ConfigurationError: some keys hash to another slot than the frontier's (a key
            template or ``redis_key`` without the crawl name's hash tag); the message
            names them and the fix.
    """
    names = [*keys.every(), keys.held("worker"), keys.bloom_segment(0, 0), *extra]
    slot = slot_of(keys.requests)
    stray = [name for name in dict.fromkeys(names) if slot_of(name) != slot]
    if stray:
        raise ConfigurationError(
            f"under Redis Cluster every key of crawl {keys.crawl!r} must hash to one slot "
            f"(the queue {keys.requests!r} is in slot {slot}), but "
            + ", ".join(f"{name!r} is in slot {slot_of(name)}" for name in stray)
            + ": put %(spider)s in the key templates (SCHEDULER_QUEUE_KEY, "
            "SCHEDULER_DUPEFILTER_KEY, REDIS_START_URLS_KEY, REDIS_ITEMS_KEY) and in the "
            "spider's redis_key, so they carry the crawl's hash tag "
            f"{keys.crawl.partition('}')[0] + '}'!r}"
        )
    return slot


def job_name(config: KeysConfig, now: datetime | None = None) -> str | None:
    """Return the job part of the crawl name (``SCHEDULER_JOB_ID``, or
    ``SCHEDULER_JOB_TIMESTAMP`` at ``now``, UTC), or ``None`` for none."""
    if config.job_timestamp:
        return (now or datetime.now(timezone.utc)).strftime(config.job_timestamp)
    return config.job_id


def keys_from_config(
    config: KeysConfig,
    spider: str,
    now: datetime | None = None,
    *,
    redis_key: Any = None,
    hash_tag: bool | None = None,
) -> RedisKeys:
    """Build the keys of spider ``spider``'s crawl from the key settings.

    Args:
        config: the key settings.
        spider: the spider name.
        now: when the job stamp is taken (``SCHEDULER_JOB_TIMESTAMP``); default: now.
        redis_key: the spider's ``redis_key`` (a template, or a list of them whose first
            is the main one), naming its seeds key instead of ``REDIS_START_URLS_KEY``.
            With a hash tag, a literal ``redis_key`` that starts with the crawl name and a
            colon (``books:start_urls``) gets the tag too (``{books}:start_urls``).
        hash_tag: wrap the crawl name in a hash tag (``None``: ``REDIS_KEY_HASH_TAG``, else
            not; see :func:`hash_tag_on`).
    """
    tag = bool(config.hash_tag if hash_tag is None else hash_tag)
    keys = RedisKeys.build(
        spider,
        job=job_name(config, now),
        requests=config.requests,
        dupefilter=config.dupefilter,
        start_urls=config.start_urls,
        hash_tag=tag,
    )
    template = redis_key
    if isinstance(template, (list, tuple)):  # keys in priority order: the first is the main
        template = template[0] if template else None
    if template and isinstance(template, str):
        seeds = keys.start_urls_key(str(template))
        plain = keys.crawl[1:-1] if tag and keys.crawl.startswith("{") else None
        if plain and not has_hash_tag(seeds) and seeds.startswith(f"{plain}:"):
            seeds = keys.crawl + seeds[len(plain) :]
        keys = replace(keys, start_urls=seeds)
    return keys


def keys_from_settings(
    settings: BaseSettings, spider: str, now: datetime | None = None
) -> RedisKeys:
    """Build a crawl's keys from settings (for code without a crawler; a crawler's
    components share its keys, :func:`scrapy_dist.assembly.assemble`).

    Raises:
        ConfigurationError: invalid key settings.
    """
    config = Config.from_settings(settings)
    return keys_from_config(config.keys, spider, now, hash_tag=hash_tag_on(config))


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


def key_type(client: redis.Redis, key: str) -> str:
    """The Redis type of ``key`` (``"none"`` when it does not exist)."""
    actual = client.type(key)
    return actual.decode() if isinstance(actual, bytes) else str(actual)


def expect_type(
    key: str, actual: str, expected: str | tuple[str, ...], explain: Callable[[str], str]
) -> None:
    """Make sure ``key``, of type ``actual`` (see :func:`key_type`), is absent or of an
    ``expected`` type.

    Raises:
        ConfigurationError: it holds another type; the message is ``explain(actual)``.
    """
    wanted = (expected,) if isinstance(expected, str) else expected
    if actual not in ("none", *wanted):
        raise ConfigurationError(explain(actual))
