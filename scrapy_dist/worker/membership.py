"""This worker's part in the shared crawl: joining it, losing it, leaving it.

- **Join** (at the scheduler's open): check Redis and the crawl's keys, open the
  dupefilter, join the crawl's worker registry (flushing the crawl first with
  ``SCHEDULER_FLUSH_ON_START``, and only when no other worker runs), and log what this
  worker joined.
- **Lost** (:attr:`Frontier.lost`): the crawl's frontier is gone. The worker drops what
  it holds of it; once the engine has finished what it had started, the worker rejoins
  the crawl if it finished (or exits, with ``CLOSE_WHEN_CRAWL_DONE``), else closes
  the spider with the reason ``frontier_lost``.
- **Not yet** (a worker about to close for idleness, :class:`CloseWait`): it stays while
  other workers hold leases that may still bring it work (a killed worker's come back
  when they expire).
- **Leave** (at the scheduler's close): settle what the engine finished, hand back
  what it never started, send pending writes, leave the registry; if the crawl as a
  whole is finished and does not persist, delete its shared keys (a worker that merely
  stops never does). A crawl that is paused or draining (:mod:`scrapy_dist.control`)
  is never checked for completion: it is not finished, whatever it holds.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import time
from typing import TYPE_CHECKING

import redis

from scrapy_dist.connection import check, describe
from scrapy_dist.frontier.core import FINISHED
from scrapy_dist.frontier.leases import refuse_beside_previous
from scrapy_dist.seeds import similar_seed_keys
from scrapy_dist.worker import engine as _engine

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter

    from scrapy_dist.dupefilter import RFPDupeFilter
    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.frontier.leases import Held
    from scrapy_dist.frontier.progress import Progress
    from scrapy_dist.frontier.registry import WorkerRegistry
    from scrapy_dist.worker.control import WorkerControl
    from scrapy_dist.worker.deliveries import Deliveries

logger = logging.getLogger(__name__)

#: Flushes tried at close (requests, then the acknowledgements they confirm, retries).
CLOSE_FLUSHES = 5
#: Close reason of a worker whose crawl's frontier vanished (see :attr:`Frontier.lost`).
FRONTIER_LOST = "frontier_lost"


def exit_with(status: int) -> None:
    """Make this process exit with ``status`` once it ends (``scrapy crawl`` exits 0
    whatever the close reason): logging is flushed first."""

    def _exit() -> None:
        logging.shutdown()
        os._exit(status)

    atexit.register(_exit)


#: Seconds: a silent holder's deadline further away than this (and than this worker's
#: lease timeout) was written by hand, and is not waited for.
FAR_DEADLINE = 86400.0


class CloseWait:
    """Keeps a worker that would close for idleness open while other workers hold
    leases (:meth:`Frontier.held_elsewhere`). A killed worker's return to the queue when
    their deadline passes, and this worker's next reserve takes them: without the wait,
    the last worker of a crawl could close first, the crawl unfinished and those pages
    never parsed.

    Args:
        frontier: the crawl's frontier.
        heartbeat_interval: this worker's ``SCHEDULER_HEARTBEAT_INTERVAL``, taken as
            the crawl's.
        live_too: wait for every other worker's leases. A plain spider, which closes as
            soon as its queue runs dry, waits for them all: a live worker's pages queue
            more requests (a second worker started with the first would otherwise
            close at once, its start request filtered as the first's duplicate).
            Without it (a Redis spider, which waits for seeds and closes after
            ``MAX_IDLE_TIME_BEFORE_CLOSE`` as scrapy-redis's does), a holder is waited
            for until it is heard from: its heartbeat is newer than at this worker's
            first look (it is alive: not waited for), or it is silent for two
            heartbeat intervals (killed, or stalled: waited for until its leases are
            gone). A worker killed just before this one's idle limit is so never taken
            for a live one.
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        heartbeat_interval: float,
        *,
        live_too: bool,
        every: float | None = None,
    ) -> None:
        self.frontier = frontier
        self.live_too = live_too
        #: Seconds without a heartbeat after which a holder counts as silent.
        self.quiet_for = 2 * heartbeat_interval
        #: Seconds between two looks in Redis (default: half a heartbeat interval);
        #: a call in between gives the last answer.
        self.every = heartbeat_interval / 2 if every is None else every
        self._last: tuple[float, bool] | None = None
        #: Silent holders already warned of for a deadline past :data:`FAR_DEADLINE`.
        self._far: set[str] = set()
        #: Each holder's heartbeat at the first look of this closing attempt.
        self._first: dict[str, float | None] = {}
        #: When this worker last looked (server time); a later look past ``quiet_for``
        #: starts a new attempt.
        self._looked_at = 0.0
        self._told: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        #: When another worker last claimed a start request of this one (monotonic).
        self._expected_at = -math.inf

    def expect(self) -> None:
        """Another worker of the run claimed a start request of this one: it reaches the
        queue with that worker's next flush, so the queue may look empty until then.
        :meth:`holds` says so for two heartbeat intervals."""
        self._expected_at = time.monotonic()

    def forget(self) -> None:
        """This worker found work: the last answer (cached for :attr:`every` seconds)
        may be about requests it has taken since, so the next call looks again."""
        self._last = None

    def holds(self, spider: Spider | None) -> bool:
        """Whether the worker stays open: others hold leases it waits for, requests are
        queued, a start request of this worker was claimed elsewhere lately
        (:meth:`expect`), or Redis cannot say (unreachable). Logs the holders it waits
        for whenever they change, and sets the stat ``scheduler/idle/held_elsewhere`` to
        the number of their leases. Looks in Redis at most once per :attr:`every`
        seconds."""
        if time.monotonic() - self._expected_at < self.quiet_for:
            return True
        if self._last is not None and time.monotonic() - self._last[0] < self.every:
            return self._last[1]
        answer = self._look(spider)
        self._last = (time.monotonic(), answer)
        return answer

    def _look(self, spider: Spider | None) -> bool:
        found = self.frontier.held_elsewhere()
        if found is None:
            return True
        held, beats, now, queued = found
        if queued:  # (this worker's next reserve takes some)
            return True
        # a heartbeat is stamped with the server's clock: one ahead of it by more than
        # the silence allowed was written by hand, and is no sign of life
        beats = {w: beat for w, beat in beats.items() if beat <= now + self.quiet_for}
        held = self._without_far(spider, held, beats, now)
        if now - self._looked_at > self.quiet_for:
            self._first = {}
        self._looked_at = now
        silent = [w for w in held if w not in beats or now - beats[w] > self.quiet_for]
        if self.live_too:
            waited = list(held)
        else:
            # a holder heard from is waited for until it beats again
            first = {w: self._first.get(w, beats.get(w)) for w in held}
            waited = [w for w in held if w in silent or beats.get(w) == first[w]]
            self._first = first
        leases = sum(held[w].leases for w in waited)
        self.frontier.stats.set_value("scheduler/idle/held_elsewhere", leases)
        if not waited:
            self._told = None
            return False
        self._tell(spider, held, waited, silent, now)
        return True

    def _without_far(
        self, spider: Spider | None, held: dict[str, Held], beats: dict[str, float], now: float
    ) -> dict[str, Held]:
        """``held`` without silent holders whose deadline is further away than
        :data:`FAR_DEADLINE` (or this worker's lease timeout, if longer): no lease a
        worker grants lasts that long, the deadline was written by hand and would keep
        the worker open until then. Each is warned of once: its leases stay until that
        deadline. (A worker with a longer lease timeout than this one's is waited for.)"""
        limit = now + max(FAR_DEADLINE, self.frontier.lease_timeout) + self.quiet_for
        kept = {}
        for worker, found in held.items():
            silent = worker not in beats or now - beats[worker] > self.quiet_for
            if silent and found.until > limit:
                if worker not in self._far:
                    self._far.add(worker)
                    logger.warning(
                        "Not waiting for %(n)d lease(s) held by %(worker)s, not heard from: "
                        "%(expiry)s (a deadline written by hand?); they stay leased until "
                        "then",
                        {"n": found.leases, "worker": worker, "expiry": _expiry(found.until - now)},
                        extra={"spider": spider},
                    )
                continue
            kept[worker] = found
        return kept

    def _tell(
        self,
        spider: Spider | None,
        held: dict[str, Held],
        waited: list[str],
        silent: list[str],
        now: float,
    ) -> None:
        """Log what the worker waits for, once per change of the workers it waits for
        and of those of them it has not heard from."""
        silent = [w for w in silent if w in waited]
        told = (tuple(sorted(waited)), tuple(sorted(silent)))
        if told == self._told:
            return
        self._told = told
        args = {
            "n": len(waited),
            "names": _names(waited),
            "leases": sum(held[w].leases for w in waited),
            "silent": len(silent),
            "silent_names": _names(silent),
            "silent_leases": sum(held[w].leases for w in silent),
            "quiet": self.quiet_for,
            "wait": _seconds(max([0.0, *(held[w].until - now for w in silent)])),
        }
        if self.live_too and not silent:
            logger.info(
                "Not closing yet: %(n)d other worker(s) (%(names)s) hold %(leases)d "
                "lease(s); their pages may queue more requests",
                args,
                extra={"spider": spider},
            )
        elif self.live_too:
            logger.info(
                "Not closing yet: %(n)d other worker(s) (%(names)s) hold %(leases)d "
                "lease(s); %(silent)d of them not heard from for %(quiet)gs (%(silent_names)s): "
                "their leases return to the queue when they expire, in %(wait)s",
                args,
                extra={"spider": spider},
            )
        elif silent:
            logger.info(
                "Not closing yet: %(silent_leases)d lease(s) held by %(silent)d worker(s) not "
                "heard from for %(quiet)gs (%(silent_names)s) return to the queue when they "
                "expire, in %(wait)s; this worker takes them then",
                args,
                extra={"spider": spider},
            )
        else:
            logger.debug(
                "Not closing yet: waiting for a heartbeat of %(names)s, which hold leases",
                args,
                extra={"spider": spider},
            )


def _seconds(seconds: float) -> str:
    """A wait for a log line: whole seconds, or three digits when it is huge (a deadline
    written by hand)."""
    return f"{seconds:.0f}s" if abs(seconds) < 1e7 else f"{seconds:.3g}s"


def _expiry(seconds: float) -> str:
    """When leases expire, ``seconds`` from now, for a log line."""
    return f"they expire in {_seconds(seconds)}" if math.isfinite(seconds) else "they never expire"


def _names(workers: list[str]) -> str:
    """Up to three worker ids, for a log line."""
    return ", ".join(sorted(workers)[:3]) + (", ..." if workers[3:] else "")


class Membership:
    """Joins, loses and leaves the crawl for one worker (see the module docstring).

    Args:
        frontier: the crawl's frontier.
        registry: this worker's handle on the crawl's worker registry.
        deliveries: the leases this worker holds.
        dupefilter: the crawl's dupefilter.
        shared_df: the dupefilter, when its test-and-set runs inside the enqueue script
            (its local seen-cache is dropped with the crawl).
        crawler: the crawler whose spider a lost crawl closes (``None``: never closed).
        persist: keep the queue and dupefilter when the crawl finishes.
        flush_on_start: clear the queue and dupefilter at open if no other worker runs.
        close_when_done: exit, rather than rejoin, when the crawl finished without
            this worker (``CLOSE_WHEN_CRAWL_DONE``).
        control: the crawl's control state, read at join and at leave (``None``: the
            crawl always runs).
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        registry: WorkerRegistry,
        deliveries: Deliveries,
        dupefilter: BaseDupeFilter,
        *,
        shared_df: RFPDupeFilter | None,
        crawler: Crawler | None,
        persist: bool,
        flush_on_start: bool,
        close_when_done: bool,
        control: WorkerControl | None = None,
    ) -> None:
        self.frontier = frontier
        self.registry = registry
        self.deliveries = deliveries
        self.df = dupefilter
        self.shared_df = shared_df
        self.crawler = crawler
        self.persist = persist
        self.flush_on_start = flush_on_start
        self.close_when_done = close_when_done
        self.control = control
        #: Whether :meth:`join` succeeded (a failed start did not).
        self.joined = False
        #: The spider named in log records.
        self.spider: Spider | None = None
        self._closing = False

    # -- join -----------------------------------------------------------------------

    def join(self, spider: Spider) -> None:
        """Check Redis and the crawl's keys, open the dupefilter and join the crawl.

        Raises:
            RedisUnavailable: Redis cannot be reached.
            ConfigurationError: a key holds a type this crawl cannot use, or Redis may
                evict frontier keys (``REDIS_EVICTION_POLICY_CHECK``).
            redis.RedisError: Redis refused a command.
        """
        self.spider = spider
        queue = self.frontier.queue
        check(queue.client)
        # (moves a previous version's priority queue into levels, if none of its workers runs)
        moved = queue.open(self.registry.alive)
        # (and refuses to run beside a previous version's worker that holds leases)
        refuse_beside_previous(
            queue.client,
            self.frontier.keys,
            self.frontier.worker_id,
            self.frontier.lease_timeout,
            self.registry.alive,
        )
        self.frontier.seeds.check_type()
        shared = self.shared_df
        expiring = shared.expiring_keys() if shared is not None else []
        self.frontier.check_eviction_policy(expiring)
        self.df.open()
        if moved:
            logger.info(
                "Moved %(n)d queued request(s) of crawl %(crawl)s %(how)s",
                {"n": moved, "crawl": self.frontier.keys.crawl, "how": queue.moved_how},
                extra={"spider": spider},
            )
        if shared is None:
            logger.warning(
                "DUPEFILTER_CLASS %(cls)s is not Redis-backed: each worker filters only "
                "what it saw itself, so workers will crawl the same pages. Use "
                "scrapy_dist.dupefilter.RFPDupeFilter.",
                {"cls": type(self.df).__name__},
                extra={"spider": spider},
            )
        others, flushed = self.registry.join(flush=self.flush_on_start)
        self.joined = True
        if flushed:
            logger.info(
                "Flushed crawl %(crawl)s (SCHEDULER_FLUSH_ON_START)",
                {"crawl": self.frontier.keys.crawl},
                extra={"spider": spider},
            )
        elif self.flush_on_start:
            logger.warning(
                "SCHEDULER_FLUSH_ON_START is set but %(n)d other worker(s) of this crawl "
                "are running: joining their crawl instead of flushing it",
                {"n": others},
                extra={"spider": spider},
            )
        self.frontier.join_epoch()
        self._log_joined(spider, others)
        self._hint_misspelled_seeds(spider)
        if self.control is not None:
            self.control.open(spider)

    def _log_joined(self, spider: Spider, others: int) -> None:
        keys, queue, seeds = self.frontier.keys, self.frontier.queue, self.frontier.seeds
        logger.info(
            "Worker %(worker)s joined crawl %(crawl)s at %(server)s (%(size)d queued "
            "requests; %(others)d other worker(s)); seeds key %(seeds)s (%(kind)s), "
            "queue %(queue)s, dupefilter %(df)s, dead letters %(dead)s",
            {
                "worker": self.registry.worker_id,
                "crawl": keys.crawl,
                "server": describe(queue.client),
                "size": len(queue),
                "others": others,
                "seeds": seeds.key,
                "kind": seeds.kind,
                "queue": queue.key,
                "df": keys.dupefilter,
                "dead": keys.dead,
            },
            extra={"spider": spider},
        )
        queued = len(queue)
        if queued:  # scrapy-redis's message, which users grep their logs for
            spider.logger.info("Resuming crawl (%(n)d requests scheduled)", {"n": queued})

    def _hint_misspelled_seeds(self, spider: Spider) -> None:
        """If the seeds key is empty, name keys with a similar name that hold seeds (one
        ``SCAN`` of at most :data:`~scrapy_dist.seeds.HINT_SCAN_COUNT` keys, at open only)."""
        seeds = self.frontier.seeds
        try:
            similar = [] if len(seeds) else similar_seed_keys(self.frontier.queue.client, seeds.key)
        except redis.RedisError as e:  # e.g. an ACL user without SCAN: only a hint lost
            logger.debug("No seeds key hint: %(error)s", {"error": e})
            return
        if similar:
            logger.warning(
                "Seeds key %(key)s is empty, but %(similar)s exist(s): were seeds pushed to "
                "the wrong key? (the seeds key is REDIS_START_URLS_KEY or the spider's "
                "redis_key)",
                {"key": seeds.key, "similar": ", ".join(similar)},
                extra={"spider": spider},
            )

    # -- a crawl that is gone --------------------------------------------------------

    def crawl_lost(self, state: str) -> None:
        """The crawl is gone (a listener of the frontier's
        :meth:`~scrapy_dist.frontier.events.FrontierEvents.crawl_lost`): drop what this worker
        holds of it (buffer, seen-cache); what the engine still runs finishes, and the
        requests it produces are dropped."""
        started = len(self.deliveries.out)
        buffered = self.deliveries.drop_buffered()
        if self.shared_df is not None:
            self.shared_df.forget_local()
        if buffered or started:
            logger.warning(
                "Crawl %(crawl)s is %(state)s: dropped the %(buffered)d buffered request(s) "
                "this worker still held; %(started)d already started finish, and what they "
                "produce is dropped",
                {
                    "crawl": self.frontier.keys.crawl,
                    "state": state,
                    "buffered": buffered,
                    "started": started,
                },
                extra={"spider": self.spider},
            )
        self._closing = False

    def after_lost(self) -> None:
        """Once the engine finished what it held of a lost crawl: rejoin the crawl if
        it finished (or exit, with ``CLOSE_WHEN_CRAWL_DONE``), else close the spider
        with the reason ``frontier_lost``."""
        if self.deliveries.out or self._closing or self.crawler is None:
            return
        if self.frontier.lost == FINISHED and not self.close_when_done:
            epoch = self.frontier.join_epoch()
            logger.info(
                "Rejoined crawl %(crawl)s (epoch %(epoch)s)",
                {"crawl": self.frontier.keys.crawl, "epoch": epoch},
                extra={"spider": self.spider},
            )
            return
        self._closing = True
        reason = "crawl_finished" if self.frontier.lost == FINISHED else FRONTIER_LOST
        _engine.close_spider(self.crawler, reason)

    # -- leave ----------------------------------------------------------------------

    def leave(self, reason: str) -> None:
        """Settle, hand back, send what is pending and leave the crawl (see the module
        docstring); nothing if this worker never joined."""
        if not self.joined:
            return  # a failed start: nothing was taken, nothing to leave
        if self.frontier.lost is not None:
            # nothing it holds belongs to a crawl that is there: leave, send nothing
            self.deliveries.drop_all()
            try:
                self.registry.leave()
            except redis.RedisError as e:
                logger.warning("Could not leave the worker registry: %(error)s", {"error": e})
            self.df.close(reason)
            return
        handed = self.deliveries.hand_back(self.spider)
        if handed:
            logger.info(
                "Handed %(n)d unstarted request(s) back to the shared queue",
                {"n": handed},
                extra={"spider": self.spider},
            )
        self._send_pending()
        left = self.frontier.call(self.registry.leave)
        if self.control is not None and not self.control.allows_completion(fresh=True):
            logger.info(
                "Crawl %(crawl)s is %(state)s: not checking it for completion",
                {"crawl": self.frontier.keys.crawl, "state": self.control.watcher.state.state},
                extra={"spider": self.spider},
            )
        else:
            progress = self.frontier.progress(grace=0, clear=not self.persist)
            if progress is not None:
                self._log_close(progress.state, progress)
                if progress.state == "finished" and not self.persist and left is not None:
                    # the record of its completion is for workers of the run that are
                    # gone or paused: with none, a clean stop leaves no key behind;
                    # else it goes with the record (a killed worker's registry entry)
                    self.frontier.call(lambda: self.frontier.forget_finished(now=left == (0, 0)))
        self.df.close(reason)

    def _send_pending(self) -> None:
        """Send the pending writes: requests first, then the acknowledgements Redis has
        confirmed them for."""
        for _ in range(CLOSE_FLUSHES):
            if not self.frontier.pending_writes or self.frontier.flush() is None:
                break
        if self.frontier.pending_writes:
            logger.error(
                "Redis is unreachable or refuses writes: %(n)d write(s) could not be "
                "sent before closing; "
                "the leases they would have settled expire after SCHEDULER_LEASE_TIMEOUT "
                "and their requests are crawled again",
                {"n": self.frontier.pending_writes},
                extra={"spider": self.spider},
            )

    def _log_close(self, state: str, progress: Progress) -> None:
        if state == "finished" and not self.persist:
            logger.info(
                "Crawl %(crawl)s is finished: deleted its queue, leases and dupefilter "
                "(SCHEDULER_PERSIST is off)",
                {"crawl": self.frontier.keys.crawl},
                extra={"spider": self.spider},
            )
        elif state == "busy":
            logger.info(
                "Crawl %(crawl)s goes on without this worker: %(queued)d queued, "
                "%(leased)d leased, %(seeds)d seeds waiting",
                {
                    "crawl": self.frontier.keys.crawl,
                    "queued": progress.queued,
                    "leased": progress.leased,
                    "seeds": progress.seeds,
                },
                extra={"spider": self.spider},
            )
