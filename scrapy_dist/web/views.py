"""The JSON views of ``scrapy-dist web`` and the actions behind its buttons.

Every figure ``status`` also shows is read through :func:`scrapy_dist.status.read_status`
(the same numbers on the page and in ``status``); this module adds what ``status`` does
not read: the answer in words, the history samples heartbeats keep (``<crawl>:history``),
each worker's own figures and its leases' deadline, the queue by priority level and its
oldest entries, the Redis server's memory, eviction policy and the refusals workers
counted (:mod:`scrapy_dist.web.health`), a page of dead letters grouped by reason, and the
control audit trail. Every read is bounded
(``LRANGE`` of a page, one ``HLEN`` per worker shown), so a crawl with 100,000 dead
letters or 1,000 workers costs the page a few round trips, never a full read.

Actions reuse what the commands use: :class:`scrapy_dist.deadletter.Requeuer` with the
checks of ``scrapy-dist dead requeue``, and :func:`scrapy_dist.control.set_state`.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import redis

from scrapy_dist import deadletter
from scrapy_dist.control import DRAINING, PAUSED, read_log, set_state
from scrapy_dist.keys import level_key
from scrapy_dist.status import json_safe, read_status
from scrapy_dist.web import health

if TYPE_CHECKING:
    from scrapy import Spider

    from scrapy_dist.config.core import Config
    from scrapy_dist.status import CrawlLayout, CrawlStatus

#: Most records one page of dead letters (or workers) holds.
PAGE_MAX = 500
#: Dead letters read to group them by reason (the newest; the page says so).
GROUP_SAMPLE = 1_000
#: Priority levels listed (the most urgent first).
LEVELS_SHOWN = 50
#: Seconds a summary is reused by the views polled at the same time.
SUMMARY_TTL = 0.5
#: History samples sent at most (a day at one sample per 5 s).
HISTORY_MAX = 17_280

_HISTORY_FIELDS = ("time", "pages", "items", "done", "queued", "leased", "dead")


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def answer(status: CrawlStatus) -> dict[str, Any]:
    """The crawl's state in one word and one sentence, and what was lost in words.

    ``state``: ``running`` (work waiting or leased, workers alive), ``paused``,
    ``draining``, ``idle`` (nothing to do, not finished; ``waiting`` for seeds before
    anything was done), ``finished``, ``lost`` (work waiting but no live worker to do
    it) or ``absent`` (no key of the crawl in Redis).
    """
    live = len(status.live_workers())
    control = status.control.state if status.control is not None else "running"
    base = status.state
    work = status.seeds + status.queued + status.leased
    if base == "absent":
        state, words = "absent", "No key of this crawl exists in Redis."
    elif control == PAUSED:
        state, words = "paused", f"Paused: {work} request(s) and seed(s) wait; {live} worker(s) up."
    elif control == DRAINING:
        state, words = "draining", f"Draining: {live} worker(s) finishing, {work} left queued."
    elif base == "busy" and live == 0:
        state = "lost"
        words = f"Stalled: {work} request(s) and seed(s) wait but no worker is alive."
    elif base == "busy":
        state = "running"
        words = f"Running: {live} worker(s), {status.queued} queued, {status.leased} leased."
    elif base == "finished":
        state, words = "finished", "Finished: nothing queued, nothing leased, no worker left."
    elif base == "waiting":
        state = "idle"
        words = f"Waiting for seeds: push them to {status.seeds_key} (scrapy-dist push)."
    else:
        state = "idle"
        words = f"Idle: nothing queued or leased; {live} worker(s) wait for more seeds."
    dead = status.dead
    lost = "Nothing lost." if dead == 0 else f"{dead} dead letter(s): not crawled, kept to requeue."
    return {"state": state, "words": words, "lost": lost, "dead": dead, "live_workers": live}


def hints(status: CrawlStatus, layout: CrawlLayout) -> list[str]:
    """What to do at a dead end, each naming the setting or the command."""
    found = []
    done = status.progress.get("done", 0)
    if status.exists and status.seeds + status.queued + status.leased == 0 and not done:
        found.append(
            f"No seeds: push some to {layout.seeds!r} (scrapy-dist push SPIDER URL, or "
            f"redis-cli lpush {layout.seeds} URL); the spider's redis_key names that key."
        )
    if status.rates is None and done:
        found.append(
            "No crawl-wide stats yet: pages/s and items/s need STATS_CLASS = "
            "'scrapy_dist.stats.RedisStatsCollector' in the workers' settings (written "
            "every STATS_FLUSH_INTERVAL seconds)."
        )
    for key in status.set_aside:
        found.append(f"Key {key!r} held the wrong type and was set aside: inspect, then delete it.")
    if status.control is not None and status.control.problem:
        found.append(f"The control key is invalid ({status.control.problem}): workers read paused.")
    return found


@dataclass
class Dashboard:
    """The views of one crawl, over one client (thread-safe: redis-py pools its
    connections; the summary cache is locked).

    Args:
        client: a client of the crawl's Redis.
        layout: the crawl's keys and types.
        config: the settings.
        spidercls: the spider class if known (requeue checks its callbacks).
    """

    client: redis.Redis
    layout: CrawlLayout
    config: Config
    spidercls: type[Spider] | None = None
    _cached: tuple[float, CrawlStatus] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: worker -> (server time, pages) seen last, for each worker's rate.
    _seen: dict[str, tuple[float, float, float]] = field(default_factory=dict, repr=False)

    # -- reads ---------------------------------------------------------------------

    def status(self, *, fresh: bool = False) -> CrawlStatus:
        """:func:`read_status` of the crawl, reused for :data:`SUMMARY_TTL` seconds."""
        with self._lock:
            now = time.monotonic()
            if not fresh and self._cached is not None and now - self._cached[0] < SUMMARY_TTL:
                return self._cached[1]
        status = read_status(self.client, self.layout, self.config)
        with self._lock:
            self._cached = (time.monotonic(), status)
        return status

    def summary(self) -> dict[str, Any]:
        """``status --json`` (:meth:`CrawlStatus.as_dict`) with the answer and hints."""
        status = self.status()
        data = json_safe(status.as_dict())
        data["answer"] = answer(status)
        data["hints"] = hints(status, self.layout)
        del data["workers"]["list"]  # /api/workers pages them
        return cast("dict[str, Any]", data)

    def workers(self, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """A page of the registered workers (sorted by id): heartbeat age, leases held,
        own pages and items, pages/s since the last read, and for a silent worker the
        seconds until its leases return to the queue (their deadline in ``holders``).
        The rows are :meth:`CrawlStatus.worker_rows`' (what ``status`` read), the
        page's figures one more round trip."""
        status = self.status()
        limit = max(1, min(limit, PAGE_MAX))
        # (status read every worker's leases and their deadline: the rows are its own)
        registered = [row for row in status.worker_rows() if row["heartbeat"] is not None]
        ids = [row["id"] for row in registered]
        page = registered[max(0, offset) : max(0, offset) + limit]
        figures: Any = []
        if page:  # the page's own figures (lua/heartbeat.lua): one round trip
            try:
                figures = self.client.hmget(
                    self.layout.keys.worker_figures, [row["id"] for row in page]
                )
            except redis.ResponseError:  # a key of another type: no figures shown
                figures = None
        if not isinstance(figures, list):
            figures = [None] * len(page)
        rows = []
        for row, raw in zip(page, figures, strict=True):
            pages = items = buffered = None
            rate = None
            if raw is not None:
                parts = _text(raw).split()
                try:
                    at, pages, items, buffered = (float(p) for p in parts[:4])
                except ValueError:
                    at = 0.0
                if pages is not None:
                    rate = self._rate(row["id"], at, pages)
            rows.append(
                {
                    "id": row["id"],
                    "heartbeat": row["heartbeat"],
                    "age": round(row["age"], 1),
                    "live": row["live"],
                    "silent": row["state"] != "live",
                    "leases": row["leases"],
                    "buffered": None if buffered is None else int(buffered),
                    "pages": None if pages is None else int(pages),
                    "items": None if items is None else int(items),
                    "pages_per_second": rate,
                    "leases_return_in": row["leases_return_in"] if row["leases"] else None,
                }
            )
        return {
            "time": status.time,
            "total": len(ids),
            "live": len(status.live_workers()),
            "offset": offset,
            "limit": limit,
            "timeout": status.worker_timeout,
            "lease_timeout": self.config.frontier.lease_timeout,
            "workers": rows,
        }

    def _rate(self, worker: str, at: float, pages: float) -> float | None:
        """Pages/s of ``worker`` between its figures seen last and now."""
        with self._lock:
            before = self._seen.get(worker)
            if before is None or at > before[0]:
                self._seen[worker] = (at, pages, before[2] if before else 0.0)
            if before is None:
                return None
            if at > before[0]:
                rate = max(0.0, (pages - before[1]) / (at - before[0]))
                self._seen[worker] = (at, pages, rate)
                return round(rate, 2)
            return round(before[2], 2)

    def frontier(self) -> dict[str, Any]:
        """Seeds waiting, requests queued by priority level (a priority queue's first
        :data:`LEVELS_SHOWN` levels), leased, the busiest download slots (requests
        sent, pages, 4xx, 5xx, failed) and those paused, and the hints."""
        status = self.status()
        queue = self.layout.keys.requests
        levels: list[dict[str, Any]] = []
        if self.layout.queue_kind == "levels":
            names = cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(
                    self.layout.keys.request_levels, 0, LEVELS_SHOWN - 1, withscores=True
                ),
            )
            with self.client.pipeline(transaction=False) as pipe:
                for name, _ in names:
                    pipe.llen(level_key(queue, _text(name)))
                counts = pipe.execute(raise_on_error=False)
            for (_, score), count in zip(names, counts, strict=True):
                if isinstance(count, int) and count:
                    levels.append({"priority": -score or 0, "queued": count})
        return {
            "seeds": {"key": status.seeds_key, "type": status.seeds_kind, "waiting": status.seeds},
            "queue": {"key": queue, "type": status.queue_kind, "queued": status.queued},
            "levels": levels,
            "queue_slots": status.queue_slots,
            "oldest": health.oldest_entries(self.client, self.layout),
            "leased": status.leased,
            "slots": {
                "counted": status.slots_counted,
                "busiest": status.busiest_slots,
                "paused": status.paused_slots,
            },
            "shards": status.shards,
            "hints": hints(status, self.layout),
            "set_aside": status.set_aside,
        }

    def server(self) -> dict[str, Any]:
        """The Redis server and what the workers met there: memory used and
        ``maxmemory``, the eviction policy and what it may evict of the crawl, the
        refusals counted in the crawl's shared stats (``stats_shared``: whether there
        are any, ``RedisStatsCollector``), and the items stream's lag and pending count
        per consumer group (``None`` without a stream). One ``INFO`` beside the summary."""
        status = self.status()
        stream = status.item_stream
        return {
            "redis": status.redis,
            "memory": health.memory(self.client, health.expiring_keys(status)),
            "stats_shared": bool(status.stats),
            "refusals": health.refusals(status.stats),
            "item_stream": None if stream is None else json_safe(stream.as_dict()),
        }

    def dead(self, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """A page of dead letters (``LRANGE``, shard 0's list as ``dead list`` numbers
        it) with each record's raw data, and the reasons of the first
        :data:`GROUP_SAMPLE` records counted (``sampled`` says how many were read)."""
        key = self.layout.keys.dead
        limit = max(1, min(limit, PAGE_MAX))
        offset = max(0, offset)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.llen(key)
            pipe.lrange(key, offset, offset + limit - 1)
            pipe.lrange(key, 0, GROUP_SAMPLE - 1)
            total, page, sample = pipe.execute()
        records = []
        for index, raw in enumerate(cast("list[bytes]", page), offset):
            record = deadletter.parse(raw)
            records.append(
                {
                    "index": index,
                    "kind": record.get("kind"),
                    "reason": str(record.get("reason", "")),
                    "url": deadletter.url_of(record),
                    "time": record.get("time"),
                    "record": json_safe(record),
                }
            )
        groups: dict[str, int] = {}
        for raw in cast("list[bytes]", sample):
            reason = _reason_group(str(deadletter.parse(raw).get("reason", "")))
            groups[reason] = groups.get(reason, 0) + 1
        return {
            "key": key,
            "total": int(total),
            "all_shards": self.status().dead,
            "offset": offset,
            "limit": limit,
            "records": records,
            "groups": sorted(
                ({"reason": r, "count": n} for r, n in groups.items()), key=lambda g: -g["count"]
            ),
            "sampled": len(sample),
        }

    def history(self, limit: int = 720) -> dict[str, Any]:
        """The crawl's history, oldest first (``LRANGE`` of the newest ``limit``
        samples), with pages/s and items/s between consecutive samples."""
        limit = max(2, min(limit, HISTORY_MAX))
        raw = cast("list[bytes]", self.client.lrange(self.layout.keys.history, 0, limit - 1))
        samples: list[dict[str, float | None]] = []
        for item in reversed(raw):
            try:
                values = [float(v) for v in _text(item).split()[: len(_HISTORY_FIELDS)]]
            except ValueError:
                continue
            if len(values) == len(_HISTORY_FIELDS):
                samples.append(dict(zip(_HISTORY_FIELDS, values, strict=True)))
        for before, after in itertools.pairwise(samples):
            span = float(after["time"] or 0) - float(before["time"] or 0)
            for name in ("pages", "items"):
                moved = float(after[name] or 0) - float(before[name] or 0)
                rate = moved / span if span > 0 else 0.0
                after[f"{name}_per_second"] = round(max(0.0, rate), 3)
        if samples:
            samples[0]["pages_per_second"] = samples[0]["items_per_second"] = None
        return {"key": self.layout.keys.history, "samples": samples}

    def control(self) -> dict[str, Any]:
        """The control state and its audit trail (newest first)."""
        status = self.status()
        return {
            "key": self.layout.keys.control,
            "state": None if status.control is None else status.control.as_dict(),
            "log": read_log(self.client, self.layout.keys),
        }

    # -- actions -------------------------------------------------------------------

    def set_control(self, state: str, reason: str, by: str) -> dict[str, Any]:
        """Pause, resume or drain (:func:`~scrapy_dist.control.set_state`).

        Raises:
            ConfigurationError: an unknown state, an invalid reason or by.
        """
        before, after = set_state(self.client, self.layout.keys, state, by=by, reason=reason)
        self._cached = None
        return {
            "changed": after is not before,
            "before": before.as_dict(),
            "state": after.as_dict(),
        }

    def requeue(self, indexes: list[int] | None) -> dict[str, Any]:
        """Requeue every dead letter of every shard (``indexes`` ``None``), or those of
        shard 0 at ``indexes``, as ``scrapy-dist dead requeue`` does.

        Raises:
            deadletter.NoSuchRecord: an index past the end.
            deadletter.ListContended: the list kept changing under the requeue.
        """
        from scrapy_dist.cli.dead import shard_requeuer
        from scrapy_dist.frontier.shards import other_shards

        layout, config, client = self.layout, self.config, self.client
        shards = [
            (client, layout.keys),
            *other_shards(client, layout.keys, config.keys, config.frontier.shards),
        ]
        if indexes is not None:
            shards = shards[:1]
        requests = seeds = left = 0
        skipped: list[dict[str, Any]] = []
        for node, keys in shards:
            requeuer = shard_requeuer(
                client, node, keys, layout=layout, config=config, spidercls=self.spidercls
            )
            if indexes is None:
                requeuer.all()
            else:
                requeuer.indexes(indexes)
            requests += requeuer.requests
            seeds += requeuer.seeds_done
            skipped += [{"index": i, "reason": r} for i, r in requeuer.skipped]
            left += int(node.llen(keys.dead))
        self._cached = None
        return {"requests": requests, "seeds": seeds, "skipped": skipped, "left": left}

    def purge(self, expected: int) -> dict[str, Any]:
        """Delete the dead letters of every shard, if they still number ``expected``
        (the count the user confirmed); else delete nothing."""
        from scrapy_dist.frontier.shards import other_shards

        lists = [(self.client, self.layout.keys.dead)]
        lists += [
            (node, keys.dead)
            for node, keys in other_shards(
                self.client, self.layout.keys, self.config.keys, self.config.frontier.shards
            )
        ]
        found = sum(int(node.llen(key)) for node, key in lists)
        if found != expected:
            return {"purged": 0, "found": found, "refused": f"{found} record(s), not {expected}"}
        purged = 0
        for node, key in lists:
            with node.pipeline(transaction=True) as pipe:
                pipe.llen(key)
                pipe.delete(key)
                count, _ = pipe.execute()
            purged += int(count)
        self._cached = None
        return {"purged": purged, "found": found, "refused": None}


def _reason_group(reason: str) -> str:
    """A reason with its particulars masked (URLs as ``<url>``, numbers as ``#``, cut
    to 200 characters), so that one failure on many URLs groups together."""
    masked = _URL.sub("<url>", reason)
    return _NUMBER.sub("#", masked)[:200]


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
