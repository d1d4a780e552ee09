"""Read a crawl's state from Redis: what ``scrapy-dist status`` shows and the metrics export.

Over ~600 lines on purpose: it is one concept, a crawl's state as read from Redis:
where its data lives (:class:`CrawlLayout`), the one pipelined read
(:func:`read_status`), what it found (:class:`CrawlStatus` and its JSON shape, which
``scrapy-dist status --json`` and the metrics export rely on) and a sharded crawl's
figures merged into one. What each part stores is decoded by that part's own module
(progress, filters, stats, control, the items stream).

:class:`CrawlLayout` names a crawl's keys and their Redis types from the same settings
and the same code the workers use (:func:`~scrapy_dist.keys.keys_from_config`, the
spider's ``redis_key``, the queue class and the seed mode). :func:`read_status` reads
everything in one pipelined round trip (plus the dupefilter's own state) and checks
each key's type, so a key of the wrong type is reported by name instead of failing
halfway. :mod:`scrapy_dist.metrics` renders a status for Prometheus; the command
finds the crawls present in Redis with ``SCAN`` (:mod:`scrapy_dist.cli._crawls`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, cast

from scrapy_dist.assembly import assemble
from scrapy_dist.bloom import parse_signature
from scrapy_dist.config.core import Config
from scrapy_dist.connection import describe
from scrapy_dist.control import ControlState, read_state
from scrapy_dist.filters import BackendChoice, BitmapBloomBackend, backend_from_config
from scrapy_dist.filters.exact import SetBackend, window_set_state
from scrapy_dist.filters.window import split_window_signature
from scrapy_dist.frontier.progress import progress_numbers
from scrapy_dist.frontier.registry import beats_of
from scrapy_dist.keys import (
    LEVELS_MARKER,
    SET_ASIDE_SUFFIX,
    SLOTS_MARKER,
    RedisKeys,
    check_type,
    hash_tag_on,
    key_type,
    keys_from_config,
    set_aside_key,
    slots_index_keys,
    stream_dead_key,
)
from scrapy_dist.queue import RedisQueue, leasable_queue
from scrapy_dist.scripts import scripts_for
from scrapy_dist.stats import ITEMS_STAT, PAGES_STAT, Rates, decode_stats, parse_samples, rates

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from scrapy_dist.filters import FilterState
    from scrapy_dist.stream_admin import StreamState


@dataclass(frozen=True)
class CrawlLayout:
    """Where one crawl's data lives, and in which Redis types.

    Attributes:
        keys: the crawl's keys.
        seeds: the seeds key (the spider's ``redis_key`` if it has one).
        seeds_kind: ``"list"``, ``"set"`` or ``"zset"`` (the seed mode).
        queue_kind: how the request queue stores entries (``"levels"``: a priority
            queue's lists, or ``"list"``; :attr:`~scrapy_dist.queue.RedisQueue.kind`).
        queue_cls: the request queue class.
        items: the items list (``REDIS_ITEMS_KEY``).
        worker_timeout: seconds without heartbeat after which a worker counts as gone.
    """

    keys: RedisKeys
    seeds: str
    seeds_kind: str
    queue_kind: str
    queue_cls: type[RedisQueue]
    items: str
    worker_timeout: float
    #: The items stream (``REDIS_ITEMS_STREAM_KEY``; ``RedisStreamPipeline``).
    items_stream: str = ""
    #: Seconds between a worker's heartbeats (``SCHEDULER_HEARTBEAT_INTERVAL``): a
    #: worker that missed two is shown silent.
    heartbeat_interval: float = 5.0
    #: ``SCHEDULER_LEASE_TIMEOUT``: how long a silent worker's leases last.
    lease_timeout: float = 120.0

    @classmethod
    def _make(cls, config: Config, keys: RedisKeys, spidercls: type | None) -> CrawlLayout:
        """The layout of ``keys`` (whose seeds key already follows the spider's
        ``redis_key``, :func:`~scrapy_dist.keys.keys_from_config`)."""
        queue_cls = leasable_queue(config.queue.cls, config.queue.path)
        return cls(
            keys=keys,
            seeds=keys.start_urls,
            seeds_kind=config.seeds.kind,
            queue_kind=queue_cls.kind,
            queue_cls=queue_cls,
            items=keys.custom(config.keys.items, "REDIS_ITEMS_KEY"),
            worker_timeout=config.workers.worker_timeout,
            items_stream=keys.custom(config.items.stream_key, "REDIS_ITEMS_STREAM_KEY"),
            heartbeat_interval=config.workers.heartbeat_interval,
            lease_timeout=config.frontier.lease_timeout,
        )

    @classmethod
    def from_config(
        cls,
        config: Config,
        spider: str,
        spidercls: type | None = None,
        *,
        now: datetime | None = None,
    ) -> CrawlLayout:
        """The layout of spider ``spider``'s crawl (its job from the settings).

        Args:
            config: the settings.
            spider: the spider name.
            spidercls: the spider class, when known (for its ``redis_key``).
            now: the time that fixes a ``SCHEDULER_JOB_TIMESTAMP`` stamp (UTC; the
                local clock if ``None``); workers take it from the Redis server.

        Raises:
            ConfigurationError: invalid key templates or queue class, or both seed
                modes set.
        """
        tag = hash_tag_on(config)
        redis_key = getattr(spidercls, "redis_key", None) if spidercls is not None else None
        keys = keys_from_config(config.keys, spider, now, redis_key=redis_key, hash_tag=tag)
        return cls._make(config, keys, spidercls)

    @classmethod
    def from_settings(
        cls, settings: BaseSettings, spider: str, spidercls: type | None = None
    ) -> CrawlLayout:
        """:meth:`from_config` for code that has settings (the CLI's before issue 13)."""
        return cls.from_config(Config.from_settings(settings), spider, spidercls)

    @classmethod
    def for_crawl(cls, config: Config, crawl: str) -> CrawlLayout:
        """The layout of a crawl known by its full name (``<spider>`` or ``<spider>:<job>``),
        as ``scrapy-dist jobs`` finds it, with the default seeds key."""
        keys = RedisKeys.build(
            crawl,
            requests=config.keys.requests,
            dupefilter=config.keys.dupefilter,
            start_urls=config.keys.start_urls,
            hash_tag=hash_tag_on(config),
        )
        return cls._make(config, keys, None)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> CrawlLayout:
        """The layout of a running crawler's crawl."""
        parts = assemble(crawler)
        return cls._make(parts.config, parts.keys, crawler.spidercls)

    def settable_aside(self) -> list[str]:
        """The keys of the crawl a frontier, politeness or item stream script renames out
        of the way when it finds one of another type (:func:`~scrapy_dist.keys.set_aside_key`), but
        the holdings and priority levels (found by their own patterns)."""
        k = self.keys
        keys = [self.seeds, k.requests, k.deliveries, k.dead, k.seq, k.progress, k.workers]
        keys += [k.politeness_tokens, k.politeness_busy, k.politeness_next, k.slot_pauses]
        keys.append(k.politeness_refused)
        keys += slots_index_keys(k.requests)  # (a queue per slot's)
        if self.items_stream:  # (the items stream itself is never renamed)
            keys.append(stream_dead_key(self.items_stream))
        return list(dict.fromkeys(keys))

    def owned(self) -> list[str]:
        """Every key of the crawl named by its layout (the dupefilter backend's extra
        keys, such as Bloom segments, aside)."""
        stream = self.items_stream
        stream_keys = [stream, stream_dead_key(stream)] if stream else []
        slots = slots_index_keys(self.keys.requests)  # (a queue per slot's)
        return list(
            dict.fromkeys([*self.keys.every(), self.seeds, self.items, *stream_keys, *slots])
        )


@dataclass(frozen=True)
class CrawlStatus:
    """A crawl's state at one moment (server time :attr:`time`).

    Attributes:
        crawl: the crawl name.
        redis: the server, password masked.
        time: the server's clock when read (seconds since the epoch).
        exists: whether any key of the crawl exists.
        seeds: seeds waiting in :attr:`seeds_key`.
        queued: requests waiting in the shared queue.
        leased: requests and seeds held by workers, not yet acknowledged.
        dead: records in the dead-letter list.
        progress: the crawl counters (``done``, ``retried``, ``dead``) and completion
            times (``idle_since``, ``finished_at``), as numbers.
        workers: worker id -> last heartbeat (server time).
        worker_timeout: heartbeat age after which a worker counts as gone.
        items_stored: items in the items list.
        stats: the crawl's merged stats (empty without ``RedisStatsCollector``).
        rates: pages and items per second over the last minute (``None`` without
            ``RedisStatsCollector``).
        dupefilter: the dupefilter's state (``None`` if it does not exist or was not read).
        control: the crawl's control state (pause, drain; :mod:`scrapy_dist.control`),
            ``None`` if it could not be read.
        item_stream: the items stream and its consumer groups (lag, pending), ``None``
            if there is none (:func:`read_item_stream`).
    """

    crawl: str
    redis: str
    time: float
    exists: bool
    seeds_key: str
    seeds_kind: str
    seeds: int
    queue_key: str
    queue_kind: str
    queued: int
    leased: int
    dead_key: str
    dead: int
    progress: dict[str, float]
    workers: dict[str, float]
    worker_timeout: float
    items_key: str
    items_stored: int
    stats: dict[str, Any] = field(default_factory=dict)
    rates: Rates | None = None
    dupefilter: FilterState | None = None
    control: ControlState | None = None
    item_stream: StreamState | None = None
    #: A sharded crawl's figures per shard (:func:`shard_figures`; empty: one shard).
    shards: list[dict[str, Any]] = field(default_factory=list)
    #: Keys a script renamed out of the way (:func:`find_set_aside`), and fields of the
    #: progress hash kept aside (``<field>:wrongtype`` -> the text found), both written
    #: by hand: for the operator to inspect, then delete.
    set_aside: list[str] = field(default_factory=list)
    set_aside_fields: dict[str, str] = field(default_factory=dict)
    #: Worker id -> (the deadline of the leases it holds, server time; how many it
    #: holds), from the holders zset and each holding (a worker holding none is absent).
    holdings: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: ``SCHEDULER_HEARTBEAT_INTERVAL``: a worker that missed two beats is silent.
    heartbeat_interval: float = 5.0
    #: ``SCHEDULER_LEASE_TIMEOUT``: how long a silent worker's leases last.
    lease_timeout: float = 120.0
    #: Whether the items list exists (``False``: no pipeline stores items in it).
    items_exist: bool = True
    #: Download slots paused for every worker (a Retry-After, a run of 429/503:
    #: :mod:`scrapy_dist.worker.pauses`) -> seconds left.
    paused_slots: dict[str, float] = field(default_factory=dict)
    #: Download slots counted (:mod:`scrapy_dist.worker.slot_counts`), and the busiest
    #: (most requests sent): each ``{"slot", "sent", "pages", "4xx", "5xx", "failed"}``.
    slots_counted: int = 0
    busiest_slots: list[dict[str, Any]] = field(default_factory=list)
    #: A queue per download slot's slots (:func:`read_queue_slots`); ``None`` for
    #: another queue.
    queue_slots: dict[str, Any] | None = None

    @property
    def requests_done(self) -> int:
        """Requests acknowledged (pages fetched, dropped or failed for good): the
        ``done`` counter less the seeds counted in it (``seeds_done``: a seed's lease is
        done once its request is queued, and that request is done again when fetched)."""
        p = self.progress
        return int(max(0.0, p.get("done", 0) - p.get("seeds_done", 0)))

    @property
    def shown_state(self) -> str:
        """:attr:`state`, but ``"paused"`` or ``"draining"`` while the crawl control says
        so and the crawl is not finished (what the header shows)."""
        state = self.state
        control = self.control
        paused = control is not None and control.state in ("paused", "draining")
        if control is not None and paused and state not in ("absent", "finished"):
            return control.state
        return state

    def worker_rows(self) -> list[dict[str, Any]]:
        """Every registered worker, by id: ``id``, ``heartbeat`` (server time), ``age``
        (seconds since it), ``state`` (``"live"``; ``"silent"``: missed two heartbeats;
        ``"gone"``: silent past ``SCHEDULER_WORKER_TIMEOUT``), ``live`` (as
        :meth:`live_workers` counts it), ``leases`` (held now), ``leases_deadline``
        (server time they expire, ``None`` if it holds none) and ``leases_return_in``
        (seconds until then, 0 once expired: a live worker renews them, a silent one's
        come back to the queue with the next reserve of any worker after that)."""
        live = self.live_workers()
        rows = []
        for worker in sorted(set(self.workers) | set(self.holdings)):
            beat = self.workers.get(worker)
            age = None if beat is None else round(max(0.0, self.time - beat), 3)
            if age is not None and age <= 2 * self.heartbeat_interval:
                state = "live"
            elif age is not None and age <= self.worker_timeout:
                state = "silent"
            else:
                state = "gone"
            deadline, held = self.holdings.get(worker, (None, 0))
            rows.append(
                {
                    "id": worker,
                    "heartbeat": beat,
                    "age": age,
                    "state": state,
                    "live": worker in live,
                    "leases": held,
                    "leases_deadline": deadline,
                    "leases_return_in": None
                    if deadline is None
                    else round(max(0.0, deadline - self.time), 1),
                }
            )
        return rows

    @property
    def state(self) -> str:
        """``"busy"`` (work waiting or leased), ``"finished"``, ``"idle"`` (empty but not
        marked finished), ``"waiting"`` (nothing done yet in this run) or ``"absent"``.

        Workers mark a crawl finished: one with ``CLOSE_WHEN_CRAWL_DONE`` once it has been
        empty for ``CRAWL_DONE_GRACE`` seconds, any worker when it closes and finds it
        empty; a worker that leases work again removes the mark. Until then, and while a
        worker is alive after it (one without ``CLOSE_WHEN_CRAWL_DONE`` waiting for more
        seeds, for as long as it runs), the crawl is ``"idle"``: more seeds may come."""
        if not self.exists:
            return "absent"
        if self.seeds + self.queued + self.leased > 0:
            return "busy"
        if self.progress.get("finished_at"):
            return "idle" if self.live_workers() else "finished"
        p = self.progress
        if p.get("done", 0) + p.get("dead", 0) - p.get("run_base", 0) <= 0:
            return "waiting"
        return "idle"

    def silent_workers(self) -> int:
        """The :meth:`live_workers` that missed two heartbeats (``"silent"`` in
        :meth:`worker_rows`): counted live until ``SCHEDULER_WORKER_TIMEOUT``."""
        limit = 2 * self.heartbeat_interval
        return sum(1 for age in self.live_workers().values() if age > limit)

    def live_workers(self) -> dict[str, float]:
        """Live worker id -> seconds since its last heartbeat."""
        ages = {w: max(0.0, self.time - beat) for w, beat in self.workers.items()}
        return {w: age for w, age in sorted(ages.items()) if age <= self.worker_timeout}

    def as_dict(self) -> dict[str, Any]:
        """Everything as JSON-able values (datetimes in ISO 8601), for ``--json``."""
        spider, _, job = self.crawl.partition(":")
        live = self.live_workers()
        df = self.dupefilter
        return {
            "crawl": self.crawl,
            "spider": spider,
            "job": job or None,
            "redis": self.redis,
            "time": self.time,
            "state": self.state,
            "shown_state": self.shown_state,
            "seeds": {"key": self.seeds_key, "type": self.seeds_kind, "waiting": self.seeds},
            "queue": {"key": self.queue_key, "type": self.queue_kind, "queued": self.queued},
            "leased": self.leased,
            "dead": {"key": self.dead_key, "records": self.dead},
            "progress": {
                "done": self.requests_done,
                "seeds_done": int(self.progress.get("seeds_done", 0)),
                "retried": int(self.progress.get("retried", 0)),
                "dead": int(self.progress.get("dead", 0)),
                "idle_since": self.progress.get("idle_since"),
                "finished_at": self.progress.get("finished_at"),
            },
            "dupefilter": None
            if df is None
            else {
                "key": df.key,
                "backend": df.backend,
                "size": df.count,
                "capacity": df.capacity,
                "fill": df.count / df.capacity if df.capacity else None,
                "error_rate": df.error_rate,
                "fpr_estimate": df.fpr_estimate,
                "stages": df.stages,
                "expires_in": df.expires_in,
                "recrawl_after": df.recrawl_after,
            },
            "workers": {
                "live": len(live),
                "silent": self.silent_workers(),
                "registered": len(self.workers),
                "timeout": self.worker_timeout,
                "heartbeat_interval": self.heartbeat_interval,
                "lease_timeout": self.lease_timeout,
                "leases_reclaimed": int(self.progress.get("reclaimed", 0)),
                "list": self.worker_rows(),
            },
            "items": {
                "key": self.items_key,
                "stored": self.items_stored if self.items_exist else None,
                "scraped": self.stats.get(ITEMS_STAT),
            },
            "rates": None
            if self.rates is None
            else {
                "window": self.rates.window,
                "pages_per_second": self.rates.pages_per_second,
                "items_per_second": self.rates.items_per_second,
            },
            "stats": self.stats,
            "control": None if self.control is None else self.control.as_dict(),
            "item_stream": None if self.item_stream is None else self.item_stream.as_dict(),
            "shards": self.shards,
            "set_aside": {"keys": self.set_aside, "progress_fields": self.set_aside_fields},
            "paused_slots": self.paused_slots,
            "slots": {"counted": self.slots_counted, "busiest": self.busiest_slots},
            "queue_slots": self.queue_slots,
        }

    def to_json(self) -> str:
        """:meth:`as_dict` as one line of JSON."""
        return json.dumps(self.as_dict(), default=json_default, sort_keys=False)


def json_default(value: object) -> object:
    """``json.dumps`` fallback: datetimes and dates as ISO 8601, anything else as text."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return str(value)


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite (a stat a spider set to ``nan`` or
    ``inf``) as its text, ``"nan"``, ``"inf"`` or ``"-inf"``: JSON has no such numbers,
    and ``json.dumps`` would write ``NaN``, which strict readers refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: Names :func:`find_set_aside` probes per key and round: a script takes the lowest free
#: name, so a name past a gap this long (copies the operator deleted) is not seen by
#: ``status`` (``reset`` finds it with ``SCAN``).
SET_ASIDE_PROBES = 10


def find_set_aside(client: redis.Redis, keys: Sequence[str]) -> list[str]:
    """The names ``keys`` were set aside under (:func:`~scrapy_dist.keys.set_aside_key`)
    that exist: ``EXISTS`` of the first :data:`SET_ASIDE_PROBES` names of each (one
    round trip), then of as many after the highest found, until a round finds none
    (never ``SCAN``)."""
    found: list[str] = []
    window = range(SET_ASIDE_PROBES)
    probe = [(key, 1 + i) for key in dict.fromkeys(keys) for i in window]
    while probe:
        with client.pipeline(transaction=False) as pipe:
            for key, n in probe:
                pipe.exists(set_aside_key(key, n))
            hits = [kn for kn, hit in zip(probe, pipe.execute(), strict=True) if hit]
        found += [set_aside_key(key, n) for key, n in hits]
        highest = {key: n for key, n in hits}  # probed in order: the last is the highest
        probe = [(key, n + 1 + i) for key, n in highest.items() for i in window]
    return found


def _set_aside_fields(raw: object) -> dict[str, str]:
    """The fields of a progress hash (``HGETALL``'s reply) that hold a value kept aside,
    bytes that are not UTF-8 shown escaped."""
    if not isinstance(raw, dict):
        return {}
    suffix = SET_ASIDE_SUFFIX.encode()
    return {
        name.decode(errors="backslashreplace"): value.decode(errors="backslashreplace")
        for name, value in sorted(raw.items())
        if isinstance(name, bytes) and isinstance(value, bytes) and name.endswith(suffix)
    }


def _size_command(pipe: Any, key: str, kind: str) -> None:
    if kind == "zset":
        pipe.zcard(key)
    elif kind == "set":
        pipe.scard(key)
    elif kind == "hash":
        pipe.hlen(key)
    else:
        pipe.llen(key)


def _queued_command(pipe: Any, client: redis.Redis, key: str, kind: str) -> None:
    """Count the entries of the request queue ``key`` in ``pipe`` (``lua/queued.lua``:
    a priority queue's levels together, a previous version's zset too)."""
    scripts_for(client).queued(queue=key, queue_kind=kind).run(pipe)


def _leased_command(pipe: Any, client: redis.Redis, keys: RedisKeys) -> None:
    """Count the leases held in ``pipe`` (``lua/leased.lua``: every worker's holding,
    a previous version's leases too)."""
    scripts_for(client).leased(holders=keys.holders, previous=keys.leases).run(pipe)


def read_status(
    client: redis.Redis,
    layout: CrawlLayout,
    config: Config,
    *,
    dupefilter: bool = True,
) -> CrawlStatus:
    """Read one crawl's state: one pipelined round trip, plus the dupefilter's state, the
    control state (:func:`read_control_status`, one more) and the keys set aside
    (:func:`find_set_aside`, one more while none is).

    Args:
        client: a client of the crawl's Redis.
        layout: the crawl's keys and types.
        config: the settings (for the dupefilter backend).
        dupefilter: also read the dupefilter's state (one or two more round trips).

    Raises:
        ConfigurationError: a key holds the wrong type for these settings (but the
            progress hash, read as no counters with a warning: ``progress_numbers``).
        redis.RedisError: Redis failed (``redis.ConnectionError`` when unreachable).
    """
    k = layout.keys
    queue_kind = queue_kind_at(client, k.requests, layout.queue_kind)
    typed: list[tuple[str, str | tuple[str, ...], str]] = [
        (layout.seeds, layout.seeds_kind, "seeds"),
        (k.requests, layout.queue_cls.key_types, "queue"),
        (k.holders, "zset", "holders"),
        (k.leases, "zset", "leases"),
        (k.dead, "list", "dead letters"),
        (k.workers, "hash", "workers"),
        (k.progress, "hash", "progress"),
        (layout.items, "list", "items"),
        (k.stats, "hash", "stats"),
        (k.timeline, "zset", "timeline"),
    ]
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.type(k.dupefilter)
        for key, _, _ in typed:
            pipe.type(key)
        _size_command(pipe, layout.seeds, layout.seeds_kind)
        _queued_command(pipe, client, k.requests, queue_kind)
        _leased_command(pipe, client, k)
        pipe.llen(k.dead)
        pipe.hgetall(k.workers)
        pipe.hgetall(k.progress)
        pipe.llen(layout.items)
        pipe.hgetall(k.stats)
        pipe.zrange(k.timeline, 0, -1)
        pipe.zrange(k.holders, 0, -1, withscores=True)
        pipe.zrange(k.slot_pauses, 0, -1, withscores=True)
        replies = pipe.execute(raise_on_error=False)
    now_reply, df_type, *rest = replies
    for reply in (now_reply, df_type, *rest[: len(typed)]):
        if isinstance(reply, Exception):  # e.g. NoPermissionError: not a key type
            raise reply
    types = [_text(t) for t in rest[: len(typed)]]
    for (key, expected, role), actual in zip(typed, types, strict=True):
        if role != "progress":  # read as no counters (progress_numbers), not refused
            check_type(key, actual, expected, role)
    values = rest[len(typed) :]
    pauses = values.pop()  # (a key of another type: the next pause sets it aside)
    progress = progress_numbers(values[5], k.progress)
    for value in (now_reply, df_type, *values[:5], *values[6:]):
        if isinstance(value, Exception):
            raise value
    seeds, queued, leased, dead, workers, _, items, stats_raw, timeline, holders = values
    seconds, micros = cast("tuple[int, int]", now_reply)
    now = seconds + micros / 1e6
    stats = decode_stats(stats_raw)
    crawl_rates = None
    if stats or timeline:
        pages = stats.get(PAGES_STAT, 0)
        scraped = stats.get(ITEMS_STAT, 0)
        crawl_rates = rates(
            parse_samples(timeline),
            float(pages) if isinstance(pages, (int, float)) else 0.0,
            float(scraped) if isinstance(scraped, (int, float)) else 0.0,
            now,
        )
    df_state = None
    df_kind = _text(df_type)
    if dupefilter and df_kind != "none":
        df_state = dupefilter_state(client, config, k)
    item_stream = read_item_stream(client, layout)
    set_aside = find_set_aside(client, layout.settable_aside())
    slots_counted, busiest = read_slot_counts(client, k)
    queue_slots = read_queue_slots(client, k.requests, now) if queue_kind == "slots" else None
    status = CrawlStatus(
        crawl=k.crawl,
        redis=describe(client),
        time=now,
        exists=df_kind != "none"
        or any(t != "none" for t in types)
        or item_stream is not None
        or bool(set_aside),
        seeds_key=layout.seeds,
        seeds_kind=layout.seeds_kind,
        seeds=int(seeds),
        queue_key=k.requests,
        queue_kind=queue_kind,
        queued=int(queued),
        leased=int(leased),
        dead_key=k.dead,
        dead=int(dead),
        progress=progress,
        workers=beats_of(workers),
        worker_timeout=layout.worker_timeout,
        items_key=layout.items,
        items_stored=int(items),
        stats=stats,
        rates=crawl_rates,
        dupefilter=df_state,
        control=read_control_status(client, k),
        item_stream=item_stream,
        set_aside=set_aside,
        set_aside_fields=_set_aside_fields(values[5]),
        holdings=read_holdings(client, k, holders),
        heartbeat_interval=layout.heartbeat_interval,
        lease_timeout=layout.lease_timeout,
        items_exist=types[7] != "none",
        paused_slots=paused_slots(pauses, now),
        slots_counted=slots_counted,
        busiest_slots=busiest,
        queue_slots=queue_slots,
    )
    return with_shards(client, layout, config, status, dupefilter=dupefilter)


#: Slots in :attr:`CrawlStatus.busiest_slots`.
BUSIEST_SLOTS = 10


def read_slot_counts(client: redis.Redis, keys: RedisKeys) -> tuple[int, list[dict[str, Any]]]:
    """How many download slots the crawl counted, and the :data:`BUSIEST_SLOTS` with
    the most requests sent, with their counts (:mod:`scrapy_dist.worker.slot_counts`).
    Keys of another type (written by hand; the next write sets them aside) and counts
    that are not numbers read as none."""
    from scrapy_dist.worker.slot_counts import COUNTS

    with client.pipeline(transaction=False) as pipe:
        pipe.zcard(keys.slot_sent)
        pipe.zrevrange(keys.slot_sent, 0, BUSIEST_SLOTS - 1, withscores=True)
        counted, ranked = pipe.execute(raise_on_error=False)
    if isinstance(counted, Exception) or isinstance(ranked, Exception) or not ranked:
        return 0, []
    slots = [_text(member) for member, _ in ranked]
    fields = [f"{name}:{slot}" for slot in slots for name in COUNTS]
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.slot_counts, fields)
        (values,) = pipe.execute(raise_on_error=False)
    if isinstance(values, Exception):  # (another type)
        values = [None] * len(fields)
    busiest = []
    for k, (slot, (_, sent)) in enumerate(zip(slots, ranked, strict=True)):
        row: dict[str, Any] = {"slot": slot, "sent": _whole(sent)}
        for j, name in enumerate(COUNTS):
            row[name] = _whole(values[k * len(COUNTS) + j])
        busiest.append(row)
    return int(counted), busiest


def queue_kind_at(client: redis.Redis, queue: str, kind: str) -> str:
    """The kind of the request queue Redis holds at ``queue`` when the settings say
    ``kind``: a priority queue and a queue per slot are told apart by their marker
    (a crawl whose settings changed class is counted as it is until a worker moves it);
    ``kind`` for anything else."""
    if kind not in ("levels", "slots"):
        return kind
    if key_type(client, queue) != "string":  # (another type: the type check says so)
        return kind
    marker = client.get(queue)
    return {LEVELS_MARKER.encode(): "levels", SLOTS_MARKER.encode(): "slots"}.get(
        marker if isinstance(marker, bytes) else b"", kind
    )


def read_queue_slots(client: redis.Redis, queue: str, now: float) -> dict[str, Any]:
    """A queue per download slot's slots (``scrapy_dist/slot_queue.py``) at server time
    ``now``: how many are ready (``ready``, a waiting one whose time came included) and
    how many hold requests but wait for their delay or pause (``waiting``); the
    :data:`BUSIEST_SLOTS` ready ones with the highest priority and the first to be
    ready of the waiting ones, each ``{"slot",
    "queued", "ready_in"}`` (seconds), their requests counted from their levels. A
    bounded read, whatever the number of slots; keys of another type (written by hand)
    read as none."""
    from scrapy_dist.keys import SLOTS_READY_SUFFIX, SLOTS_WAIT_SUFFIX
    from scrapy_dist.slot_queue import slot_queued

    ready, wait = queue + SLOTS_READY_SUFFIX, queue + SLOTS_WAIT_SUFFIX
    with client.pipeline(transaction=False) as pipe:
        pipe.zcard(ready)
        pipe.zcard(wait)
        pipe.zcount(wait, "-inf", now)
        pipe.zrange(ready, 0, BUSIEST_SLOTS - 1)
        pipe.zrange(wait, 0, BUSIEST_SLOTS - 1, withscores=True)
        replies = pipe.execute(raise_on_error=False)
    counts = [0 if isinstance(r, Exception) else int(r) for r in replies[:3]]
    first_ready = [] if isinstance(replies[3], Exception) else [_text(s) for s in replies[3]]
    waiting = [] if isinstance(replies[4], Exception) else replies[4]
    rows = [(slot, 0.0) for slot in first_ready]
    rows += [(_text(slot), max(0.0, round(float(at) - now, 2))) for slot, at in waiting]
    listed = []
    for slot, ready_in in rows:
        listed.append(
            {"slot": slot, "queued": slot_queued(client, queue, slot), "ready_in": ready_in}
        )
    # a waiting slot whose delay ended is ready (the next reserve moves it)
    due = counts[2]
    return {"ready": counts[0] + due, "waiting": counts[1] - due, "listed": listed}


def _whole(value: object) -> int:
    """A count as the scripts write it, or 0 for anything else (written by hand:
    ``inf``, ``junk``, ``1.5``)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) and number == int(number) else 0


def paused_slots(reply: object, now: float) -> dict[str, float]:
    """Slot -> seconds left of its pause, from ``ZRANGE <crawl>:slots:paused 0 -1
    WITHSCORES`` read at server time ``now`` (ended pauses and a key of another type:
    none)."""
    if not isinstance(reply, list):
        return {}
    found = {}
    for member, score in reply:
        left = float(score) / 1000 - now
        if left > 0:
            found[_text(member)] = round(left, 1)
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def read_holdings(
    client: redis.Redis, keys: RedisKeys, holders: Sequence[tuple[bytes, float]]
) -> dict[str, tuple[float, int]]:
    """Worker id -> (its leases' deadline, how many it holds), from the holders zset
    (``ZRANGE ... WITHSCORES``, read) and one ``HLEN`` of each holding (one more round
    trip when a worker holds leases)."""
    deadlines = {_text(worker): float(deadline) for worker, deadline in holders}
    if not deadlines:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for worker in deadlines:
            pipe.hlen(keys.holding(worker))
        sizes = pipe.execute(raise_on_error=False)
    return {
        worker: (deadline, size if isinstance(size, int) else 0)
        for (worker, deadline), size in zip(deadlines.items(), sizes, strict=True)
    }


def read_item_stream(client: redis.Redis, layout: CrawlLayout) -> StreamState | None:
    """The crawl's items stream with each consumer group's lag and pending count
    (:func:`scrapy_dist.stream_admin.stream_state`); ``None`` if the stream does not exist.

    Raises:
        ConfigurationError: the stream key holds another type.
    """
    from scrapy_dist.stream_admin import stream_state

    if not layout.items_stream:
        return None
    return stream_state(client, layout.items_stream)


def dupefilter_state(client: redis.Redis, config: Config, keys: RedisKeys) -> FilterState:
    """The state of the crawl's dupefilter, whatever backend wrote it.

    A bitmap Bloom filter's fill and error rate depend on its size: the filter's own
    parameters (read from the signature it stores) are used when this version wrote
    it, else the configured ones.

    Raises:
        ConfigurationError: the dupefilter key holds a type no backend uses.
    """
    adopting = config.with_values({"DUPEFILTER_BACKEND": "auto"})
    choice = backend_from_config(adopting.dupefilter, client, keys)
    backend = choice.choose() if isinstance(choice, BackendChoice) else choice
    if isinstance(backend, BitmapBloomBackend):
        backend = _bitmap_as_created(client, keys, backend)
    # -- recrawl window (DUPEFILTER_RECRAWL_AFTER): a windowed exact filter read without
    # the setting
    if isinstance(backend, SetBackend) and key_type(client, keys.dupefilter) == "zset":
        return window_set_state(client, keys.dupefilter)
    return backend.state()


def _bitmap_as_created(
    client: redis.Redis, keys: RedisKeys, configured: BitmapBloomBackend
) -> BitmapBloomBackend:
    """A bitmap backend with the parameters the filter in Redis was created with
    (``configured`` when it has none, or a signature this version does not write)."""
    raw = client.hget(keys.dupefilter, "sig")
    signature = _text(raw) if raw is not None else ""
    if not signature or signature == configured.signature:
        return configured
    base, window = split_window_signature(signature)
    params = parse_signature(base)
    if params is None:
        return configured
    return BitmapBloomBackend(
        client, keys, params, ttl=configured.ttl, on_full=configured.on_full, window=window
    )


# -- crawl control (pause, resume, drain: scrapy_dist.control) --------------------------


def read_control_status(client: redis.Redis, keys: RedisKeys) -> ControlState | None:
    """The crawl's control state (one ``HMGET``; a key of the wrong type reads as
    paused with the problem named, as workers read it), or ``None`` if Redis refused
    the read (an ACL without that key, say)."""
    import redis as redis_module

    try:
        return read_state(client, keys)
    except redis_module.ResponseError:
        return None


# -- a sharded crawl (SCHEDULER_SHARDS, scrapy_dist.frontier.shards) -------------------------


def shard_figures(
    client: redis.Redis, layout: CrawlLayout, config: Config, *, dupefilter: bool = True
) -> list[dict[str, Any]]:
    """Queued, leased, dead letters, counters and keys set aside (:func:`find_set_aside`)
    of each shard ``1..N-1`` of a sharded crawl (two round trips per shard; none for a
    one-shard crawl), and with
    ``dupefilter`` its dupefilter's state (``"filter"``: a :class:`FilterState`, or
    ``None`` where it does not exist yet; one or two more round trips per shard)."""
    from scrapy_dist.frontier.shards import other_shards

    figures = []
    for index, (shard, keys) in enumerate(
        other_shards(client, layout.keys, config.keys, config.frontier.shards), 1
    ):
        with shard.pipeline(transaction=False) as pipe:
            _queued_command(pipe, shard, keys.requests, layout.queue_kind)
            _leased_command(pipe, shard, keys)
            pipe.llen(keys.dead)
            pipe.hgetall(keys.progress)
            queued, leased, dead, progress = pipe.execute(raise_on_error=False)
        for value in (queued, leased, dead):
            if isinstance(value, Exception):
                raise value
        counters = progress_numbers(progress, keys.progress)
        state = dupefilter_state(shard, config, keys) if dupefilter else None
        aside = [keys.requests, keys.deliveries, keys.dead, keys.seq, keys.progress]
        figures.append(
            {
                "shard": index,
                "crawl": keys.crawl,
                "queue_key": keys.requests,
                "queued": int(queued),
                "leased": int(leased),
                "dead_key": keys.dead,
                "dead": int(dead),
                "done": int(counters.get("done", 0)),
                "retried": int(counters.get("retried", 0)),
                "dead_lettered": int(counters.get("dead", 0)),
                "filter": state if state is not None and state.exists else None,
                "set_aside": find_set_aside(shard, aside),
            }
        )
    return figures


def with_shards(
    client: redis.Redis,
    layout: CrawlLayout,
    config: Config,
    status: CrawlStatus,
    *,
    dupefilter: bool = True,
) -> CrawlStatus:
    """``status`` (shard 0's) with the other shards' figures listed and added to its
    queued, leased, dead letters and counters (with ``dupefilter``, their fingerprints
    to its dupefilter's count), and their keys set aside to its own (their progress
    fields set aside are not read)."""
    others = shard_figures(client, layout, config, dupefilter=dupefilter)
    if not others:
        return status
    filters = [f.pop("filter") for f in others]
    set_aside = [key for f in others for key in f.pop("set_aside")]
    for figures, state in zip(others, filters, strict=True):
        figures["fingerprints"] = None if state is None else state.count
    first = {
        "shard": 0,
        "crawl": status.crawl,
        "queue_key": status.queue_key,
        "queued": status.queued,
        "leased": status.leased,
        "dead_key": status.dead_key,
        "dead": status.dead,
        "done": int(status.progress.get("done", 0)),
        "retried": int(status.progress.get("retried", 0)),
        "dead_lettered": int(status.progress.get("dead", 0)),
        "fingerprints": status.dupefilter.count
        if status.dupefilter and status.dupefilter.exists
        else None,
    }
    progress = dict(status.progress)
    for name, field_name in (("done", "done"), ("retried", "retried"), ("dead", "dead_lettered")):
        progress[name] = progress.get(name, 0) + sum(f[field_name] for f in others)
    progress["run_base"] = progress.get("run_base", 0) + progress.get("others_base", 0)
    return replace(
        status,
        queued=status.queued + sum(f["queued"] for f in others),
        leased=status.leased + sum(f["leased"] for f in others),
        dead=status.dead + sum(f["dead"] for f in others),
        progress=progress,
        dupefilter=_all_filters(status.dupefilter, filters),
        shards=[first, *others],
        set_aside=status.set_aside + set_aside,
    )


def _all_filters(first: FilterState | None, others: list[FilterState | None]) -> FilterState | None:
    """Shard 0's dupefilter state with every shard's fingerprints counted: counts,
    capacities and filters added up, the highest estimated false-positive rate."""
    found = [f for f in (first, *others) if f is not None and f.exists]
    if not found:
        return first
    capacities = [f.capacity for f in found]
    return replace(
        first if first is not None and first.exists else found[0],
        count=sum(f.count for f in found),
        capacity=None if None in capacities else sum(c or 0 for c in capacities),
        fpr_estimate=max(f.fpr_estimate for f in found),
        stages=sum(f.stages for f in found),
        full=any(f.full for f in found),
    )
