"""Cluster-wide politeness: one rate and concurrency limit per download slot, shared by
every worker of a crawl through Redis (``SCHEDULER_POLITENESS``).

Scrapy applies ``DOWNLOAD_DELAY`` and ``CONCURRENT_REQUESTS_PER_DOMAIN`` per process, so
N workers hit a host N times as hard. With politeness on, a worker sends a request only
with a *token* of the request's download slot (``request.meta["download_slot"]``, else
its host name, or with ``CONCURRENT_REQUESTS_PER_IP`` its host's address once this worker
resolved it, as Scrapy's downloader decides: :func:`slot_naming`) granted by
``lua/politeness.lua``: a slot never has more tokens outstanding than its concurrency.
A slot with a delay is given its tokens one at a time, as *turns*, as Scrapy's
downloader sends one request per slot per delay whatever its concurrency: a turn's send
time is at least the delay after the previous send to the slot, as its sender confirmed
it (whoever it was), and the next turn is granted only once the holder of the last one
confirms that it sent (when the request reaches Scrapy's downloader,
``request_reached_downloader``) or gives it back.
Limits come from Scrapy's own settings: ``DOWNLOAD_SLOTS`` (``"delay"``,
``"concurrency"``, ``"jitter"`` per slot), else ``DOWNLOAD_DELAY`` and
``CONCURRENT_REQUESTS_PER_DOMAIN`` (``CONCURRENT_REQUESTS_PER_IP`` when above 0; the
spider's attributes as Scrapy's downloader reads them: :meth:`Limits.build`); a robots.txt
``Crawl-delay`` that Scrapy's ``RobotsTxtMiddleware`` read raises a slot's delay.

How it is gated: the scheduler hands out the first buffered request whose slot holds a
token due now (:meth:`Politeness.take`); requests of slots without one stay buffered
(leased, renewed with the others) while other slots' requests go through, and when
the buffer holds only waiting slots the worker leases more (within ``max_held``). Tokens
are asked for in batches: one call per flush tick (``SCHEDULER_FLUSH_INTERVAL``) for
every slot with waiting requests, carrying the confirmations of turns sent, the releases
of finished downloads and, every heartbeat, the renewal of the tokens held; at once when
the engine asks for a request, nothing is granted and a slot was never asked for; and
within a quarter of a slot's delay of a turn's send. The engine is woken when a
token falls due. A token is released when its download leaves the downloader
(``request_left_downloader``) or, failing that, when its request leaves the engine; a
slot without delay keeps its token for this worker's next request of the slot while it
has one (up to :data:`REUSE_MAX`); a worker refused a slot without delay (of a
concurrency above 1) while it holds less than half its concurrency is kept that share
of the tokens the others give back, for :data:`REFUSED_MARK` (they would otherwise get
them back in the very call that gives them back, the release running before the
grant). A killed worker's tokens expire ``SCHEDULER_POLITENESS_TIMEOUT`` seconds after
their last renewal (a turn not sent yet: the recovery time, a few heartbeats).

Faults: while Redis is unreachable or refuses, no token is granted: requests of gated
slots wait (buffered and leased), the releases wait to be sent, and the worker backs
off; one log line when it starts and one when it ends. Politeness never falls back to
no limit. The script repairs its keys when it finds them lost or holding garbage (see
``lua/politeness.lua``) and says what it did: one ERROR per key (:meth:`Politeness._tell`).
A slot name from request meta is untrusted: it is only ever part of a zset member, never
a key name, and one longer than :data:`SLOT_MAX` characters is replaced by its SHA-1.

Over 600 lines on purpose: :class:`Politeness` is one state machine per worker (the
tokens it asked for, holds, confirmed sending and gives back), and every transition
reads and writes that one state; the slot limits and the wire format of a token are
small classes beside it.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
from scrapy import signals

from scrapy_dist.scripts import scripts_for
from scrapy_dist.slots import Limit, Limits, slot_of
from scrapy_dist.worker import engine as _engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.base import DelayedCall
    from twisted.internet.task import LoopingCall

    from scrapy_dist.config.scheduling import PolitenessConfig
    from scrapy_dist.exceptions import SerializationError
    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.frontier.leases import Lease
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.worker.deliveries import Deliveries

logger = logging.getLogger(__name__)

#: Idle expiry of the politeness keys (renewed by every call): a crawl that stopped
#: leaves nothing behind for long.
KEYS_IDLE = 3600.0
#: Longest pause between calls while Redis is unreachable or refuses.
BACKOFF_MAX = 5.0
#: Seconds a turn may wait past its send time for the engine to take its request; then
#: it is given back (the slot's other workers wait for it until then).
TURN_GRACE = 1.0
#: Seconds between two ERROR lines of repairs of the same key by this worker (the others
#: are counted in ``scheduler/politeness/repaired``).
REPAIR_REMINDER = 60.0
#: Seconds a token of a slot without delay is kept for this worker's next request of
#: the slot; past it, it is released when its download ends, so the workers share the
#: slot's concurrency rather than the first to ask keeping it.
REUSE_MAX = 1.0
#: Seconds a slot counts as blocked after Redis refused it a token.
BLOCKED_FOR = 1.0
#: Seconds Redis keeps tokens of a slot without delay for a worker it refused while that
#: worker held less than half the slot's concurrency (``lua/politeness.lua``): the other
#: workers' tokens given back meanwhile go to it, not straight back to them. Longer than
#: a refused worker takes to ask again; short, so a worker gone costs little.
REFUSED_MARK = 1.0
#: Longest delay of the release of a token of a slot without delay.
LAZY_RELEASE = 0.5
#: Slots remembered as asked for before the memory starts over.
KNOWN_MAX = 10_000
#: Buffered requests a worker keeps of a slot that waits for its turn when it leases
#: more: the rest go back to the queue (another slot's requests take their room).
KEEP_WAITING = 2
#: Share of the token timeout a token is used for locally after its last renewal (the
#: rest is margin for clocks and round trips).
VALID_SHARE = 0.8
#: Longest wait between two refills of a worker whose buffered requests all wait, while
#: each refill brings only requests of those slots (a crawl of few hosts: the requests
#: handed back come straight back). It doubles from half a flush interval per such
#: refill, and starts over when one brings another slot's request.
REFILL_WAIT_MAX = 1.0
#: Seconds after a slot's last buffered request left this worker's buffer during which
#: its refills do not wait longer: more of that slot may be in the queue, its next token
#: soon (a delayed host's requests behind another host's handed back, in a crawl of few
#: hosts, lost its turns while every worker waited up to REFILL_WAIT_MAX).
DRAINED_FOR = 2.0


@dataclass
class Token:
    """The right to send one request to ``slot`` from ``send_at`` (monotonic seconds)
    until ``valid_until`` (past it, Redis may have given it to another worker, or other
    workers wait for it)."""

    member: str
    slot: str
    send_at: float
    valid_until: float
    #: When it was granted (monotonic seconds).
    granted_at: float = 0.0
    #: A turn of a slot with delay: its send is confirmed to Redis.
    turn: bool = False
    #: When its request reached Scrapy's downloader (monotonic seconds), if it did.
    sent_at: float | None = None
    #: When the reactor had written it (its next round; monotonic seconds): the send.
    stamped_at: float | None = None
    #: Redis took the confirmation of its send (until then it holds its slot's turn).
    confirmed: bool = False
    #: The spacing after its send (ms), drawn when it was sent.
    spacing_ms: float = 0.0


class Renewals(NamedTuple):
    """The tokens a worker renews, by what the script does with them."""

    #: Turns in the engine, not confirmed sent: kept for the recovery time.
    turns: list[Token]
    #: Granted and not used (slots without delay): kept for the timeout, or lost.
    waiting: list[Token]
    #: Sent: kept for the timeout, added again if Redis lost them.
    holding: list[Token]


def slot_naming(config: PolitenessConfig) -> Callable[[Request], str]:
    """How the gate names a request's slot (and the slot pauses with it): :func:`slot_of`,
    by the host's address once this worker resolved it when ``CONCURRENT_REQUESTS_PER_IP``
    is above 0 (Scrapy's DNS cache, as its downloader names slots then). A buffered
    request's slot may so change from its host name to an address between two calls; a
    token keeps the slot it was granted for (:attr:`Token.slot`), and goes back under it."""
    if config.per_ip <= 0:
        return slot_of
    return partial(slot_of, address_of=_engine.resolved_address)


class Politeness:
    """One worker's side of cluster-wide politeness (see the module docstring).

    Args:
        client: the crawl's Redis client.
        keys: the crawl's keys.
        deliveries: the leases this worker holds (its buffer is what is gated).
        limits: each slot's limits.
        stats: the crawler's stats collector.
        timeout: seconds a token lasts past its send time or renewal.
        flush_interval: seconds between the timer's calls (``0``: 0.1).
        heartbeat_interval: seconds between renewals of the tokens held.
        wake: asks the engine to look at the scheduler now.
        crawl_delay: returns the robots.txt ``Crawl-delay`` of a request's site once
            Scrapy's robots middleware read it, else ``None``.
        paused: seconds left of a slot's pause.
        slot_of: a request's slot (:func:`slot_naming`); every count, pick and ask of
            the gate names slots with it.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        deliveries: Deliveries,
        limits: Limits,
        *,
        stats: StatsCollector,
        timeout: float = 60.0,
        flush_interval: float = 0.1,
        heartbeat_interval: float = 5.0,
        wake: Callable[[], None] = lambda: None,
        crawl_delay: Callable[[Request], float | None] = lambda request: None,
        paused: Callable[[str], float] = lambda slot: 0.0,
        slot_of: Callable[[Request], str] = slot_of,
    ) -> None:
        self.client, self.keys, self.deliveries = client, keys, deliveries
        self.slot_of = slot_of
        #: Seconds left of a slot's pause (:mod:`scrapy_dist.worker.pauses`): no request
        #: of a paused slot is sent, even with a token this worker holds.
        self.paused = paused
        self.limits, self.stats = limits, stats
        self.timeout = timeout
        self.flush_interval = flush_interval or 0.1
        self.heartbeat_interval = heartbeat_interval
        #: Seconds a turn not sent yet, or a token Redis found without deadline, lasts
        #: without renewal: two heartbeats and a second (at least 3 s, at most the timeout).
        self.recover = min(timeout, max(3.0, 2 * heartbeat_interval + 1.0))
        self.wake = wake
        self.crawl_delay = crawl_delay
        self._scripts = scripts_for(client)
        #: Names this worker's tokens: unique per worker, no "|", one ":" at its end (the
        #: script names a worker by its prefix up to the first ":").
        self._prefix = secrets.token_hex(6) + ":"
        self._calls = 0
        #: Granted tokens not used yet, per slot, by send time.
        self.pending: dict[str, list[Token]] = {}
        #: Tokens of slots without delay whose download finished, kept for the next one.
        self.idle: dict[str, list[Token]] = {}
        #: Requests in the engine -> the token they were sent with.
        self.out: dict[Request, Token] = {}
        #: Members to release with the next call.
        self.releases: list[str] = []
        #: Turns whose requests reached the downloader, stamped on the reactor's next round.
        self._sent: list[Token] = []
        self._stamp_call: DelayedCall | None = None
        #: Turns sent and stamped, to confirm with the next call (made by _confirm_at).
        self.confirms: list[Token] = []
        self._confirm_call: DelayedCall | None = None
        self._confirm_at = 0.0
        #: Key -> when this worker last logged a repair of it (monotonic).
        self._told: dict[str, float] = {}
        #: When the releases must be sent at the latest (monotonic).
        self._release_by = math.inf
        #: The engine asked for a request and every buffered one waited for a token
        #: since the last call: the timer asks for tokens only then.
        self.starved = False
        #: Slot -> monotonic time before which asking again is pointless.
        self.retry_at: dict[str, float] = {}
        #: Slot -> when Redis last refused it a token (kept :data:`BLOCKED_FOR` seconds):
        #: a buffer of such slots only makes this worker lease more.
        self.refused_at: dict[str, float] = {}
        #: Slots asked for lately (the first ask for a slot is made at once, later ones
        #: on the timer); forgotten past :data:`KNOWN_MAX`.
        self._known: set[str] = set()

        self._renew_at = 0.0
        self._last_call = 0.0
        self._refilled_at = 0.0
        #: Seconds from one refill of waiting slots to the next (see REFILL_WAIT_MAX).
        self._refill_wait = 0.0
        #: The slots buffered when every buffered request last waited, and when one of
        #: them was last found gone from the buffer (see DRAINED_FOR).
        self._starved_slots: set[str] = set()
        self._drained_at = -math.inf
        #: Since when Redis fails (monotonic), and until when not to call.
        self._outage_since: float | None = None
        self._backoff = 0.0
        self._backoff_until = 0.0
        self._alarm: DelayedCall | None = None
        self._alarm_at = 0.0
        self.ticker: LoopingCall | None = None
        self.spider: object = None

    @classmethod
    def for_crawler(
        cls,
        crawler: Crawler,
        frontier: CrawlFrontier,
        deliveries: Deliveries,
        paused: Callable[[str], float] = lambda slot: 0.0,
    ) -> Politeness | None:
        """The crawler's politeness when ``SCHEDULER_POLITENESS`` is on, else ``None``
        (no I/O; the timer starts at :meth:`open`); ``paused``: the slots' pauses."""
        from scrapy_dist.assembly import assemble

        config = assemble(crawler).config
        settings = config.politeness
        if not settings.enabled:
            return None

        def wake() -> None:
            engine = _engine.engine_of(crawler)
            if engine is not None:
                _engine.wake(engine)

        politeness = cls(
            frontier.client,
            frontier.keys,
            deliveries,
            Limits.build(settings),
            stats=crawler.stats,
            timeout=settings.timeout,
            flush_interval=config.scheduler.flush_interval,
            heartbeat_interval=config.workers.heartbeat_interval,
            wake=wake,
            crawl_delay=(lambda r: _engine.robots_crawl_delay(crawler, r))
            if settings.robots
            else (lambda r: None),
            paused=paused,
            slot_of=slot_naming(settings),
        )
        politeness.crawler = crawler
        politeness.config = settings
        return politeness

    crawler: Crawler | None = None
    config: PolitenessConfig | None = None

    # -- lifecycle ------------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        """Start: the spider's own limits, the release signal, the timer."""
        from twisted.internet.task import LoopingCall

        self.spider = spider
        if self.config is not None:
            self.limits = Limits.build(self.config, spider)
            if self.config.per_ip > 0:
                if self.crawler is not None:
                    _engine.check_ip_slots(self.crawler)
                logger.info(
                    "Cluster-wide politeness holds CONCURRENT_REQUESTS_PER_IP (%(n)d) "
                    "downloads at once per resolved address, for all workers together (a "
                    "host counts under its name until this worker resolved it, as in Scrapy)",
                    {"n": self.config.per_ip},
                    extra={"spider": spider},
                )
        if self.crawler is not None:
            self.crawler.signals.connect(self.finished, signal=signals.request_left_downloader)
            self.crawler.signals.connect(self.sent, signal=signals.request_reached_downloader)
            if self.config is not None and not self.config.autothrottle:
                self.crawler.signals.connect(
                    self._local_delay_off, signal=signals.request_reached_downloader
                )
            if self.config is not None and self.config.robots:
                _engine.check_robots(self.crawler)
        self.ticker = LoopingCall(self.tick)
        self.ticker.start(self.flush_interval, now=False)
        logger.info(
            "Cluster-wide politeness on: %(c)d request(s) at once and %(d)gs between "
            "requests per download slot, for all workers together (DOWNLOAD_SLOTS: "
            "%(n)d slot(s) of their own)",
            {
                "c": self.limits.default.concurrency,
                "d": self.limits.default.delay,
                "n": len(self.limits.slots),
            },
            extra={"spider": spider},
        )

    def close(self) -> None:
        """Stop the timer and release every token held (best effort: what is not
        released expires)."""
        if self.ticker is not None and self.ticker.running:
            self.ticker.stop()
        if self._alarm is not None and self._alarm.active():
            self._alarm.cancel()
        if self._stamp_call is not None and self._stamp_call.active():
            self._stamp_call.cancel()
        self.releases += [t.member for t in self._held()]
        if self._sent:
            self._stamp()  # (their confirmations go with the releases, below)
        self.pending.clear()
        self.idle.clear()
        self.out.clear()
        if self._confirm_call is not None and self._confirm_call.active():
            self._confirm_call.cancel()
        if self.releases or self.confirms:
            try:
                self._call([], renew=False)
            except redis.RedisError as e:
                logger.info(
                    "Could not release %(n)d politeness token(s) at close (%(e)s): they "
                    "expire in at most %(t)gs",
                    {"n": len(self.releases), "e": e, "t": self.timeout},
                    extra={"spider": self.spider},
                )

    # -- gating ---------------------------------------------------------------------

    def take(
        self,
        decode: Callable[[bytes], Request],
        reject: Callable[[Lease, SerializationError], str],
    ) -> Request | None:
        """The first buffered request whose slot holds a token due now, in the engine;
        ``None`` if none does. When every buffered request waits, lease more (other
        slots' requests may be behind them), handing back first what this worker holds
        of a waiting slot beyond :data:`KEEP_WAITING` requests (so that one slow slot
        never fills its bound of held leases), and ask for tokens of slots never
        asked."""
        request = self._pick()
        if request is not None or not self.deliveries.buffer:
            return request
        self.starved = True
        now = time.monotonic()
        waiting = self._waiting()
        if any(slot not in waiting for slot in self._starved_slots):
            self._drained_at = now  # a slot's last buffered request went: more may come
        self._starved_slots = set(waiting)
        if now - self._drained_at < DRAINED_FOR:
            self._refill_wait = 0.0
        full = self._full()
        blocked = all(
            slot in self.refused_at or slot in self.pending or slot in full for slot in waiting
        )
        if (
            blocked  # Redis refused each slot, or its next send time is ahead: lease more
            and now - self.deliveries.frontier.found_empty_at > 0.25
            and now - self._refilled_at >= max(self.flush_interval / 2, self._refill_wait)
        ):
            self._refilled_at = now
            self._shed(waiting)
            self._refill(waiting, decode, reject)
        if time.monotonic() - self._last_call >= self.flush_interval / 4 and any(
            slot not in self._known for slot in self._waiting()
        ):
            self.sync()  # a slot never asked for: ask now rather than at the next tick
        return self._pick()

    def _refill(
        self,
        waiting: Counter[str],
        decode: Callable[[bytes], Request],
        reject: Callable[[Lease, SerializationError], str],
    ) -> None:
        """Lease more while every buffered request waits; when what comes is only more
        of the waiting slots' requests (those just handed back, in a crawl of few
        hosts), wait longer before the next refill (:data:`REFILL_WAIT_MAX`)."""
        self.deliveries.refill_more(decode, reject)
        if any(slot not in waiting for slot in self._waiting()):
            self._refill_wait = 0.0
        else:
            self.stats.inc_value("scheduler/politeness/refills_of_waiting")
            wait = max(self.flush_interval / 2, 2 * self._refill_wait)
            self._refill_wait = min(wait, REFILL_WAIT_MAX)

    def _pick(self) -> Request | None:
        now = time.monotonic()
        waiting: set[str] = set()  # slots without a token due: not looked at twice
        for index, (_, request) in enumerate(self.deliveries.buffer):
            slot = self.slot_of(request)
            if slot in waiting:
                continue
            token = self._usable(slot, now) if self.paused(slot) <= 0 else None
            if token is None:
                waiting.add(slot)
            else:
                self.deliveries.take_at(index)
                self.out[request] = token
                self.stats.inc_value("scheduler/politeness/sent")
                return request
        return None

    def _usable(self, slot: str, now: float) -> Token | None:
        """A token of ``slot`` this worker may send with now (taken off its list)."""
        for held in (self.idle, self.pending):
            tokens = held.get(slot)
            found = None
            while tokens:
                token = tokens[0]
                if token.valid_until <= now:  # Redis may have given it away (or others wait)
                    tokens.pop(0)
                    self._release(token, urgent=token.turn)
                    continue
                if token.send_at <= now:
                    found = tokens.pop(0)
                break
            if tokens is not None and not tokens:
                del held[slot]
            if found is not None:
                return found
        return None

    def finished(self, request: Request, spider: object = None) -> None:
        """``request`` left the downloader (or the engine): free its token, or keep it
        for the next request of a slot without delay."""
        token = self.out.pop(request, None)
        if token is None:
            return
        now = time.monotonic()
        if (
            not self.limits.of(token.slot).delay
            and token.valid_until > now
            and now - token.granted_at < REUSE_MAX
        ):
            self.idle.setdefault(token.slot, []).append(token)
        else:
            self._release(token, urgent=bool(self.limits.of(token.slot).delay))

    def sent(self, request: Request, spider: object = None) -> None:
        """``request`` reached Scrapy's downloader, which starts its transfer: its turn's
        send is stamped on the reactor's next round, after its writes (a busy reactor
        may write a request long after it reached the downloader), and confirmed to
        Redis with the worker's next call, within a quarter of the slot's delay (the
        slot's next turn waits for it, and is at least the delay after the stamp)."""
        token = self.out.get(request)
        if token is None or not token.turn or token.sent_at is not None:
            return
        token.sent_at = time.monotonic()
        token.spacing_ms = self.limits.of(token.slot).spacing_ms()
        self._sent.append(token)
        if self._stamp_call is None or not self._stamp_call.active():
            from twisted.internet import reactor

            self._stamp_call = reactor.callLater(0, self._stamp)  # type: ignore[arg-type]

    def _stamp(self) -> None:
        """Stamp the turns sent (their requests were written since: a timed call runs
        after the reactor's round of writes) and have a call confirm them in time."""
        self._stamp_call = None
        now = time.monotonic()
        for token in self._sent:
            token.stamped_at = now
        within = min([self.flush_interval] + [t.spacing_ms / 4000 for t in self._sent])
        self.confirms += self._sent
        self._sent.clear()
        if self._confirm_call is not None and self._confirm_call.active():
            if self._confirm_at <= now + within:
                return
            self._confirm_call.cancel()
        from twisted.internet import reactor

        self._confirm_at = now + within
        self._confirm_call = reactor.callLater(within, self.tick)  # type: ignore[arg-type]

    def _release(self, token: Token, *, urgent: bool) -> None:
        """Send the release of ``token`` with the next call: at the next tick when
        ``urgent`` (a slot with delay: others may wait for it), else within
        :data:`LAZY_RELEASE` seconds (a slot without delay, whose tokens workers keep
        for :data:`REUSE_MAX` anyway)."""
        self.releases.append(token.member)
        deadline = time.monotonic() + (0.0 if urgent else LAZY_RELEASE)
        self._release_by = min(self._release_by, deadline)

    def _local_delay_off(self, request: Request, spider: object = None) -> None:
        """``request_reached_downloader``: the shared gate spaced this request already
        (:func:`scrapy_dist.worker.engine.local_delay_off`)."""
        if self.crawler is not None:
            _engine.local_delay_off(self.crawler, request)

    # -- the calls ------------------------------------------------------------------

    def _shed(self, waiting: Counter[str]) -> None:
        """Hand back the buffered requests of each waiting slot beyond the first
        :data:`KEEP_WAITING` (their leases go back to the queue, uncounted)."""
        if all(n <= KEEP_WAITING for n in waiting.values()):
            return
        kept: Counter[str] = Counter()
        extra = []
        for index, (_, request) in enumerate(self.deliveries.buffer):
            slot = self.slot_of(request)
            kept[slot] += 1
            if kept[slot] > KEEP_WAITING:
                extra.append(index)
        self.deliveries.hand_back_at(extra)
        self.stats.inc_value("scheduler/politeness/handed_back", len(extra))

    def _waiting(self) -> Counter[str]:
        """Buffered requests per slot."""
        return Counter(self.slot_of(request) for _, request in self.deliveries.buffer)

    def tick(self) -> None:
        """The timer: one call if anything is to be asked, released or renewed; never
        raises."""
        try:
            self.sync()
        except Exception:  # the timer must survive anything
            logger.exception("Politeness timer", extra={"spider": self.spider})

    def sync(self) -> bool:
        """Ask for tokens of the slots with waiting requests, confirm turns sent, release
        and renew, in one call (none if there is nothing to do, or while backing off).

        Returns:
            Whether a call was made and answered.
        """
        now = time.monotonic()
        if now < self._backoff_until:
            return False
        waiting = self._waiting()
        # idle tokens of slots with nothing waiting go back
        for slot in [s for s in self.idle if not waiting.get(s)]:
            for token in self.idle.pop(slot):
                self._release(token, urgent=False)
        # granted tokens beyond the requests still buffered (handed back on a pause,
        # taken back with an expired lease) go back at once: others may wait for them
        for slot in list(self.pending):
            tokens = self.pending[slot]
            while len(tokens) > waiting.get(slot, 0):
                self._release(tokens.pop(), urgent=True)
            if not tokens:
                del self.pending[slot]
        asks = self._asks(waiting, now) if self.starved else []
        for slot in [s for s, t in self.retry_at.items() if t <= now]:
            del self.retry_at[slot]
        for slot in [s for s, t in self.refused_at.items() if now - t > BLOCKED_FOR]:
            del self.refused_at[slot]
        renew = now >= self._renew_at and bool(self._held())
        release = bool(self.releases) and (now >= self._release_by or bool(asks) or renew)
        if not asks and not release and not renew and not self.confirms:
            return False
        why = (
            "asks" if asks else "renewals" if renew else "confirms" if self.confirms else "releases"
        )
        self.stats.inc_value(f"scheduler/politeness/calls/{why}")
        try:
            self._call(asks, renew=renew)
        except redis.RedisError as e:
            self._failed(e)
            return False
        self._recovered()
        return True

    def _full(self) -> set[str]:
        """Slots whose concurrency this worker's own downloads in flight fill: Redis
        would refuse them any token, so they are not asked for, and count as blocked."""
        out = Counter(token.slot for token in self.out.values())
        return {slot for slot, n in out.items() if n >= self.limits.of(slot).concurrency}

    def _asks(self, waiting: Counter[str], now: float) -> list[tuple[str, int, Limit]]:
        """What to ask for: ``(slot, tokens wanted, its limit)`` for each slot with more
        requests waiting than tokens held, not refused lately and not filled by this
        worker's own downloads (:meth:`_full`); one turn at most for a slot with delay,
        and none while this worker holds one of its turns not sent, or sent and not
        confirmed by this call (Redis grants no other one meanwhile)."""
        confirming = {id(t) for t in self.confirms}
        unsent = {
            t.slot
            for t in self.out.values()
            if t.turn and not t.confirmed and id(t) not in confirming
        }
        full = self._full()
        asks = []
        for slot, count in waiting.items():
            held = len(self.pending.get(slot, ())) + len(self.idle.get(slot, ()))
            if count <= held or self.retry_at.get(slot, 0.0) > now or slot in unsent:
                continue
            if slot in full:
                self.stats.inc_value("scheduler/politeness/asks_skipped")
                continue
            self._refresh_crawl_delay(slot)
            limit = self.limits.of(slot)
            if limit.delay and held:  # its turn granted, not due yet
                continue
            asks.append((slot, 1 if limit.delay else min(count - held, limit.concurrency), limit))
        return asks

    def _held(self) -> list[Token]:
        tokens = [t for ts in (*self.pending.values(), *self.idle.values()) for t in ts]
        return tokens + list(self.out.values())

    def _call(self, asks: list[tuple[str, int, Limit]], *, renew: bool) -> None:
        """One call of ``lua/politeness.lua``; applies its answer.

        Raises:
            redis.RedisError: Redis did not answer, or refused (the confirmations and
                releases stay, to be sent again).
        """
        started = time.monotonic()
        confirms = list(self.confirms)
        held = self._renewals(confirms) if renew else Renewals([], [], [])
        prefix = f"{self._prefix}{self._calls}."
        releases = list(self.releases)
        call = self._scripts.politeness(
            tokens=self.keys.politeness_tokens,
            busy=self.keys.politeness_busy,
            next_send=self.keys.politeness_next,
            pauses=self.keys.slot_pauses,
            refused=self.keys.politeness_refused,
            prefix=prefix,
            timeout_ms=int(self.timeout * 1000),
            recover_ms=int(self.recover * 1000),
            idle_ms=int(max(KEYS_IDLE, 2 * self.timeout) * 1000),
            lookahead_ms=int(2 * self.flush_interval * 1000),
            mark_ms=int(REFUSED_MARK * 1000),
            confirms=[
                (t.member, round(1000 * (started - (t.stamped_at or started)), 3), t.spacing_ms)
                for t in confirms
            ],
            releases=releases,
            turns=[t.member for t in held.turns],
            waiting=[t.member for t in held.waiting],
            holding=[t.member for t in held.holding],
            asks=[
                (slot, want, limit.concurrency, limit.delay * 1000) for slot, want, limit in asks
            ],
        )
        self._last_call = started
        # counted before it runs: a call whose reply is lost must not lend its token names
        # to the next (Redis would overwrite those tokens and count them twice)
        self._calls += 1
        grants, lost, repairs = call.run()
        self.stats.inc_value("scheduler/politeness/round_trips")
        self.stats.inc_value("scheduler/redis/round_trips")
        for token in confirms:
            token.confirmed = True
        del self.confirms[: len(confirms)]
        del self.releases[: len(releases)]
        self._release_by = math.inf if not self.releases else self._release_by
        self.starved = False
        if repairs:
            self._tell(repairs)
        valid = started + VALID_SHARE * self.timeout
        if renew:
            self._renewed(held, lost, valid)
        self._granted(asks, grants, prefix, started, valid)

    def _renewals(self, confirms: list[Token]) -> Renewals:
        """The tokens this worker holds, as the script renews them (turns granted and
        not taken are not renewed: they are used or go back soon)."""
        idle = [t for ts in (*self.pending.values(), *self.idle.values()) for t in ts]
        held = Renewals([], [t for t in idle if not t.turn], [])
        confirming = {id(t) for t in confirms}
        for token in self.out.values():
            sent = not token.turn or token.confirmed or id(token) in confirming
            (held.holding if sent else held.turns).append(token)
        return held

    def _renewed(self, held: Renewals, lost: list[Any], valid: float) -> None:
        """Apply a renewal: Redis keeps the later deadline (``ZADD GT``), so do we; a
        token Redis no longer has is not used."""
        self._renew_at = time.monotonic() + self.heartbeat_interval
        gone = {m.decode() if isinstance(m, bytes) else m for m in lost}
        for token in held.waiting:
            token.valid_until = -1.0 if token.member in gone else max(token.valid_until, valid)
        for token in held.holding:
            token.valid_until = max(token.valid_until, valid)
        if any(t.member in gone for t in held.turns):
            self.stats.inc_value("scheduler/politeness/turns_lost")

    def _granted(
        self,
        asks: list[tuple[str, int, Limit]],
        grants: list[Any],
        prefix: str,
        started: float,
        valid: float,
    ) -> None:
        """Take the tokens granted for ``asks`` (3 numbers each in ``grants``), and note
        when to ask again for the slots refused."""
        now = time.monotonic()
        n = 0
        due = None
        if len(self._known) > KNOWN_MAX:
            self._known.clear()
        for index, (slot, _, limit) in enumerate(asks):
            self._known.add(slot)
            count = int(grants[3 * index])
            offset = float(grants[3 * index + 1]) / 1000
            if not count:
                hint = float(grants[3 * index + 2]) / 1000
                self.retry_at[slot] = now + max(self.flush_interval, hint)
                self.refused_at[slot] = now
                self.stats.inc_value("scheduler/politeness/refused")
                continue
            self.retry_at.pop(slot, None)
            tokens = self.pending.setdefault(slot, [])
            send_at = now + offset  # Redis's send time on this clock, never earlier
            for _ in range(count):
                member = f"{prefix}{n}|{slot}"
                n += 1
                if limit.delay:  # used by TURN_GRACE past the send time, at the latest
                    until = started + offset + TURN_GRACE
                    tokens.append(Token(member, slot, send_at, until, now, turn=True))
                else:
                    tokens.append(Token(member, slot, send_at, send_at - now + valid, now))
            due = send_at if due is None else min(due, send_at)
            tokens.sort(key=lambda t: t.send_at)
            self.stats.inc_value("scheduler/politeness/granted", count)
        if due is not None:
            self._wake_at(due)

    def _tell(self, repairs: list[Any]) -> None:
        """Log what the script repaired: one ERROR per key, at most one per key every
        :data:`REPAIR_REMINDER` seconds (each repair is counted)."""
        found: dict[str, list[str]] = {}
        for raw in repairs:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            key, _, what = text.partition("\n")
            found.setdefault(key, []).append(what)
        now = time.monotonic()
        for key, whats in found.items():
            self.stats.inc_value("scheduler/politeness/repaired", len(whats))
            if now - self._told.get(key, -math.inf) < REPAIR_REMINDER:
                continue
            self._told[key] = now
            logger.error(
                "Cluster-wide politeness: Redis key %(key)s %(what)s",
                {"key": key, "what": "; ".join(whats)},
                extra={"spider": self.spider},
            )

    def _wake_at(self, when: float) -> None:
        """Wake the engine at ``when`` (monotonic), or now if it is due."""
        delay = when - time.monotonic()
        if delay <= 0.001:
            self.wake()
            return
        if self._alarm is not None and self._alarm.active():
            if self._alarm_at <= when:
                return
            self._alarm.cancel()
        from twisted.internet import reactor

        self._alarm_at = when
        self._alarm = reactor.callLater(delay, self._alarmed)  # type: ignore[arg-type]

    def _alarmed(self) -> None:
        self._alarm = None
        self.wake()
        # the next token of any slot, if one waits
        upcoming = [ts[0].send_at for ts in self.pending.values() if ts]
        later = [t for t in upcoming if t > time.monotonic()]
        if later:
            self._wake_at(min(later))

    def _refresh_crawl_delay(self, slot: str) -> None:
        """Take a robots.txt ``Crawl-delay`` of ``slot`` into its limits once read."""
        if slot in self.limits.crawl_delays:
            return
        for _, request in self.deliveries.buffer:
            if self.slot_of(request) == slot:
                delay = self.crawl_delay(request)
                if delay is not None:
                    if len(self.limits.crawl_delays) > KNOWN_MAX:
                        self.limits.crawl_delays.clear()  # read again from the parsers
                    self.limits.crawl_delays[slot] = float(delay)
                    if delay > 0 and self.limits.of(slot).delay == delay:
                        logger.info(
                            "robots.txt of %(slot)s asks for Crawl-delay %(d)gs: used as "
                            "the slot's delay for all workers",
                            {"slot": slot, "d": delay},
                            extra={"spider": self.spider},
                        )
                return

    # -- faults ---------------------------------------------------------------------

    def _failed(self, error: redis.RedisError) -> None:
        now = time.monotonic()
        self.stats.inc_value("scheduler/politeness/redis/errors")
        self._backoff = min(BACKOFF_MAX, max(0.25, 2 * self._backoff))
        self._backoff_until = now + self._backoff
        if self._outage_since is None:
            self._outage_since = now
            logger.error(
                "Cluster-wide politeness: Redis did not grant download tokens (%(e)s): "
                "requests of rate-limited slots wait, leased, until it does (no request "
                "is sent without a token)",
                {"e": f"{type(error).__name__}: {error}"},
                extra={"spider": self.spider},
            )

    def _recovered(self) -> None:
        self._backoff = 0.0
        if self._outage_since is not None:
            logger.warning(
                "Cluster-wide politeness: Redis grants download tokens again, after %(s).1fs",
                {"s": time.monotonic() - self._outage_since},
                extra={"spider": self.spider},
            )
            self._outage_since = None
