"""The ordered write buffer of one worker: enqueues and lease settlements on their way
to Redis, with the backoff that outlasts an outage.

Writes are sent at once, in order, in one pipeline; if Redis cannot be reached they stay
in memory and are retried with a bounded exponential backoff, so a Redis outage neither
crashes nor closes the crawl. A server that refuses writes for now (OOM, NOREPLICAS,
READONLY, LOADING, BUSY, MASTERDOWN, TRYAGAIN, a key of the wrong type) is an outage
like an unreachable one. A settlement is sent only once Redis has confirmed the enqueue
of every request added before it, so a parent's acknowledgement never overtakes the
requests it produced. A permanent refusal of an enqueue dead-letters its requests, and
the requests whose callbacks produced them (their parents) are settled as failed; other
settlements waiting behind them are sent as they are. Each request carries the lease id
of its parent (``""`` for none), and Redis refuses a request whose parent lease this
worker no longer holds (``lua/enqueue.lua``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from scrapy_dist import deadletter
from scrapy_dist.connection import describe
from scrapy_dist.exceptions import StaleFilterView, redis_error_text
from scrapy_dist.filters import filter_error
from scrapy_dist.frontier.wire import DONE

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.deadletter import DeadLetters
    from scrapy_dist.queue import FilterBackend, RedisQueue
    from scrapy_dist.scripts import Fence, ScriptCall, Scripts

logger = logging.getLogger(__name__)

#: First and longest pause between attempts to reach Redis after a failure (seconds).
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
#: Requests waiting in the outbox that trigger a flush without waiting for the timer.
FLUSH_MAX = 1000

#: Errors that mean "Redis is not reachable right now": keep the work, retry later.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
#: Error codes with which a reachable Redis refuses a call for now (out of memory, too
#: few replicas, a replica or a loading server, a busy script, a cluster in transition,
#: a key of the wrong type): keep the work, retry later.
REFUSALS = frozenset(
    {
        "OOM",
        "NOREPLICAS",
        "READONLY",
        "LOADING",
        "BUSY",
        "MASTERDOWN",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "WRONGTYPE",
    }
)

#: redis-py's classes for refusals of a cluster in transition, by code (a subclass
#: first: MASTERDOWN's class is CLUSTERDOWN's).
_CLUSTER_REFUSALS = (
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
)

#: An enqueue to send: ``(payload, score, fingerprint)``.
Item = tuple[bytes, float | str, bytes]


def refusal(error: BaseException) -> str | None:
    """The code of a refusal Redis may lift by itself (:data:`REFUSALS`), else ``None``."""
    if isinstance(error, redis.exceptions.ReadOnlyError):
        return "READONLY"
    if isinstance(error, redis.exceptions.BusyLoadingError):
        return "LOADING"
    # a cluster connection's parser turns these codes into classes and strips the code
    # from the message ("Multiple keys request during rehashing of slot")
    for cls, code in _CLUSTER_REFUSALS:
        if isinstance(error, cls):
            return code
    if type(error).__name__ == "OutOfMemoryError":  # redis-py >= 5.0.1
        return "OOM"
    if isinstance(error, redis.exceptions.ResponseError):
        # a pipeline's error reads "Command # 1 (...) of pipeline caused error: BUSY ...",
        # and Redis 6.2 wraps one raised inside a script (redis_error_text)
        message = redis_error_text(error)
        code = message.split(" ", 1)[0]
        if code in REFUSALS:
            return code
        if "used memory > 'maxmemory'" in message:
            return "OOM"
        # a command of a script on a key not served here: the crawl's slot is being moved
        # to another cluster node (scripts that reach keys by computed names check first,
        # lua/_fence.lua slot_moving; this is for any that does not)
        if "attempted to access a non local key" in message:
            return "TRYAGAIN"
    return None


class Command(NamedTuple):
    """A plain command sent in a flush's pipeline among the script calls (``WAIT``,
    :mod:`scrapy_dist.frontier.replication`)."""

    args: tuple[str | int, ...]


class Batch(NamedTuple):
    """The writes one flush sends: enqueues (with who wants their replies) and the
    settlements whose requests are confirmed."""

    items: list[Item]
    replies: list[Callable[[bool], None]]
    ready: list[tuple[str, str]]
    #: The parent lease id of each item (``""``: none).
    parents: list[str]


class Outbox:
    """Writes not yet confirmed by Redis, in order, and whether Redis can be tried.

    Args:
        client: the crawl's Redis client.
        scripts: the scripts bound to it.
        queue: the request queue enqueues go to.
        dead: the crawl's dead letters, for requests Redis refuses for good.
        crawl: the crawl's name (for log messages).
        stats: returns the crawler's stats collector.
        wrongtype_timeout: seconds a queue key of the wrong type is waited for before
            the requests to enqueue into it are dead-lettered.
    """

    def __init__(
        self,
        client: redis.Redis,
        scripts: Scripts,
        queue: RedisQueue,
        dead: DeadLetters,
        *,
        crawl: str,
        stats: Callable[[], StatsCollector],
        wrongtype_timeout: float = 300.0,
    ) -> None:
        self.client = client
        self._scripts = scripts
        self.queue = queue
        self.dead = dead
        self.crawl = crawl
        self._stats = stats
        self.wrongtype_timeout = wrongtype_timeout
        self._items: list[Item] = []
        self._replies: list[Callable[[bool], None]] = []
        #: The parent lease id of each item (``""``: none).
        self._parents: list[str] = []
        #: Parents whose requests Redis refused for good -> the reason: their
        #: settlements, queued now or later, become failures.
        self._failed_parents: dict[str, str] = {}
        #: Who wants the replies of the enqueue under way, and their parents.
        self._pending_replies: list[Callable[[bool], None]] = []
        self._pending_parents: list[str] = []
        self._dupefilter: FilterBackend | None = None
        #: Settlements queued after requests not yet confirmed enqueued.
        self._outcomes: list[tuple[str, str]] = []
        #: Settlements whose earlier requests Redis has confirmed: sent with the next flush.
        self._ready: list[tuple[str, str]] = []
        #: The scripts are loaded on the server (a restarted one has lost them).
        self._loaded = False
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_MIN
        #: The error code of the refusal under way ("" when Redis was unreachable).
        self._refusing = ""
        self._wrongtype_since: float | None = None
        #: The batch of the flush under way (taken, not yet answered): its enqueues are
        #: not confirmed and its settlements not sent, so the settlements added
        #: meanwhile wait behind its enqueues (:mod:`scrapy_dist.frontier.background`).
        self.flying: Batch | None = None

    # -- what waits ---------------------------------------------------------------------

    @property
    def pending_writes(self) -> int:
        """Requests to enqueue and leases to settle that Redis has not answered yet
        (waiting here, or in the flush under way)."""
        flying = self.flying
        in_flight = 0 if flying is None else len(flying.items) + len(flying.ready)
        return len(self._items) + len(self._outcomes) + len(self._ready) + in_flight

    @property
    def pending_items(self) -> int:
        """Requests to enqueue that Redis has not confirmed yet (the last ones added:
        the outbox sends and confirms them in order), the flush under way's included."""
        return len(self._items) + (0 if self.flying is None else len(self.flying.items))

    @property
    def pending_settlements(self) -> int:
        """Leases settled by this worker but not yet answered by Redis (still held),
        the flush under way's included."""
        flying = self.flying
        return len(self._outcomes) + len(self._ready) + (0 if flying is None else len(flying.ready))

    def _unconfirmed(self) -> bool:
        """Whether enqueues wait for Redis's confirmation (here or in flight)."""
        return bool(self._items) or (self.flying is not None and bool(self.flying.items))

    def add(
        self,
        item: Item,
        dupefilter: FilterBackend | None,
        on_reply: Callable[[bool], None],
        parent: str = "",
    ) -> bool:
        """Queue one enqueue; ``on_reply`` learns whether it was queued or filtered
        (it is not called for a request Redis refuses because this worker no longer
        holds ``parent``, the lease of the request whose callback produced it).

        Returns:
            Whether so many enqueues wait that they should be flushed now.
        """
        self._dupefilter = dupefilter
        self._items.append(item)
        self._replies.append(on_reply)
        self._parents.append(parent)
        return len(self._items) >= FLUSH_MAX

    def add_settlements(self, outcomes: Sequence[tuple[str, str]]) -> None:
        """Queue settlements behind the enqueues queued before them; a parent whose
        requests Redis refused for good is settled as failed."""
        if self._failed_parents:
            failed = self._failed_parents
            outcomes = [(i, failed.pop(i) if o == DONE and i in failed else o) for i, o in outcomes]
        if self._unconfirmed():
            self._outcomes.extend(outcomes)
        else:
            self._ready.extend(outcomes)

    def promote(self) -> None:
        """With no enqueue unconfirmed, the settlements behind them are ready to send."""
        if self._outcomes and not self._unconfirmed():
            self._ready.extend(self._outcomes)
            self._outcomes = []

    def drop(self) -> int:
        """Forget every write (its crawl is gone).

        Returns:
            How many were dropped.
        """
        dropped = self.pending_writes
        self._items, self._replies, self._pending_replies = [], [], []
        self._outcomes, self._ready, self._parents = [], [], []
        self._pending_parents, self._failed_parents = [], {}
        self.flying = None
        return dropped

    def drop_settlements(self, lease_ids: set[str]) -> list[str]:
        """Forget the settlements of these leases (this worker no longer holds them).

        Returns:
            The ids of the settlements dropped, one per settlement.
        """
        dropped = [o[0] for o in (*self._outcomes, *self._ready) if o[0] in lease_ids]
        self._outcomes = [o for o in self._outcomes if o[0] not in lease_ids]
        self._ready = [o for o in self._ready if o[0] not in lease_ids]
        for lease_id in lease_ids:
            self._failed_parents.pop(lease_id, None)
        return dropped

    # -- one flush ----------------------------------------------------------------------

    def enqueue_call(self, fence: Fence) -> ScriptCall | None:
        """The enqueue of every waiting request (``None`` if none), fenced by the
        crawl's epoch and each request's parent lease (``fence`` without its parents,
        which the outbox knows); its reply goes to :meth:`enqueued`."""
        if not self._items:
            return None
        fence = fence._replace(parents=list(self._parents))
        return self.queue.enqueue_call(self._items, self._dupefilter, fence=fence)

    @property
    def ready(self) -> list[tuple[str, str]]:
        """The settlements the next flush sends."""
        return self._ready

    def take(self) -> Batch:
        """Take the writes of the flush under way out of the buffer: they are
        :attr:`flying` until :meth:`landed` (then see :meth:`restore`)."""
        batch = Batch(self._items, self._replies, self._ready, self._parents)
        self._items, self._replies, self._ready, self._parents = [], [], [], []
        self._pending_replies = batch.replies
        self._pending_parents = batch.parents
        self.flying = batch
        return batch

    def landed(self) -> None:
        """The flush under way was answered, or failed: its batch is no longer in
        flight (its reply, or :meth:`restore`, says where its writes are now)."""
        self.flying = None

    def _put_back(self, batch: Batch) -> None:
        """Put a batch's enqueues back in front of what came since."""
        self._items = batch.items + self._items
        self._replies = batch.replies + self._replies
        self._parents = batch.parents + self._parents

    def restore(self, batch: Batch) -> None:
        """Put a batch that was not sent back in front of what came since."""
        self._put_back(batch)
        self._ready = batch.ready + self._ready

    def enqueued(self, flags: Any) -> dict[str, int]:
        """Hand an enqueue's reply (one flag per request) to who wants it.

        Returns:
            The parents whose requests Redis refused because this worker no longer
            holds their leases, each with how many of its requests were refused.
        """
        refused: dict[str, int] = {}
        for on_reply, parent, flag in zip(
            self._pending_replies, self._pending_parents, flags, strict=True
        ):
            if int(flag) < 0:
                refused[parent] = refused.get(parent, 0) + 1
            else:
                on_reply(bool(flag))
        self._pending_replies, self._pending_parents = [], []
        return refused

    def send(self, calls: Sequence[ScriptCall | Command]) -> list[Any]:
        """Run script calls in one pipeline with ``EVALSHA`` (redis-py's pipeline script
        support would add a ``SCRIPT EXISTS`` round trip to every flush), and any plain
        command among them (:class:`Command`) as it is.

        Returns:
            One answer per call, an exception for a call that failed.

        Raises:
            redis.RedisError: the pipeline as a whole failed (e.g. unreachable).
        """
        if not self._loaded:
            with self.client.pipeline(transaction=False) as pipe:
                for script in self._scripts.all():
                    pipe.script_load(script.script)
                pipe.execute()
            self._loaded = True
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                if isinstance(call, Command):  # replication.py's WAIT
                    pipe.execute_command(*call.args)  # type: ignore[no-untyped-call]
                    continue
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            answers: list[Any] = pipe.execute(raise_on_error=False)
        if any(isinstance(a, redis.exceptions.NoScriptError) for a in answers):
            # someone ran SCRIPT FLUSH: load again and redo the calls that did not run
            self._loaded = False
            missing = [
                i for i, a in enumerate(answers) if isinstance(a, redis.exceptions.NoScriptError)
            ]
            # a WAIT after a redone call must follow it again (replication.py)
            missing = sorted(
                {*missing, *(i for i, c in enumerate(calls) if isinstance(c, Command))}
                - set(range(missing[0]))
            )
            redone = self.send([calls[i] for i in missing])
            for i, answer in zip(missing, redone, strict=True):
                answers[i] = answer
        return answers

    def failed_call(self, kind: str, error: Exception, batch: Batch) -> bool:
        """Handle one call's error answer: an enqueue's refusal (:meth:`_refused`), a
        settlement refused for now (back to the outbox), or an error retrying cannot fix.

        Args:
            kind: the script called (``"enqueue"``, ``"settle"``, ``"reserve"``).

        Returns:
            Whether this is an outage (the caller backs off).
        """
        code = refusal(error)
        if kind == "enqueue":
            return self._refused(error, code, batch)
        if code and kind == "settle":
            self._ready = batch.ready + self._ready
        if code:
            return True
        self.rejected(error)
        return False

    def _refused(self, error: Exception, code: str | None, batch: Batch) -> bool:
        """An enqueue answered with an error, so nothing of it was written.

        A refusal for now (:data:`REFUSALS`; a key of the wrong type for less than
        ``wrongtype_timeout``) keeps the batch in the outbox, and the settlements
        queued behind it wait with it. A Bloom filter's stale view is retried with the
        next flush (which refreshes it). A permanent refusal (a full filter with
        ``BLOOM_ON_FULL = "refuse"``, a filter mismatch, a key of the wrong type for
        too long, an unknown error) dead-letters the batch with the reason, and the
        parents of its requests are settled as failed (the other settlements queued
        behind it are sent as they are).

        Returns:
            Whether this is an outage (the caller backs off).
        """
        translated = (
            filter_error(error) if isinstance(error, redis.exceptions.ResponseError) else None
        )
        if isinstance(translated, StaleFilterView):
            self._put_back(batch)
            self._stats().inc_value("scheduler/redis/stale_filter_retries")
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
        if transient or not self._bury(batch, str(translated or error)):
            self._put_back(batch)
            return True
        self._wrongtype_since = None
        return False

    def _bury(self, batch: Batch, reason: str) -> bool:
        """Dead-letter refused requests; the settlements of their parents become
        failures (now, or when they are added).

        Returns:
            Whether the dead-letter records were written.
        """
        items = batch.items
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
        parents = {p for p in batch.parents if p}
        logger.error(
            "Redis refused to enqueue %(n)d request(s) of crawl %(crawl)s for good: "
            "%(error)s; they are in %(dead)s, and the %(m)d request(s) whose callbacks "
            "produced them are settled as failed",
            {
                "n": len(items),
                "crawl": self.crawl,
                "error": reason,
                "dead": self.dead.key,
                "m": len(parents),
            },
        )
        self._stats().inc_value("scheduler/redis/refused_requests", len(items))
        failure = f"its requests were refused by Redis: {reason}"[:500]
        waiting = {i for i, _ in self._outcomes}
        self._outcomes = [
            (i, failure if o == DONE and i in parents else o) for i, o in self._outcomes
        ]
        for parent in parents - waiting:  # still in the engine: failed when settled
            self._failed_parents[parent] = failure
        return True

    def rejected(self, error: Exception) -> None:
        """Redis answered a write with an error: it cannot succeed by retrying."""
        logger.error(
            "Redis rejected a call for crawl %(crawl)s: %(error)s",
            {"crawl": self.crawl, "error": error},
        )
        self._stats().inc_value("scheduler/redis/rejected")

    # -- connectivity -------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """``False`` while Redis is known to be unreachable (since the last failure)."""
        return self._down_since is None

    def can_try(self) -> bool:
        """Whether Redis may be tried now (not within a backoff pause)."""
        return self._down_since is None or time.monotonic() >= self._retry_at

    def failed(self, error: Exception) -> None:
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
            self._stats().inc_value(f"scheduler/redis/refused/{code}")
        else:
            self._stats().inc_value("scheduler/redis/unreachable")

    def recovered(self) -> None:
        """Note a call that went through: an outage under way is over (logged)."""
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
