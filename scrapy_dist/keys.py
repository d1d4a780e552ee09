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

Over 600 lines on purpose: this is the one owner of every key name, and the table
below is the crawl's whole layout in Redis; split, a key's name and its neighbours'
would be read in different places.

=========================  ===========  ==============================================
key                        type         holds
=========================  ===========  ==============================================
``<crawl>:start_urls``     list/set/    seeds pushed by users (raw URL or JSON object)
                           zset
``<crawl>:requests``       string /     the shared frontier: the priority queue's marker
                           list         (:data:`LEVELS_MARKER`), or the FIFO/LIFO list
                                        of ``<id><payload>`` entries
``<requests>:levels``      zset         priority queue: level name -> score (-priority)
                                        of each level that holds entries (the index)
``<requests>:level:<n>``   list         priority queue: the ``<id><payload>`` entries of
                                        level ``<n>`` (:func:`level_name`), oldest at
                                        the head
``<requests>:ready``       zset         queue per slot: slot -> best level score, the
                                        slots whose next request may go now
``<requests>:wait``        zset         queue per slot: slot -> server time its delay
                                        allows the next send (may hold empty slots)
``<requests>:resting``     zset         queue per slot: slot emptied by a reserve ->
                                        the time its delay ends
``<requests>:queued``      string       queue per slot: entries queued, all slots
``<requests>:delays``      hash         queue per slot: slot -> robots.txt ``Crawl-delay``
                                        (s) where longer than the slot's own delay
``<requests>:slot:<s>``    (levels)     queue per slot: slot ``<s>``'s own levels,
                                        ``:levels`` and ``:level:<n>`` as above
``<requests>:unleased``    (as above)   the leased queue kept empty beside a
                                        scrapy-redis style ``SCHEDULER_QUEUE_CLASS``
``<crawl>:dupefilter``     set / hash   the dupefilter: raw fingerprints of requests ever
                           / BF         enqueued (``set`` backend), a Bloom chain's
                                        parameters and counts (bitmap Bloom), or a
                                        RedisBloom filter
``<dupefilter>:<s>:<i>``   string       bitmap Bloom: bits of stage ``s``, segment ``i``
``<dupefilter>:<run>:<g>`` hash / BF    with ``DUPEFILTER_RECRAWL_AFTER``: generation ``g``
                                        of a windowed Bloom filter (bitmap chain hash,
                                        its segments ``<...>:<g>:<s>:<i>``; or a
                                        RedisBloom filter), expiring with it
``<crawl>:seq``            string       counter giving each queued entry its id
``<crawl>:holders``        zset         worker id -> deadline of the leases it holds
                                        (one for all: every reserve and renewal
                                        extends it)
``<holders>:<worker>``     hash         a worker's holding: lease id ->
                                        ``origin|score|data`` of each entry it holds
                                        (``lua/_leases.lua``)
``<crawl>:deliveries``     hash         lease id -> times handed to a worker, for an
                                        entry delivered more than once
``<crawl>:leases``,        zset, hash,  the previous version's leases (lease id ->
``<crawl>:leased``,        set          deadline; lease id -> ``origin|score|worker|
``<crawl>:held:<worker>``               entry``; a worker's lease ids): reclaimed when
                                        they expire, never written
``<crawl>:epoch``          string       random id written by the crawl's first worker;
                                        every frontier write checks it (a crawl that
                                        finished, was flushed or evicted has none)
``<crawl>:starts``         set          fingerprints of the start requests of a plain
                                        spider queued in this run of the crawl (the
                                        first worker to add one crawls it; the n-th
                                        of one fingerprint is ``<fp>:<n>``)
``<crawl>:progress``       hash         crawl counters (done, retried, dead) and the
                                        completion state (idle_since, finished_at,
                                        finished_epoch: the run last marked finished)
``<crawl>:workers``        hash         worker id -> last heartbeat (server time, s)
``<crawl>:dead``           list         JSON records of seeds/requests that failed
``<crawl>:items``          list         items as JSON lines (``RedisPipeline``;
                                        ``REDIS_ITEMS_KEY`` may name another key)
``<crawl>:stats``          hash         crawl-wide stats of every worker, typed
                                        (``RedisStatsCollector``)
``<crawl>:timeline``       zset         second -> ``"<s> <pages> <items>"`` samples of
                                        the stats' totals, for crawl rates
``<crawl>:control``        hash         the crawl's control state: ``state`` (running,
                                        paused, draining), ``by``, ``reason``,
                                        ``since`` (:mod:`scrapy_dist.control`)
``<crawl>:control:log``    list         the control state's audit trail: one JSON
                                        record per change, newest first, capped
                                        (:mod:`scrapy_dist.control`)
``<crawl>:history``        list         the crawl's history: ``"<s> <pages> <items>
                                        <done> <queued> <leased> <dead>"`` samples,
                                        newest first, one per few seconds, capped
                                        (``lua/heartbeat.lua``, read by
                                        :mod:`scrapy_dist.web`)
``<crawl>:workers:figures`` hash        worker id -> ``"<s> <pages> <items>
                                        <buffered>"``, the worker's own figures at its
                                        last heartbeat (``lua/heartbeat.lua``)
``<crawl>:items:stream``   stream       items as stream entries (``RedisStreamPipeline``;
                                        ``REDIS_ITEMS_STREAM_KEY`` may name another key)
``<stream>:dead-letters``  stream       items consumers rejected or failed too often,
                                        with the reason (:mod:`scrapy_dist.streams`)
``<crawl>:shards``         string       ``SCHEDULER_SHARDS`` of a sharded crawl (absent:
                                        one shard), checked by every worker at open
``<crawl>:polite:tokens``  zset         politeness tokens ``<token>|<slot>`` -> deadline
``<crawl>:polite:busy``    zset         index of the politeness tokens by slot (score 0,
                                        ``<sha1 of slot>:<u|s>|<token>|<slot>``)
``<crawl>:polite:next``    zset         download slot -> send time of its next turn
                                        (server ms)
``<crawl>:polite:refused`` hash         download slot -> ``<server ms>|<n>|<worker>``,
                                        the worker refused it last and the tokens kept
                                        for it, for a moment
``<crawl>:robots``         hash         site -> the robots.txt one worker fetched
                                        (``b"1|<s>|<status>|" + zlib(body)``,
                                        :mod:`scrapy_dist.robots`)
``<crawl>:slots:paused``   zset         download slot -> server ms its pause ends (a
                                        Retry-After or a run of 429/503 responses,
                                        :mod:`scrapy_dist.worker.pauses`)
``<crawl>:slots:sent``     zset         download slot -> requests the crawl sent of it
                                        (:mod:`scrapy_dist.worker.slot_counts`)
``<crawl>:slots:counts``   hash         ``<count>:<slot>`` -> the crawl's pages, 4xx,
                                        5xx, failed (and started) requests of the slot
``<key>:wrongtype``        (any)        a key of the crawl found holding another type
                                        (written by hand), renamed out of the way by a
                                        script (:func:`set_aside_key`): kept for the
                                        operator to inspect and delete
=========================  ===========  ==============================================

A sharded crawl (``SCHEDULER_SHARDS = N > 1``, :func:`shard_keys`) keeps the keys above
as shard 0, and adds shards ``1..N-1``, each a crawl name of its own,
``<crawl>#shard<i>`` (``{books#shard<i>}`` or ``{books#shard<i>.<k>}`` under a hash tag,
``k`` chosen so that the shards' slots fall in different N-ths of the slot space, which
a cluster's masters usually own): each has its own ``requests``, ``dupefilter``,
``seq``, ``holders``, ``holders:<worker>``, ``deliveries``, ``epoch``,
``progress`` (its counters) and ``dead``. Seeds, workers, items and stats stay in shard 0.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import redis
from redis.crc import key_slot

from scrapy_dist.config.core import Config
from scrapy_dist.config.topology import CLUSTER
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.settings import BaseSettings

    from scrapy_dist.config.scheduling import KeysConfig

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


#: What a priority queue's key holds (a string): its entries are in levels, lists named
#: :func:`level_key`, indexed by :func:`levels_key`. A previous version of scrapy_dist,
#: whose priority queue was a zset at that key, fails on it with WRONGTYPE instead of
#: reading an empty queue (docs/migration.md).
LEVELS_MARKER = "scrapy_dist priority queue in levels, v1"
#: What a queue per download slot's key holds (a string); its entries are in one levels
#: queue per slot, :func:`slot_queue_key` (``lua/_levels.lua``'s slots section).
SLOTS_MARKER = "scrapy_dist queue per download slot, v1"
#: Infix of a queue per slot's levels queue of one slot: ``<queue>:slot:<slot>``.
SLOT_INFIX = ":slot:"
#: Suffix of a queue per slot's index of ready slots (slot -> best level score).
SLOTS_READY_SUFFIX = ":ready"
#: Suffix of a queue per slot's index of waiting slots (slot -> ready at, server s).
SLOTS_WAIT_SUFFIX = ":wait"
#: Suffix of a queue per slot's index of slots with a delay a reserve emptied (slot ->
#: the time their delay ends: a request queued for one before then waits for it).
SLOTS_REST_SUFFIX = ":resting"
#: Suffix of a queue per slot's count of entries queued in all slots.
SLOTS_QUEUED_SUFFIX = ":queued"
#: Suffix of a queue per slot's hash of robots.txt ``Crawl-delay`` (slot -> seconds).
SLOTS_DELAYS_SUFFIX = ":delays"
#: The indexes and the count of a queue per slot (suffixes of its key).
SLOTS_SUFFIXES = (
    SLOTS_READY_SUFFIX,
    SLOTS_WAIT_SUFFIX,
    SLOTS_REST_SUFFIX,
    SLOTS_QUEUED_SUFFIX,
    SLOTS_DELAYS_SUFFIX,
)
#: Suffix of the crawl's holders zset, ``<crawl>:holders``; a worker's holding is
#: ``<crawl>:holders:<worker>``.
HOLDERS_SUFFIX = ":holders"
#: Suffix of a priority queue's index of levels: ``<queue>:levels``.
LEVELS_SUFFIX = ":levels"
#: Infix of a priority queue's level lists: ``<queue>:level:<name>``.
LEVEL_INFIX = ":level:"
#: Suffix of a name no key ever has, read by scripts to learn whether the crawl's hash
#: slot is being moved to another cluster node (``slot_moving`` in ``lua/_fence.lua``):
#: ``<key>:slot-probe`` for one of the script's keys, so in the same slot.
SLOT_PROBE_SUFFIX = ":slot-probe"
#: How a level's name is written from its score (C's and Lua's ``%.17g``: exact for
#: every integer priority; ``-0`` is written ``0``).
LEVEL_FORMAT = "%.17g"


def levels_key(queue: str) -> str:
    """The index of the levels of priority queue ``queue``: ``<queue>:levels``, a zset of
    level name -> score (``lua/_levels.lua`` builds the same name)."""
    return queue + LEVELS_SUFFIX


def slots_index_keys(queue: str) -> list[str]:
    """The indexes and the count of queue per slot ``queue`` (``<queue>:ready``,
    ``:wait``, ``:resting``, ``:queued``, ``:delays``); its slots' levels are named by
    :func:`slot_queue_key`."""
    return [queue + suffix for suffix in SLOTS_SUFFIXES]


def slot_queue_key(queue: str, slot: str) -> str:
    """The levels queue of slot ``slot`` (escaped, :func:`slot_id`) in queue per slot
    ``queue``: ``<queue>:slot:<slot>`` (no key itself: its ``:levels`` and
    ``:level:<n>`` are)."""
    return queue + SLOT_INFIX + slot


def slot_id(slot: str) -> str:
    """A download slot's name as a queue per slot stores it: ``%`` and ``|`` escaped
    (``%25``, ``%7C``), so that it fits a lease record's ``|``-separated fields."""
    return slot.replace("%", "%25").replace("|", "%7C")


def slot_name(stored: str) -> str:
    """A download slot's name as Scrapy gives it, from :func:`slot_id`'s form."""
    return stored.replace("%7C", "|").replace("%25", "%")


def level_name(score: float) -> str:
    """The name of the level of score ``score`` (``-priority``)."""
    return LEVEL_FORMAT % (score if score != 0 else 0.0)


def level_key(queue: str, name: str) -> str:
    """Level ``name`` of priority queue ``queue``: ``<queue>:level:<name>``, a list of
    entries (``lua/_levels.lua`` builds the same names, with the queue's hash tag)."""
    return queue + LEVEL_INFIX + name


#: What a frontier script renames a key of the wrong type to (written by hand:
#: ``SET <crawl>:seq junk``), ``lua/_levels.lua`` set_aside: ``<key>:wrongtype``, or
#: ``<key>:wrongtype:<n>`` (``n`` from 2) when that is taken.
SET_ASIDE_SUFFIX = ":wrongtype"


def set_aside_key(key: str, n: int = 1) -> str:
    """The ``n``-th name ``key`` is set aside under (:data:`SET_ASIDE_SUFFIX`)."""
    return key + SET_ASIDE_SUFFIX + ("" if n == 1 else f":{n}")


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
    def request_levels(self) -> str:
        """The priority queue's index of levels (:func:`levels_key`); the levels
        themselves are :func:`level_key` of :attr:`requests`."""
        return levels_key(self.requests)

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
    def holders(self) -> str:
        return f"{self.crawl}{HOLDERS_SUFFIX}"

    def holding(self, worker: str) -> str:
        """The leases worker ``worker`` holds (``lua/_leases.lua`` names it alike)."""
        return f"{self.holders}:{worker}"

    @property
    def leases(self) -> str:
        """The previous version's leases zset (only reclaimed and counted)."""
        return f"{self.crawl}:leases"

    @property
    def leased(self) -> str:
        """The previous version's leased hash (only reclaimed)."""
        return f"{self.crawl}:leased"

    @property
    def deliveries(self) -> str:
        return f"{self.crawl}:deliveries"

    def held(self, worker: str) -> str:
        """The previous version's lease index of worker ``worker`` (expires by itself)."""
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

    @property
    def control(self) -> str:
        """The crawl's control state (pause, drain; :mod:`scrapy_dist.control`)."""
        return f"{self.crawl}:control"

    @property
    def control_log(self) -> str:
        """The control state's audit trail (:mod:`scrapy_dist.control`)."""
        return f"{self.crawl}:control:log"

    @property
    def history(self) -> str:
        """The crawl's history samples, newest first (``lua/heartbeat.lua``)."""
        return f"{self.crawl}:history"

    @property
    def worker_figures(self) -> str:
        """Each worker's own figures at its last heartbeat (``lua/heartbeat.lua``)."""
        return f"{self.crawl}:workers:figures"

    @property
    def items_stream(self) -> str:
        """The items stream under the default ``REDIS_ITEMS_STREAM_KEY``."""
        return f"{self.crawl}:items:stream"

    @property
    def items_stream_dead(self) -> str:
        """The dead-letter stream of :attr:`items_stream` (:func:`stream_dead_key`)."""
        return stream_dead_key(self.items_stream)

    @property
    def shards(self) -> str:
        """The shard count of a sharded crawl (absent: one shard)."""
        return f"{self.crawl}:shards"

    @property
    def politeness_tokens(self) -> str:
        """Cluster-wide politeness: the download tokens granted, member
        ``<token>|<slot>`` -> deadline (server ms; :mod:`scrapy_dist.politeness`)."""
        return f"{self.crawl}:polite:tokens"

    @property
    def politeness_busy(self) -> str:
        """Cluster-wide politeness: the index of the tokens outstanding by download slot,
        every score 0, member ``<sha1 of slot>:<u|s>|<token>|<slot>`` (``u``: a turn not
        confirmed sent), so that ``ZLEXCOUNT`` counts a slot's tokens."""
        return f"{self.crawl}:polite:busy"

    @property
    def robots(self) -> str:
        """Site (``scheme://netloc``) -> the robots.txt a worker fetched, shared with
        the others (:mod:`scrapy_dist.robots`)."""
        return f"{self.crawl}:robots"

    @property
    def slot_pauses(self) -> str:
        """Download slot -> server time (ms) its pause ends, for every worker
        (:mod:`scrapy_dist.worker.pauses`)."""
        return f"{self.crawl}:slots:paused"

    @property
    def slot_sent(self) -> str:
        """Download slot -> requests the crawl sent of it, which ranks the slots
        (:mod:`scrapy_dist.worker.slot_counts`)."""
        return f"{self.crawl}:slots:sent"

    @property
    def slot_counts(self) -> str:
        """``<count>:<slot>`` -> the crawl's pages, 4xx, 5xx and failed requests of a
        download slot (:mod:`scrapy_dist.worker.slot_counts`)."""
        return f"{self.crawl}:slots:counts"

    @property
    def politeness_next(self) -> str:
        """Cluster-wide politeness: download slot -> earliest send time of its next turn
        (server ms; kept a token timeout after it passed)."""
        return f"{self.crawl}:polite:next"

    @property
    def politeness_refused(self) -> str:
        """Cluster-wide politeness: download slot -> ``<server ms>|<n>|<worker>``, the
        worker refused the slot last while it held less than half its concurrency and
        the tokens kept for it (a mark that lasts a moment; :mod:`scrapy_dist.politeness`)."""
        return f"{self.crawl}:polite:refused"

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
            self.requests, self.seq, self.holders, self.leases, self.leased, self.deliveries,
            self.epoch, self.starts, self.shards,
        )  # fmt: skip

    def start_urls_key(self, template: str) -> str:
        """Expand a spider's own ``redis_key`` template for this crawl; when the crawl
        name is hash-tagged (``{books}``), a literal key that starts with the crawl name
        and a colon (``books:start_urls``) gets the tag too (``{books}:start_urls``), so
        every key of a list-form ``redis_key`` lands in the crawl's slot."""
        seeds = expand(template, self.crawl, setting="redis_key")
        if self.crawl.startswith("{") and self.crawl.endswith("}"):
            plain = self.crawl[1:-1]
            if not has_hash_tag(seeds) and seeds.startswith(f"{plain}:"):
                seeds = self.crawl + seeds[len(plain) :]
        return seeds

    def untagged(self, key: str) -> str | None:
        """``key`` without the crawl's Cluster hash tag (``{books}:start_urls`` ->
        ``books:start_urls``: where scrapy-redis users push seeds), or ``None`` when the
        crawl name is not hash-tagged or ``key`` is not one of its keys."""
        crawl = self.crawl
        tagged = isinstance(crawl, str) and crawl.startswith("{") and crawl.endswith("}")
        if not tagged or not key.startswith(crawl):
            return None
        return crawl[1:-1] + key[len(crawl) :]

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


def stream_dead_key(stream: str) -> str:
    """The dead-letter stream of an items stream: ``<stream>:dead-letters`` (same hash
    tag; not ``:dead``, which names a crawl's dead-letter list to ``scrapy-dist jobs``)."""
    return f"{stream}:dead-letters"


def standalone_dupefilter_key(timestamp: int) -> str:
    """The key of a dupefilter used under another scheduler than scrapy_dist's, one per
    run: ``dupefilter:<timestamp>:<16 random hex digits>`` (scrapy-redis's
    ``dupefilter:<timestamp>`` was shared by two runs started in the same second, and
    the second skipped the pages the first had seen)."""
    return f"dupefilter:{timestamp}:{secrets.token_hex(8)}"


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
    names = [
        *keys.every(),
        keys.holding("worker"),
        keys.bloom_segment(0, 0),
        level_key(keys.requests, "0"),
        *extra,
    ]
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
        keys = replace(keys, start_urls=keys.start_urls_key(str(template)))
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


_HINTS = {
    "seeds": {
        "set": "set REDIS_START_URLS_AS_SET = True",
        "zset": "set REDIS_START_URLS_AS_ZSET = True",
        "list": "unset REDIS_START_URLS_AS_SET and REDIS_START_URLS_AS_ZSET",
    },
    "queue": {
        "string": "SCHEDULER_QUEUE_CLASS = 'scrapy_dist.queue.PriorityQueue'",
        "zset": "SCHEDULER_QUEUE_CLASS = 'scrapy_dist.queue.PriorityQueue'",
        "list": "SCHEDULER_QUEUE_CLASS = 'scrapy_dist.queue.FifoQueue' (or LifoQueue)",
    },
}


def check_type(key: str, actual: str, expected: str | tuple[str, ...], role: str) -> None:
    """Make sure ``key`` is absent or of the ``expected`` type (or one of them).

    Raises:
        ConfigurationError: it holds another type; the message names the key, both
            types and, for the seeds and the queue, the setting that fits what it holds.
    """

    def explain(actual: str) -> str:
        hint = _HINTS.get(role, {}).get(actual)
        advice = f"; if that is right, {hint}" if hint else ""
        wanted = expected if isinstance(expected, str) else " or ".join(expected)
        return (
            f"Redis key {key!r} ({role}) holds a {actual}, but these settings expect a "
            f"{wanted}{advice}"
        )

    expect_type(key, actual, expected, explain)


#: Slots of a Redis Cluster.
SLOTS = 16384


def shard_crawl(crawl: str, index: int, count: int) -> str:
    """The crawl name of shard ``index`` (of ``count``) of crawl ``crawl``: ``crawl``
    itself for shard 0, else ``<crawl>#shard<i>``; a hash-tagged crawl gets a tag of its
    own per shard, ``{<name>#shard<i>}`` (or ``{<name>#shard<i>.<k>}`` with the least
    ``k`` that puts its slot in the ``(s0 + i) % count``-th part of the slot space, ``s0``
    being shard 0's), so a cluster whose masters own equal slot ranges holds one shard
    per master (stable: it depends only on the names)."""
    if index == 0:
        return crawl
    if not (crawl.startswith("{") and crawl.endswith("}")):
        return f"{crawl}#shard{index}"
    inner = crawl[1:-1]
    want = (slot_of(crawl) * count // SLOTS + index) % count
    for k in range(100000):
        name = f"{{{inner}#shard{index}" + (f".{k}}}" if k else "}")
        if slot_of(name) * count // SLOTS == want:
            return name
    return f"{{{inner}#shard{index}}}"  # pragma: no cover - some k always fits


def shard_keys(keys: RedisKeys, config: KeysConfig, count: int) -> list[RedisKeys]:
    """The keys of each of ``count`` shards of a crawl: shard 0 is ``keys`` itself; the
    others expand the queue and dupefilter templates for their own crawl name (their
    ``start_urls`` is never written: seeds stay in shard 0)."""
    out = [keys]
    for index in range(1, count):
        crawl = shard_crawl(keys.crawl, index, count)
        out.append(
            RedisKeys(
                crawl=crawl,
                requests=expand(config.requests, crawl, setting="SCHEDULER_QUEUE_KEY"),
                dupefilter=expand(config.dupefilter, crawl, setting="SCHEDULER_DUPEFILTER_KEY"),
                start_urls=f"{crawl}:start_urls",
            )
        )
    return out


def is_shard_crawl(crawl: str) -> bool:
    """Whether ``crawl`` (with or without its hash tag) names shard ``i > 0`` of a
    sharded crawl (:func:`shard_crawl`), not a crawl of its own."""
    return re.search(r"#shard[1-9][0-9]*(\.[0-9]+)?\}?$", crawl) is not None


def window_generation_key(dupefilter: str, run: str, generation: int) -> str:
    """Generation ``generation`` of a Bloom dupefilter with a recrawl window
    (``DUPEFILTER_RECRAWL_AFTER``): ``<dupefilter>:<run>:<generation>``, ``run`` being
    the id the filter's main hash got when created (so a deleted filter's generations,
    left to expire, are never read again). A bitmap generation is a chain hash whose
    segments are :func:`window_segment_key`; a RedisBloom one is a ``BF`` filter.
    ``lua/_filters.lua`` builds the same names."""
    return f"{dupefilter}:{run}:{generation}"


def window_segment_key(generation_key: str, stage: int, segment: int) -> str:
    """Bits of stage ``stage``, segment ``segment`` of a windowed bitmap generation:
    ``<generation>:<stage>:<segment>``."""
    return f"{generation_key}:{stage}:{segment}"


def window_bucket_count_key(dupefilter: str, gen: str, generation: int) -> str:
    """Fingerprints recorded in generation ``generation`` of a ``buckets`` dupefilter
    with a recrawl window (its buckets are ``<dupefilter>:<gen>-<generation>:<i>``):
    ``<dupefilter>:<gen>-<generation>:n``."""
    return f"{dupefilter}:{gen}-{generation}:n"
