"""A worker's gateway to its crawl's shared state: leases, acknowledgements, completion.

One :class:`Frontier` per crawler, shared by the scheduler and the spider. Writes
(enqueues and lease settlements) go through an ordered outbox: they are sent at once,
in order, and if Redis cannot be reached they stay in memory and are retried with a
bounded exponential backoff, so a Redis outage neither crashes nor closes the crawl and
a parent's acknowledgement never overtakes the requests it produced.

Delivery (see the README, "Delivery guarantee"): taking a request or a seed moves it
into ``<crawl>:leases`` with a deadline (``lua/reserve.lua``). The worker renews the
leases it holds, and settles each one when Scrapy is done with it (``lua/settle.lua``):
acknowledged, returned for another try with the failure's reason, or handed back
untouched at shutdown. Leases whose worker died expire and return to the queue with
their delivery count; past ``SCHEDULER_MAX_DELIVERIES`` they go to the dead-letter list.

Faults (see the README, "Delivery guarantee"): a server that refuses writes for now (OOM,
NOREPLICAS, READONLY, LOADING, BUSY, MASTERDOWN, TRYAGAIN, a key of the wrong type) is
an outage like an unreachable one: the work stays in the outbox. Every frontier script
carries the crawl's epoch (``<crawl>:epoch``, ``lua/_fence.lua``): a crawl that finished,
was flushed or evicted refuses the write, and the frontier reports the crawl
:attr:`Frontier.lost` instead of re-creating its state.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, NamedTuple, cast
from weakref import WeakKeyDictionary

import redis

from scrapy_dist import deadletter
from scrapy_dist.assembly import assemble
from scrapy_dist.backends import filter_error
from scrapy_dist.connection import describe
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.exceptions import ConfigurationError, StaleFilterView
from scrapy_dist.queue import (
    ENTRY_ID_LEN,
    FifoQueue,
    LifoQueue,
    PriorityQueue,
    RedisQueue,
    leasable_queue,
    unleased_queue,
)
from scrapy_dist.scripts import scripts_for
from scrapy_dist.seeds import SeedQueue
from scrapy_dist.settings import check_frontier
from scrapy_dist.workers import new_worker_id

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from redis.commands.core import Script
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import FilterBackend

logger = logging.getLogger(__name__)

#: Outcome of a lease: Scrapy is done with it.
DONE = ""
#: Outcome of a lease: give it back untouched (not counted as a delivery).
HAND_BACK = "~"
#: Outcome prefix of a lease: dead-letter it now, with the JSON record that follows.
DEAD_NOW = "!"

#: First and longest pause between attempts to reach Redis after a failure (seconds).
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
#: Expired leases reclaimed per reserve call, at most.
RECLAIM_LIMIT = 100
#: Requests waiting in the outbox that trigger a flush without waiting for the timer.
FLUSH_MAX = 1000

#: Errors that mean "Redis is not reachable right now": keep the work, retry later.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
#: Error codes with which a reachable Redis refuses a call for now (out of memory, too
#: few replicas, a replica or a loading server, a busy script, a cluster in transition,
#: a key of the wrong type): keep the work, retry later.
REFUSALS = frozenset(
    {"OOM", "NOREPLICAS", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN",
     "CLUSTERDOWN", "WRONGTYPE"}
)  # fmt: skip
#: States of a crawl whose epoch is gone: it finished (its keys deleted), it vanished
#: (flushed, evicted, rolled back by a failover), or another crawl replaced it.
FINISHED, VANISHED, REPLACED = "finished", "vanished", "replaced"
#: Eviction policies that may delete frontier keys (they hold no TTL).
EVICTING = ("allkeys-",)


def refusal(error: BaseException) -> str | None:
    """The code of a refusal Redis may lift by itself (:data:`REFUSALS`), else ``None``."""
    if isinstance(error, redis.exceptions.ReadOnlyError):
        return "READONLY"
    if isinstance(error, redis.exceptions.BusyLoadingError):
        return "LOADING"
    if type(error).__name__ == "OutOfMemoryError":  # redis-py >= 5.0.1
        return "OOM"
    if isinstance(error, redis.exceptions.ResponseError):
        # a pipeline's error reads "Command # 1 (...) of pipeline caused error: BUSY ..."
        message = str(error).rsplit("caused error: ", 1)[-1]
        code = message.split(" ", 1)[0]
        if code in REFUSALS:
            return code
        if "used memory > 'maxmemory'" in message:
            return "OOM"
    return None


def fenced(error: BaseException) -> str | None:
    """The epoch Redis found (``"none"`` if gone) when a script refused a write for
    another epoch (``lua/_fence.lua``), else ``None``."""
    if isinstance(error, redis.exceptions.ResponseError):
        words = str(error).split()
        if len(words) >= 2 and words[0] == "EPOCH":
            return words[1]
    return None


_by_crawler: WeakKeyDictionary[Crawler, Frontier] = WeakKeyDictionary()


class Lease(NamedTuple):
    """An entry this worker holds: its lease id, how often it was delivered, its data
    (a request payload, or a raw seed)."""

    id: str
    deliveries: int
    data: bytes


class Progress(NamedTuple):
    """Where the crawl as a whole stands (see ``lua/progress.lua``)."""

    #: ``"busy"``, ``"waiting"`` (nothing settled yet), ``"idle"`` or ``"finished"``.
    state: str
    queued: int
    seeds: int
    leased: int


class _Call(NamedTuple):
    """One script call of a flush, and what to do with its reply (which may return
    leases)."""

    script: Script
    keys: list[str]
    args: list[bytes | str | int | float]
    on_reply: Callable[[Any], list[Lease] | None] | None


#: How a request goes back to each queue, and how each seed mode is read and returned.
_QUEUE_TAKE = {FifoQueue: ("rpop", "rpush"), LifoQueue: ("lpop", "lpush"),
               PriorityQueue: ("zpopmin", "zadd")}  # fmt: skip
_SEED_TAKE = {"list": ("lpop", "lpush"), "set": ("spop", "sadd"), "zset": ("zpopmax", "zadd")}


class Frontier:
    """Leases, settlements, the write outbox and crawl completion for one worker.

    Args:
        client: the crawl's Redis client.
        keys: the crawl's keys.
        queue: the shared request queue.
        seeds: the crawl's seeds key.
        worker_id: this worker's id, recorded in its leases.
        lease_timeout: seconds a lease lasts without renewal.
        max_deliveries: deliveries of one entry before it is dead-lettered.
        stats: returns the crawler's stats collector (which Scrapy creates after the
            spider, so it is looked up when first needed).
        eviction_check: what to do at open when Redis may evict frontier keys:
            ``"refuse"`` to start, ``"warn"``, or ``"off"``.
        wrongtype_timeout: seconds a queue key of the wrong type is waited for before
            the requests to enqueue into it are dead-lettered.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        queue: RedisQueue,
        seeds: SeedQueue,
        *,
        worker_id: str,
        lease_timeout: float,
        max_deliveries: int,
        stats: Callable[[], StatsCollector],
        eviction_check: str = "refuse",
        wrongtype_timeout: float = 300.0,
    ) -> None:
        check_frontier(eviction_check, lease_timeout, max_deliveries)
        take = next((v for cls, v in _QUEUE_TAKE.items() if isinstance(queue, cls)), None)
        if take is None:
            raise ConfigurationError(f"{type(queue).__name__} is not a queue scrapy_dist can lease")
        self.client = client
        self.keys = keys
        self.queue = queue
        self.seeds = seeds
        self.worker_id = worker_id
        self.lease_timeout = lease_timeout
        self.max_deliveries = max_deliveries
        self._get_stats = stats
        #: Keys deleted when a crawl that does not persist finishes.
        self.clear_keys: list[str] = list(keys.frontier())
        #: Send every write at once instead of with the next reserve or flush tick.
        self.eager = False
        #: Returns the ids of the leases this worker knows it holds (set by the scheduler).
        self.held: Callable[[], list[str]] = list
        #: A reply was lost: Redis may have leased entries this worker never received.
        self._reply_lost = False
        self._take, self._give_back = take
        self._scripts = scripts_for(client)
        self._loaded = False
        self._items: list[tuple[bytes, float, bytes]] = []
        self._replies: list[Callable[[bool], None]] = []
        self._pending_replies: list[Callable[[bool], None]] = []
        self._dupefilter: FilterBackend | None = None
        #: Settlements queued after requests not yet confirmed enqueued.
        self._outcomes: list[tuple[str, str]] = []
        #: Settlements whose earlier requests Redis has confirmed: sent with the next flush.
        self._ready: list[tuple[str, str]] = []
        self._down_since: float | None = None
        #: When a reserve of requests last found the queue empty (and nothing was
        #: pending); monotonic seconds.
        self.found_empty_at = 0.0
        self._retry_at = 0.0
        self._backoff = BACKOFF_MIN
        self.eviction_check = eviction_check
        self.wrongtype_timeout = wrongtype_timeout
        self.dead = DeadLetters(client, keys.dead, worker_id)
        #: The crawl's epoch this worker joined ("" before :meth:`open`).
        self.epoch = ""
        #: Why this worker's crawl is gone (:data:`FINISHED`, :data:`VANISHED`,
        #: :data:`REPLACED`), or ``None`` while it is there.
        self.lost: str | None = None
        #: Called with :attr:`lost` when the crawl is found gone (the scheduler drops
        #: what it holds).
        self.on_lost: list[Callable[[str], None]] = []
        #: The error code of the refusal under way ("" when Redis was unreachable).
        self._refusing = ""
        self._wrongtype_since: float | None = None
        #: This worker saw its crawl finished, holding nothing (lua/progress.lua).
        self._finished_seen = False

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> Frontier:
        """The crawler's frontier, built on first use from its settings (no I/O)."""
        try:
            return _by_crawler[crawler]
        except KeyError:
            pass
        parts = assemble(crawler)
        client, keys, config = parts.client, parts.keys, parts.config
        queue_cls = config.queue.cls
        requests_key = keys.requests
        if unleased_queue(queue_cls):  # that queue runs in the scheduler, unleased
            queue_cls, requests_key = PriorityQueue, keys.unleased
        queue_cls = leasable_queue(queue_cls, config.queue.path)
        frontier = _by_crawler[crawler] = cls(
            client,
            keys,
            queue_cls(client, requests_key, keys.seq),
            SeedQueue(client, keys.start_urls, config.seeds.kind),
            worker_id=new_worker_id(),
            lease_timeout=config.frontier.lease_timeout,
            max_deliveries=config.frontier.max_deliveries,
            stats=lambda: crawler.stats,
            eviction_check=config.frontier.eviction_check,
            wrongtype_timeout=config.frontier.wrongtype_timeout,
        )
        return frontier

    @property
    def stats(self) -> StatsCollector:
        """The crawler's stats collector."""
        return self._get_stats()

    # -- connectivity ---------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """``False`` while Redis is known to be unreachable (since the last failure)."""
        return self._down_since is None

    def _can_try(self) -> bool:
        return self._down_since is None or time.monotonic() >= self._retry_at

    def _failed(self, error: Exception) -> None:
        """Note an outage (unreachable, or refusing with :data:`REFUSALS`): one log line
        when it starts, then a growing pause before the next try."""
        self._loaded = False  # a restarted server has lost its script cache
        now = time.monotonic()
        code = refusal(error) or ("" if isinstance(error, UNREACHABLE) else "ERR")
        if self._down_since is None:
            self._down_since = now
            self._backoff = BACKOFF_MIN
            self._refusing = code
            args = {
                "server": describe(self.client),
                "code": code,
                "error": error,
                "n": self.pending_writes,
                "max": BACKOFF_MAX,
            }
            if code:
                logger.warning(
                    "Redis at %(server)s refuses writes (%(code)s: %(error)s): keeping "
                    "%(n)d pending write(s) in memory and retrying with backoff up to "
                    "%(max)ds",
                    args,
                )
            else:
                logger.warning(
                    "Redis at %(server)s is unreachable (%(error)s): keeping %(n)d pending "
                    "write(s) in memory and retrying with backoff up to %(max)ds",
                    args,
                )
        else:
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        self._retry_at = now + self._backoff
        if code:
            self.stats.inc_value(f"scheduler/redis/refused/{code}")
        else:
            self.stats.inc_value("scheduler/redis/unreachable")

    def _recovered(self) -> None:
        if self._down_since is not None:
            logger.warning(
                "Redis at %(server)s %(what)s again after %(s).1fs",
                {
                    "server": describe(self.client),
                    "what": "accepts writes" if self._refusing else "is reachable",
                    "s": time.monotonic() - self._down_since,
                },
            )
            self._down_since = None
            self._refusing = ""

    def _release_unknown(self) -> None:
        """Hand back leases Redis granted in a call whose reply never arrived (run before
        the next call, when every reply received so far has been handed over). Leases
        this worker holds anywhere (buffer, engine, outbox) are not handed back."""
        self._reply_lost = False
        k = self.keys
        keys = [k.leases, k.leased, k.deliveries, self.queue.key, self.seeds.key, k.epoch,
                self.index]  # fmt: skip
        known = [*self.held(), *(i for i, _ in self._outcomes), *(i for i, _ in self._ready)]
        args = [self.worker_id, self._give_back, _SEED_TAKE[self.seeds.kind][1], self.epoch,
                *known]  # fmt: skip
        try:
            released = int(self._scripts.release(keys=keys, args=args))
        except UNREACHABLE as e:
            self._reply_lost = True
            self._failed(e)
            return
        except redis.exceptions.ResponseError as e:
            if self._gone(e):
                return
            if refusal(e) is None:
                raise
            self._reply_lost = True
            self._failed(e)
            return
        if released:
            logger.info(
                "Handed back %(n)d request(s) or seed(s) leased by a call whose reply was "
                "lost with the connection",
                {"n": released},
            )
            self.stats.inc_value("scheduler/leases/released_unknown", released)

    def call(self, func: Callable[[], Any]) -> Any:
        """Send pending writes, then run one read or write now, noting Redis failures
        (unreachable, or refusing for now) for the backoff.

        Returns:
            What ``func`` returned, or ``None`` when Redis is unreachable or refuses
            (now or still within the backoff pause), or the crawl is :attr:`lost`.

        Raises:
            redis.RedisError: an error that is neither an outage nor a refusal.
        """
        if self.flush() is None:
            return None
        try:
            result = func()
        except UNREACHABLE as e:
            self._failed(e)
            return None
        except redis.exceptions.ResponseError as e:
            if self._gone(e):
                return None
            if refusal(e) is None:
                raise
            self._failed(e)
            return None
        self._recovered()
        self.stats.inc_value("scheduler/redis/round_trips")
        return result

    # -- the crawl's epoch ------------------------------------------------------------

    @property
    def index(self) -> str:
        """This worker's lease index key."""
        return self.keys.held(self.worker_id)

    def check_eviction_policy(self, expiring: Sequence[str] = ()) -> None:
        """Refuse (or warn about) a ``maxmemory-policy`` that may delete frontier keys:
        ``allkeys-*``, or ``volatile-*`` when some of them expire (``expiring``, e.g.
        a dupefilter with ``DUPEFILTER_TTL``).

        Raises:
            ConfigurationError: the policy may delete frontier keys and
                ``REDIS_EVICTION_POLICY_CHECK`` is ``"refuse"``.
        """
        if self.eviction_check == "off":
            return
        try:
            reply = cast("dict[str, str]", self.client.config_get("maxmemory-policy"))
        except redis.exceptions.ResponseError as e:  # CONFIG renamed or not allowed
            logger.warning(
                "Cannot read Redis's maxmemory-policy (%(error)s): make sure it is "
                "noeviction or a volatile-* policy, or frontier keys may be evicted",
                {"error": e},
            )
            return
        policy = next(iter(reply.values()), "")
        policy = policy.decode() if isinstance(policy, bytes) else str(policy)
        if policy.startswith(EVICTING):
            what = "frontier keys (queue, leases, dupefilter)"
        elif policy.startswith("volatile-") and expiring:
            what = f"the keys with an expiry ({', '.join(expiring)})"
        else:
            return
        message = (
            f"Redis at {describe(self.client)} has maxmemory-policy {policy}: at maxmemory "
            f"it evicts {what} and requests are lost or crawled again. Set it to "
            f"noeviction (a full server then refuses writes and the crawl waits), or set "
            f"REDIS_EVICTION_POLICY_CHECK = 'warn' to run anyway"
        )
        if self.eviction_check == "refuse":
            raise ConfigurationError(message)
        logger.warning("%(message)s", {"message": message})

    def join_epoch(self) -> str:
        """Join the crawl's epoch, creating it if the crawl has none; clear :attr:`lost`."""
        self.client.set(self.keys.epoch, secrets.token_hex(8), nx=True)
        raw = self.client.get(self.keys.epoch)
        self.epoch = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        self.lost = None
        return self.epoch

    def _gone(self, error: BaseException) -> bool:
        """If ``error`` is a script's refusal of another epoch, drop this worker's writes
        (they belong to a crawl that is gone), record why and tell the listeners.

        Returns:
            Whether it was such a refusal.
        """
        found = fenced(error)
        if found is None:
            return False
        if self.lost is not None:
            return True
        if found == "none":
            try:
                finished = self.client.hexists(self.keys.progress, "finished_at")
            except redis.RedisError:
                finished = False
            state = FINISHED if finished else VANISHED
        else:
            state = REPLACED
        dropped = len(self._items) + len(self._outcomes) + len(self._ready)
        self._items, self._replies, self._pending_replies = [], [], []
        self._outcomes, self._ready = [], []
        self._reply_lost = False
        self.lost = state
        args = {"crawl": self.keys.crawl, "key": self.keys.epoch, "epoch": self.epoch,
                "found": found, "n": dropped}  # fmt: skip
        if state == FINISHED:
            logger.log(
                logging.WARNING if dropped else logging.INFO,
                "Crawl %(crawl)s finished without this worker (its epoch %(epoch)s is gone "
                "with its keys, e.g. while this worker was paused): dropped %(n)d pending "
                "write(s) for it",
                args,
            )
        elif state == VANISHED:
            logger.error(
                "The frontier of crawl %(crawl)s vanished: its epoch key %(key)s is gone "
                "although the crawl never finished (FLUSHDB, eviction, or a failover that "
                "lost writes); its queue, leases and dupefilter are gone with it. Dropped "
                "%(n)d pending write(s); this worker stops rather than re-create the crawl "
                "silently",
                args,
            )
        else:
            logger.error(
                "Crawl %(crawl)s is not the crawl this worker joined: its epoch changed "
                "from %(epoch)s to %(found)s (the crawl finished or was flushed, and "
                "another started). Dropped %(n)d pending write(s) for the old one",
                args,
            )
        self.stats.inc_value(f"scheduler/crawl_lost/{state}")
        for listener in self.on_lost:
            listener(state)
        return True

    # -- writes (ordered outbox) ----------------------------------------------------

    @property
    def pending_writes(self) -> int:
        """Requests to enqueue and leases to settle not yet sent to Redis."""
        return len(self._items) + len(self._outcomes) + len(self._ready)

    @property
    def pending_settlements(self) -> int:
        """Leases settled by this worker but not yet sent to Redis (still held)."""
        return len(self._outcomes) + len(self._ready)

    def enqueue(
        self,
        item: tuple[bytes, float, bytes],
        dupefilter: FilterBackend | None,
        on_reply: Callable[[bool], None],
    ) -> None:
        """Add one ``(payload, score, fingerprint)`` item to the outbox.

        It is deduplicated and enqueued atomically when the outbox is flushed (with the
        next reserve, on the flush timer, when many are pending, or at once when
        ``eager``); ``on_reply`` then learns whether it was queued or filtered.
        """
        if self.lost is not None:
            self.stats.inc_value("scheduler/crawl_lost/dropped_writes")
            return
        self._dupefilter = dupefilter
        self._items.append(item)
        self._replies.append(on_reply)
        if self.eager or len(self._items) >= FLUSH_MAX:
            self.flush()

    def settle(self, outcomes: Sequence[tuple[str, str]]) -> None:
        """Add lease settlements to the outbox: ``(lease id, outcome)`` with outcome
        :data:`DONE`, :data:`HAND_BACK`, :data:`DEAD_NOW` + a dead-letter record, or a
        failure reason.

        A settlement is sent only once Redis has confirmed the enqueue of every request
        added before it (a pipeline runs its calls whatever the previous one answered,
        so an acknowledgement sent with a refused enqueue would outlive the children it
        vouches for): with the same flush when nothing is pending before it, else with
        the next one."""
        if self.lost is not None:
            if outcomes:
                self.stats.inc_value("scheduler/crawl_lost/dropped_writes", len(outcomes))
            return
        if self._items:
            self._outcomes.extend(outcomes)
        else:
            self._ready.extend(outcomes)
        if self.eager and outcomes:
            self.flush()

    def flush(self, *, reserve: int = 0, seeds: bool = False) -> list[Lease] | None:
        """Send pending enqueues, then settlements whose requests are confirmed, then
        (if ``reserve``) lease up to that many requests or seeds: one round trip.

        Returns:
            The new leases (empty if none were asked for or there are none), or
            ``None`` if Redis is unreachable or refuses (the writes stay pending), or
            the crawl is :attr:`lost`.
        """
        if self.lost is not None:
            return None
        if self._finished_seen and (self._items or self._ready or self._outcomes or reserve):
            # this worker saw its crawl finish (and its keys go); new work starts a new one
            self._finished_seen = False
            self.join_epoch()
        if not self._items and self._outcomes:
            self._ready.extend(self._outcomes)  # nothing unconfirmed before them any more
            self._outcomes = []
        if self._reply_lost and self._can_try():
            self._release_unknown()
            if self.lost is not None:
                return None
        calls = self._calls(reserve, seeds=seeds)
        if not calls:
            return []
        if not self._can_try():
            return None
        items, replies, ready = self._items, self._replies, self._ready
        self._items, self._replies, self._ready = [], [], []
        try:
            answers = self._send(calls)
        except redis.RedisError as e:  # whatever it is, the work stays in the outbox
            self._items, self._replies = items + self._items, replies + self._replies
            self._ready = ready + self._ready
            self._reply_lost = self._reply_lost or (reserve > 0 and isinstance(e, UNREACHABLE))
            self._failed(e)
            return None
        self.stats.inc_value("scheduler/redis/round_trips")
        self._pending_replies = replies
        leases = self._answered(calls, answers, items, replies, ready)
        if self.lost is not None:
            return None
        if not self._items:
            # every request added before these settlements is now confirmed
            self._ready.extend(self._outcomes)
            self._outcomes = []
        return leases

    def _calls(self, reserve: int, *, seeds: bool) -> list[_Call]:
        """The calls of one flush: enqueue, settle, reserve (each if needed)."""
        calls: list[_Call] = []
        if self._items:
            keys, args = self.queue.enqueue_call(
                self._items, self._dupefilter, fence=(self.keys.epoch, self.epoch)
            )
            calls.append(_Call(self._scripts.enqueue, keys, args, self._on_enqueued))
        if self._ready:
            calls.append(self._settle_call(self._ready))
        if reserve > 0:
            calls.append(self._reserve_call(reserve, seeds=seeds))
        return calls

    def _answered(
        self,
        calls: list[_Call],
        answers: list[Any],
        items: list[tuple[bytes, float, bytes]],
        replies: list[Callable[[bool], None]],
        ready: list[tuple[str, str]],
    ) -> list[Lease] | None:
        """Hand each reply to its call; note a refusal as an outage (its work goes back
        to the outbox).

        Returns:
            The leases a reserve brought, or ``None`` if the reserve was refused.
        """
        leases: list[Lease] | None = []
        problem: Exception | None = None
        for call, answer in zip(calls, answers, strict=True):
            if isinstance(answer, Exception):
                if self._gone(answer):
                    return None
                if self._failed_call(call, answer, items, replies, ready):
                    problem = answer
                if call.script is self._scripts.reserve:
                    leases = None
            elif call.on_reply is not None:
                result = call.on_reply(answer)
                if result is not None:
                    leases = result
        if problem is not None:
            self._failed(problem)
        else:
            self._recovered()
        return leases

    def _failed_call(
        self,
        call: _Call,
        error: Exception,
        items: list[tuple[bytes, float, bytes]],
        replies: list[Callable[[bool], None]],
        ready: list[tuple[str, str]],
    ) -> bool:
        """Handle one call's error answer: an enqueue's refusal (:meth:`_refused`), a
        settlement refused for now (back to the outbox), or an error retrying cannot fix.

        Returns:
            Whether this is an outage (the caller backs off).
        """
        code = refusal(error)
        if call.script is self._scripts.enqueue:
            return self._refused(error, code, items, replies)
        if code and call.script is self._scripts.settle:
            self._ready = ready + self._ready
        if code:
            return True
        self._rejected(error)
        return False

    def _refused(
        self,
        error: Exception,
        code: str | None,
        items: list[tuple[bytes, float, bytes]],
        replies: list[Callable[[bool], None]],
    ) -> bool:
        """An enqueue answered with an error, so nothing of it was written.

        A refusal for now (:data:`REFUSALS`; a key of the wrong type for less than
        ``wrongtype_timeout``) keeps the batch in the outbox, and the settlements
        queued behind it wait with it. A Bloom filter's stale view is retried with the
        next flush (which refreshes it). A permanent refusal (a full filter with
        ``BLOOM_ON_FULL = "refuse"``, a filter mismatch, a key of the wrong type for
        too long, an unknown error) dead-letters the batch with the reason, and the
        settlements queued behind it report their requests as failed.

        Returns:
            Whether this is an outage (the caller backs off).
        """
        translated = (
            filter_error(error) if isinstance(error, redis.exceptions.ResponseError) else None
        )
        if isinstance(translated, StaleFilterView):
            self._items, self._replies = items + self._items, replies + self._replies
            self.stats.inc_value("scheduler/redis/stale_filter_retries")
            return False
        now = time.monotonic()
        if code == "WRONGTYPE":
            if self._wrongtype_since is None:
                self._wrongtype_since = now
        else:
            self._wrongtype_since = None
        transient = code is not None and (
            code != "WRONGTYPE"
            or self._wrongtype_since is None
            or now - self._wrongtype_since < self.wrongtype_timeout
        )
        if transient or not self._bury(items, str(translated or error)):
            self._items, self._replies = items + self._items, replies + self._replies
            return True
        self._wrongtype_since = None
        return False

    def _bury(self, items: list[tuple[bytes, float, bytes]], reason: str) -> bool:
        """Dead-letter refused requests; the settlements waiting for them become failures.

        Returns:
            Whether the dead-letter records were written.
        """
        why = f"Redis refused to enqueue it: {reason}"
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for payload, _, _ in items:
                    self.dead.add(deadletter.REQUEST, why, payload, pipe=pipe)
                pipe.execute()
        except redis.RedisError as e:
            logger.error(
                "Could not dead-letter %(n)d refused request(s) (%(error)s): keeping them",
                {"n": len(items), "error": e},
            )
            return False
        logger.error(
            "Redis refused to enqueue %(n)d request(s) of crawl %(crawl)s for good: "
            "%(error)s; they are in %(dead)s, and the %(m)d request(s) settled after them "
            "are settled as failed",
            {
                "n": len(items),
                "crawl": self.keys.crawl,
                "error": reason,
                "dead": self.dead.key,
                "m": len(self._outcomes),
            },
        )
        self.stats.inc_value("scheduler/redis/refused_requests", len(items))
        failure = f"its requests were refused by Redis: {reason}"[:500]
        self._outcomes = [(i, failure if o == DONE else o) for i, o in self._outcomes]
        return True

    def _send(self, calls: list[_Call]) -> list[Any]:
        """Run script calls in one pipeline with ``EVALSHA`` (redis-py's pipeline script
        support would add a ``SCRIPT EXISTS`` round trip to every flush)."""
        if not self._loaded:
            with self.client.pipeline(transaction=False) as pipe:
                for script in self._scripts.all():
                    pipe.script_load(script.script)
                pipe.execute()
            self._loaded = True
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            answers: list[Any] = pipe.execute(raise_on_error=False)
        if any(isinstance(a, redis.exceptions.NoScriptError) for a in answers):
            # someone ran SCRIPT FLUSH: load again and redo the calls that did not run
            self._loaded = False
            missing = [
                i for i, a in enumerate(answers) if isinstance(a, redis.exceptions.NoScriptError)
            ]
            redone = self._send([calls[i] for i in missing])
            for i, answer in zip(missing, redone, strict=True):
                answers[i] = answer
        return answers

    def _on_enqueued(self, flags: Any) -> None:
        for on_reply, flag in zip(self._pending_replies, flags, strict=True):
            on_reply(bool(flag))
        self._pending_replies = []

    def _rejected(self, error: Exception) -> None:
        """Redis answered a write with an error: it cannot succeed by retrying."""
        logger.error(
            "Redis rejected a call for crawl %(crawl)s: %(error)s",
            {"crawl": self.keys.crawl, "error": error},
        )
        self.stats.inc_value("scheduler/redis/rejected")

    def _settle_call(self, outcomes: Sequence[tuple[str, str]]) -> _Call:
        args: list[bytes | str | int | float] = [
            self.worker_id, self._give_back, _SEED_TAKE[self.seeds.kind][1], self.max_deliveries,
            self.epoch,
        ]  # fmt: skip
        for lease_id, outcome in outcomes:
            args += (lease_id, outcome)
        return _Call(self._scripts.settle, self._lease_keys(), args, self._count_settled)

    def _count_settled(self, reply: Any) -> None:
        done, retried, dead, handed, lost = (int(x) for x in reply)
        for name, n in (("acked", done), ("retried", retried), ("dead", dead),
                        ("handed_back", handed), ("lease_lost", lost)):  # fmt: skip
            if n:
                self.stats.inc_value(f"scheduler/leases/{name}", n)
        if lost:
            logger.warning(
                "%(n)d lease(s) had expired and were taken back before this worker settled "
                "them (raise SCHEDULER_LEASE_TIMEOUT if requests take that long): those "
                "requests may be crawled twice",
                {"n": lost},
            )

    def _lease_keys(self) -> list[str]:
        k = self.keys
        return [k.leases, k.leased, k.deliveries, k.dead, self.queue.key, self.seeds.key,
                k.progress, k.epoch, self.index]  # fmt: skip

    # -- reads ----------------------------------------------------------------------

    def _reserve_call(self, count: int, *, seeds: bool) -> _Call:
        k = self.keys
        take = _SEED_TAKE[self.seeds.kind][0] if seeds else self._take
        args: list[bytes | str | int | float] = [
            "s" if seeds else "q", take, self._give_back, _SEED_TAKE[self.seeds.kind][1],
            count, self.lease_timeout, self.worker_id, self.max_deliveries, RECLAIM_LIMIT,
            self.epoch,
        ]  # fmt: skip
        keys = [k.leases, k.leased, k.deliveries, k.dead, self.queue.key, self.seeds.key, k.seq,
                k.progress, k.epoch, self.index]  # fmt: skip

        def leases(reply: Any) -> list[Lease]:
            out = []
            for i in range(0, len(reply), 3):
                entry: bytes = reply[i + 2]
                data = entry if seeds else entry[ENTRY_ID_LEN:]
                out.append(Lease(reply[i].decode(), int(reply[i + 1]), data))
            return out

        return _Call(self._scripts.reserve, keys, args, leases)

    def reserve(self, count: int, *, seeds: bool = False) -> list[Lease]:
        """Send pending writes and lease up to ``count`` requests (or seeds), reclaiming
        expired leases first; one round trip.

        Returns:
            The leases, in queue order; empty when there is nothing or Redis is
            unreachable.
        """
        leases = self.flush(reserve=count, seeds=seeds)
        if leases == [] and not seeds:
            self.found_empty_at = time.monotonic()
        return leases or []

    def renew(self, lease_ids: Sequence[str]) -> list[str] | None:
        """Extend the deadlines of these leases in one call.

        Returns:
            The ids of the leases this worker no longer holds (they expired and were
            taken back), or ``None`` if Redis is unreachable or refuses.
        """
        if not lease_ids:
            return []
        keys = [self.keys.leases, self.keys.leased, self.keys.epoch, self.index]
        args: list[str | float] = [self.worker_id, self.lease_timeout, self.epoch, *lease_ids]
        reply = self.call(lambda: self._scripts.renew(keys=keys, args=args))
        if reply is None:
            return None
        lost = [i.decode() if isinstance(i, bytes) else str(i) for i in reply]
        if lost:
            self.stats.inc_value("scheduler/leases/lost_on_renew", len(lost))
        return lost

    def progress(self, *, grace: float, clear: bool, keep_for: float = 86400) -> Progress | None:
        """Where the crawl as a whole stands; marks it finished after ``grace`` seconds of
        emptiness and then, with ``clear``, deletes the frontier (exactly once).

        Returns:
            The progress, or ``None`` if Redis is unreachable.
        """
        k = self.keys
        keys = [self.queue.key, self.seeds.key, k.leases, k.progress, k.epoch, *self.clear_keys]
        args: list[str | int | float] = [
            self.queue.kind,
            self.seeds.kind,
            grace,
            int(clear),
            int(keep_for),
            self.epoch,
        ]
        reply = self.call(lambda: self._scripts.progress(keys=keys, args=args))
        if reply is None:
            return None
        state, queued, seeds, leased, _ = reply
        if state == b"finished":
            self._finished_seen = True
        return Progress(state.decode(), int(queued), int(seeds), int(leased))

    def totals(self) -> dict[str, int]:
        """The crawl-wide counters (``done``, ``retried``, ``dead``)."""
        reply = self.call(lambda: self.client.hgetall(self.keys.progress))
        raw = cast("dict[bytes, bytes] | None", reply)
        return {
            name.decode(): int(float(value))
            for name, value in (raw or {}).items()
            if name in (b"done", b"retried", b"dead")
        }
