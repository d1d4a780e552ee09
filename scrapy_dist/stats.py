"""Crawl-wide stats shared by every worker, in one Redis hash per crawl.

:class:`RedisStatsCollector` is a Scrapy stats collector (``STATS_CLASS =
"scrapy_dist.stats.RedisStatsCollector"``). Each worker keeps its own stats in memory,
as Scrapy's collector does, so ``get_value`` answers from memory and every worker still
logs its own stats when it closes; in addition, every change is buffered and written to
the crawl's hash ``<crawl>:stats`` every ``STATS_FLUSH_INTERVAL`` seconds and at close,
in one round trip (``lua/stats.lua``), where all the workers' changes merge:

* ``inc_value`` adds on the server (``HINCRBY`` for integers), so two workers
  incrementing the same stat never lose an increment;
* ``max_value`` / ``min_value`` compare and set on the server;
* ``set_value`` sets (the last flush wins), except for the stats in
  :attr:`RedisStatsCollector.merge_rules`: the crawl's ``start_time`` is the earliest
  worker's, its ``finish_time`` the latest.

Values keep their types: integers and floats are stored as numbers (readable with
``redis-cli hgetall``, and still counters for ``HINCRBY``), datetimes, strings and other
JSON values carry a tag (see :func:`encode_value`). :func:`decode_stats` turns the hash
back into Python values; :meth:`RedisStatsCollector.crawl_stats` and the
``scrapy-dist status`` command use it.

Every flush that changes the page or item count also records the crawl's totals in
``<crawl>:timeline`` (one sample per second, trimmed to the last minute), from which
:func:`rates` computes pages and items per second over the last minute (or the time
observed, while the crawl is younger).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, ClassVar, cast

import redis
from scrapy.statscollectors import StatsCollector
from scrapy.utils.serialize import ScrapyJSONEncoder

from scrapy_dist.assembly import assemble
from scrapy_dist.config.components import check_stats_interval
from scrapy_dist.frontier.outbox import BACKOFF_MAX, BACKOFF_MIN, UNREACHABLE, refusal
from scrapy_dist.scripts import scripts_for
from scrapy_dist.worker.startup import start_failure

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from twisted.internet.task import LoopingCall
    from typing_extensions import Self

    from scrapy_dist.scripts import Scripts

logger = logging.getLogger(__name__)

#: The stat that counts pages (Scrapy's core stats): the basis of pages per second.
PAGES_STAT = "response_received_count"
#: The stat that counts items: the basis of items per second.
ITEMS_STAT = "item_scraped_count"
#: Seconds over which crawl rates are measured.
RATE_WINDOW = 60
#: Seconds a crawl's first timeline sample is taken to cover (``STATS_FLUSH_INTERVAL``'s
#: default: the first flush of a worker comes that long after its first page, at most).
FIRST_SAMPLE_SPAN = 1

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
#: Tag prefixes of stored values that are not numbers.
DATETIME, STRING, JSON = "d:", "s:", "j:"


def _micros(value: datetime) -> int:
    """Microseconds since the epoch (a naive datetime counts as UTC), for ordering."""
    epoch = _EPOCH if value.tzinfo is not None else _EPOCH_NAIVE
    return (value - epoch) // _MICROSECOND


def number_text(value: int | float) -> str:
    """A number as stored: an int as digits, a float as text that never looks like an int."""
    if isinstance(value, float):
        return repr(value)  # always has ".", "e", "inf" or "nan"
    return str(int(value))


class _Encoder(ScrapyJSONEncoder):
    """Scrapy's JSON encoder, with ``str()`` for what it cannot encode."""

    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return str(o)


def encode_value(value: Any) -> str:
    """Encode one stat value for the stats hash.

    ``int`` -> ``"42"``; ``float`` -> ``"1.5"``, ``"1e+16"``, ``"inf"``; ``datetime`` ->
    ``"d:<microseconds since the epoch> <ISO 8601>"`` (the number orders datetimes on the
    server); ``str`` -> ``"s:<text>"``; anything else -> ``"j:<JSON>"`` (``bool``,
    ``None``, lists, dicts; other objects as Scrapy's JSON encoder writes them).
    """
    if isinstance(value, bool) or value is None:
        return JSON + json.dumps(value)
    if isinstance(value, (int, float)):
        return number_text(value)
    if isinstance(value, datetime):
        return f"{DATETIME}{_micros(value)} {value.isoformat()}"
    if isinstance(value, str):
        return STRING + value
    try:
        return JSON + json.dumps(value, cls=_Encoder)
    except (ValueError, RecursionError):  # a circular structure
        return JSON + json.dumps(str(value))


def decode_value(raw: bytes | str) -> Any:
    """Decode what :func:`encode_value` stored (untagged text that is not a number, as
    written by other tools, comes back as a string)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    tag = text[:2]
    if tag == DATETIME:
        try:
            return datetime.fromisoformat(text.split(" ", 1)[1])
        except (IndexError, ValueError):
            return text
    if tag == STRING:
        return text[2:]
    if tag == JSON:
        try:
            return json.loads(text[2:])
        except ValueError:
            return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def decode_stats(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> dict[str, Any]:
    """Decode a whole stats hash (``HGETALL``), sorted by stat name."""
    decoded = {
        (k.decode("utf-8", "replace") if isinstance(k, bytes) else k): decode_value(v)
        for k, v in raw.items()
    }
    return dict(sorted(decoded.items()))


@dataclass(frozen=True)
class Rates:
    """Crawl-wide pages and items per second over the last :attr:`window` seconds (the
    time actually observed: less than :data:`RATE_WINDOW` while the crawl is younger)."""

    window: float
    pages_per_second: float
    items_per_second: float


def parse_samples(members: Iterable[bytes | str]) -> list[tuple[int, float, float]]:
    """Parse ``<crawl>:timeline`` members into ``(second, pages, items)``, oldest first."""
    samples = []
    for member in members:
        text = member.decode() if isinstance(member, bytes) else member
        try:
            second, pages, items = text.split(" ")
            samples.append((int(second), float(pages), float(items)))
        except ValueError:
            continue
    return sorted(samples)


def rates(
    samples: Sequence[tuple[int, float, float]],
    pages: float,
    items: float,
    now: float,
    window: int = RATE_WINDOW,
) -> Rates:
    """Pages and items per second over at most the ``window`` seconds before ``now``.

    The totals now minus those of a base sample, divided by the seconds since that
    sample: the newest sample taken at least ``window`` seconds ago; while the crawl is
    younger than that, its oldest sample (a crawl 16 s old is measured over the
    time since its first sample, not over ``window`` seconds it did not run); with one
    sample only, everything since one second before it. Samples are taken when workers
    flush their stats (every ``STATS_FLUSH_INTERVAL``), so the rate trails by up to that.

    Args:
        samples: ``(second, pages, items)``, as :func:`parse_samples` returns them.
        pages: The crawl's page count now (``response_received_count``).
        items: The crawl's item count now (``item_scraped_count``).
        now: The Redis server's time.
        window: Seconds, at most.
    """
    older = [s for s in samples if s[0] <= now - window]
    if older:
        base = older[-1]
    elif len(samples) >= 2:
        base = samples[0]
    elif samples:  # its totals took up to a flush interval (the default) to gather
        base = (samples[0][0] - FIRST_SAMPLE_SPAN, 0.0, 0.0)
    else:  # no sample yet: nothing observed
        return Rates(window=0.0, pages_per_second=0.0, items_per_second=0.0)
    span = max(1.0, now - base[0])
    return Rates(
        window=round(span, 1),
        pages_per_second=max(0.0, pages - base[1]) / span,
        items_per_second=max(0.0, items - base[2]) / span,
    )


class SharedStats:
    """The crawl's stats hash and timeline.

    Args:
        client: the crawl's Redis client.
        key: the stats hash.
        timeline: the timeline zset.
        window: seconds of timeline kept for rates.
        scripts: the scripts registered on ``client`` (default: looked up here).
    """

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        timeline: str,
        *,
        window: int = RATE_WINDOW,
        scripts: Scripts | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self.timeline = timeline
        self.window = window
        self._scripts = scripts or scripts_for(client)

    def apply(self, ops: Sequence[tuple[str, str, str, str]]) -> int:
        """Apply ``(kind, stat, value, start)`` operations atomically, in order (one round
        trip; see ``lua/stats.lua`` for the kinds).

        Returns:
            How many increments found a value that is not a number (and replaced it).

        Raises:
            redis.RedisError: Redis failed; nothing or everything was applied (a reply
                lost after the server ran the script is the exception).
        """
        if not ops:
            return 0
        call = self._scripts.stats(
            stats=self.key,
            timeline=self.timeline,
            pages_stat=PAGES_STAT,
            items_stat=ITEMS_STAT,
            window=self.window,
            ops=ops,
        )
        return int(cast("int", call.run()))

    def read(self) -> dict[str, Any]:
        """The crawl's stats, decoded (one round trip)."""
        return decode_stats(cast("dict[bytes, bytes]", self.client.hgetall(self.key)))


@dataclass
class _Op:
    kind: str
    value: Any
    start: Any = 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _merge(ops: list[_Op], op: _Op) -> None:
    """Add ``op`` to a stat's pending operations, folding it into the last when the
    result on the server is the same."""
    if op.kind == "set" or not ops:
        ops[:] = [op]
        return
    last = ops[-1]
    try:
        if op.kind == "inc" and last.kind == "inc":
            last.value += op.value
            return
        if op.kind == "inc" and last.kind == "set" and _is_number(last.value):
            last.value += op.value
            return
        if op.kind == last.kind == "max":
            last.value = max(last.value, op.value)
            return
        if op.kind == last.kind == "min":
            last.value = min(last.value, op.value)
            return
    except TypeError:
        pass
    ops.append(op)


def _wire(stat: str, op: _Op) -> tuple[str, str, str, str] | None:
    if op.kind == "inc":
        if not (_is_number(op.value) and _is_number(op.start)):
            return None
        return ("inc", stat, number_text(op.value), number_text(op.start))
    return (op.kind, stat, encode_value(op.value), "")


class RedisStatsCollector(StatsCollector):
    """A stats collector whose changes also merge into the crawl's shared stats hash.

    See the module docstring for how values merge. ``clear_stats`` clears only this
    worker's stats; ``scrapy-dist reset`` deletes the shared hash.

    Args:
        crawler: the crawler (Scrapy builds stats collectors with ``cls(crawler)``).
        shared: the crawl's stats hash; default: from the crawler's settings.
        flush_interval: seconds between flushes; default ``STATS_FLUSH_INTERVAL``.
        close_timeout: seconds closing retries the last flush while Redis fails;
            default ``STATS_CLOSE_TIMEOUT``.

    Raises:
        ConfigurationError: ``STATS_FLUSH_INTERVAL`` is not positive.
    """

    #: Stats whose ``set_value`` merges across workers as ``"min"`` or ``"max"``.
    merge_rules: ClassVar[dict[str, str]] = {"start_time": "min", "finish_time": "max"}

    def __init__(
        self,
        crawler: Crawler,
        spider: Spider | None = None,
        *,
        shared: SharedStats | None = None,
        flush_interval: float | None = None,
        close_timeout: float | None = None,
    ) -> None:
        super().__init__(crawler)
        #: The spider (scrapy-redis's optional second argument; set at open otherwise).
        self.spider = spider
        #: The crawler (Scrapy < 2.14 keeps no reference to it).
        self.crawler = crawler
        if shared is None or flush_interval is None:
            # Scrapy builds stats collectors with cls(crawler): this is their from_crawler
            parts = assemble(crawler)
            if shared is None:
                keys = parts.keys
                shared = SharedStats(parts.client, keys.stats, keys.timeline, scripts=parts.scripts)
            if flush_interval is None:
                flush_interval = parts.config.stats.flush_interval
            if close_timeout is None:
                close_timeout = parts.config.stats.close_timeout
        check_stats_interval(flush_interval)
        self.shared = shared
        self.flush_interval = flush_interval
        #: Seconds closing retries the last flush while Redis fails.
        self.close_timeout = 10.0 if close_timeout is None else close_timeout
        self._down_since: float | None = None
        self._pending: dict[str, list[_Op]] = {}
        self._lock = threading.Lock()
        self._ticker: LoopingCall | None = None

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        """scrapy-redis's factory: the collector of the spider's crawler."""
        return cls(spider.crawler, spider)

    # -- Scrapy's interface: local value, plus the change for the crawl ------------

    def set_value(self, key: str, value: Any, spider: Spider | None = None) -> None:
        super().set_value(key, value)
        self._record(key, _Op(self.merge_rules.get(key, "set"), value))

    def set_stats(self, stats: dict[str, Any], spider: Spider | None = None) -> None:
        super().set_stats(stats)
        for key, value in stats.items():
            self._record(key, _Op(self.merge_rules.get(key, "set"), value))

    def inc_value(
        self, key: str, count: int = 1, start: int = 0, spider: Spider | None = None
    ) -> None:
        super().inc_value(key, count, start)
        self._record(key, _Op("inc", count, start))

    def max_value(self, key: str, value: Any, spider: Spider | None = None) -> None:
        super().max_value(key, value)
        self._record(key, _Op("max", value))

    def min_value(self, key: str, value: Any, spider: Spider | None = None) -> None:
        super().min_value(key, value)
        self._record(key, _Op("min", value))

    def open_spider(self, spider: Spider | None = None) -> None:
        """Start flushing every ``flush_interval`` seconds."""
        from twisted.internet.task import LoopingCall

        if spider is not None:
            self.spider = spider
        self._ticker = LoopingCall(self._tick)
        self._ticker.start(self.flush_interval, now=False)

    def _tick(self) -> None:
        try:
            self.flush()
        except Exception:  # keep flushing: the next flush may work
            logger.exception(
                "Unexpected error while writing stats to %(key)s", {"key": self.shared.key}
            )

    def close_spider(self, spider: Spider | None = None, reason: str | None = None) -> None:
        """Stop the timer, flush what is left, then log this worker's stats as usual."""
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if start_failure(self.crawler) is None:
            # (a crawl that never started has nothing in the crawl's stats)
            self._flush_at_close()
        super().close_spider(spider, reason)

    # -- the shared hash -----------------------------------------------------------

    @property
    def pending(self) -> int:
        """Stats changed since the last successful flush."""
        with self._lock:
            return len(self._pending)

    def _record(self, key: str, op: _Op) -> None:
        with self._lock:
            _merge(self._pending.setdefault(key, []), op)

    def flush(self) -> bool:
        """Write the buffered changes in one round trip; keep them if Redis fails.

        A failed write (Redis unreachable or refusing, any error) keeps its changes,
        merged with those made since, for the next flush: no count is lost (a reply
        lost after the server applied a batch is the exception: that batch counts
        twice). One warning when an outage starts, one when it ends;
        ``stats/redis/refused/<CODE>`` or ``stats/redis/unreachable`` count the
        failed flushes. Never raises.

        Returns:
            ``True`` if nothing is left to write.
        """
        with self._lock:
            pending, self._pending = self._pending, {}
        ops = [
            wire
            for stat, stat_ops in pending.items()
            for op in stat_ops
            if (wire := _wire(stat, op)) is not None
        ]
        try:
            conflicts = self.shared.apply(ops)
        except Exception as e:  # stats never take the crawl down
            with self._lock:
                for stat, stat_ops in self._pending.items():
                    for op in stat_ops:
                        _merge(pending.setdefault(stat, []), op)
                self._pending = pending
            self._failed(e)
            return False
        if self._down_since is not None:
            logger.warning(
                "Stats are written to %(key)s again after %(s).1fs",
                {"key": self.shared.key, "s": time.monotonic() - self._down_since},
            )
            self._down_since = None
        if conflicts:
            logger.warning(
                "%(n)d stat increment(s) found a value that is not a number in %(key)s "
                "and replaced it",
                {"n": conflicts, "key": self.shared.key},
            )
        return True

    def _failed(self, error: Exception) -> None:
        code = refusal(error) or ("" if isinstance(error, UNREACHABLE) else "ERR")
        if self._down_since is None:
            self._down_since = time.monotonic()
            what = f"refuses writes ({code}: {error})" if code else f"is unreachable ({error})"
            logger.warning(
                "Redis %(what)s: keeping this worker's stats changes for %(key)s and "
                "retrying every %(interval)gs",
                {"what": what, "key": self.shared.key, "interval": self.flush_interval},
                exc_info=not isinstance(error, redis.RedisError),
            )
        self.inc_value(f"stats/redis/refused/{code}" if code else "stats/redis/unreachable")

    def _flush_at_close(self) -> None:
        """Flush, retrying with the outbox's backoff for up to ``close_timeout``
        seconds; report what could not be written (count and values, in the log)."""
        deadline = time.monotonic() + self.close_timeout
        backoff = BACKOFF_MIN
        while not self.flush():
            if time.monotonic() + backoff > deadline:
                with self._lock:
                    left = {
                        stat: [[op.kind, op.value] for op in ops]
                        for stat, ops in self._pending.items()
                    }
                logger.error(
                    "Could not write the last stats changes of this worker to %(key)s "
                    "within %(timeout)gs: the crawl's stats miss %(n)d change(s), kept "
                    "here: %(left)s",
                    {
                        "key": self.shared.key,
                        "timeout": self.close_timeout,
                        "n": len(left),
                        "left": json.dumps(left, cls=_Encoder, sort_keys=True),
                    },
                )
                return
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def crawl_stats(self) -> dict[str, Any]:
        """The crawl's merged stats as last flushed by every worker (one round trip)."""
        return self.shared.read()
