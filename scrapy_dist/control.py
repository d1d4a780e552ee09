"""Crawl control: pause, resume and drain a running crawl.

A crawl's control state lives in one small hash, ``<crawl>:control``
(:attr:`RedisKeys.control <scrapy_dist.keys.RedisKeys.control>`), owned by this module:
``state`` (``running``, ``paused`` or ``draining``), ``by`` (who set it), ``reason``
(why) and ``since`` (the Redis server's clock when it was set, seconds). No key means
``running``. Each change is also recorded in the capped audit trail
``<crawl>:control:log`` (:func:`read_log`). Operators write it with
``scrapy-dist pause|resume|drain SPIDER`` or with :class:`CrawlControl`; every worker
reads it every
:data:`~scrapy_dist.worker.control.POLL_INTERVAL` seconds (one ``HMGET`` of those four
fields, :func:`read_command`; others are ignored) and acts on it
(:mod:`scrapy_dist.worker.control`). Then:

- **paused**: the scheduler hands out nothing more and reserves nothing, the spider
  reads no seeds, and the leases buffered but not started are handed back to the
  queue (a pause may last long: nothing stays leased to a worker that does not use
  it). Requests already in Scrapy's engine finish; their acknowledgements and the
  requests their callbacks return are still sent. The spider stays open when idle,
  and no worker checks the crawl for completion: a paused crawl is never "finished".
- **running** again: workers take work within
  :data:`~scrapy_dist.worker.control.POLL_INTERVAL` seconds and a timer tick (at most
  :data:`~scrapy_dist.worker.control.CARRY_SLACK` more; the engine is woken at once).
- **draining**: as paused, then, once the engine holds nothing, the worker sends what
  is pending and closes its spider with the reason :data:`DRAINED` (``scrapy crawl``
  exits 0). A worker started while the crawl drains closes at once the same way,
  saying that ``scrapy-dist resume`` lets workers run again. The queue keeps what was
  not crawled; nothing stays leased.

Faults: a read that fails (Redis unreachable, refusing, an ACL) changes nothing: the
worker keeps the state it last read, logs once and retries with a backoff. A control
key that does not hold a valid state (a wrong type, an unknown ``state``) is read as
**paused** (the safe reading: never crawl against an operator's wish) and logged as an
ERROR, repeated while it lasts, so a crawl never stops silently.
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis

from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from scrapy_dist.keys import RedisKeys

__all__ = [
    "DRAINED",
    "DRAINING",
    "PAUSED",
    "RUNNING",
    "STATES",
    "ControlState",
    "CrawlControl",
    "drain",
    "pause",
    "read_state",
    "resume",
    "set_state",
]

RUNNING, PAUSED, DRAINING = "running", "paused", "draining"
#: The states a crawl may be set to.
STATES = (RUNNING, PAUSED, DRAINING)
#: Close reason of a worker that finished its work because the crawl drains.
DRAINED = "drained"
#: Longest ``reason`` and ``by`` kept (characters).
REASON_MAX, BY_MAX = 500, 100
#: Changes kept in the audit trail ``<crawl>:control:log`` (newest first).
LOG_MAX = 200


@dataclass(frozen=True)
class ControlState:
    """A crawl's control state as read from Redis.

    Attributes:
        state: ``"running"``, ``"paused"`` or ``"draining"``; a key that holds no valid
            state reads as ``"paused"`` (see :attr:`problem`).
        by: who set it (empty when no key exists).
        reason: why (may be empty).
        since: when, on the Redis server's clock (seconds since the epoch); ``None``
            when no key exists.
        problem: why the stored value is not a valid state (empty when it is).
    """

    state: str = RUNNING
    by: str = ""
    reason: str = ""
    since: float | None = None
    problem: str = ""

    @property
    def running(self) -> bool:
        """Whether workers take work."""
        return self.state == RUNNING

    def as_dict(self) -> dict[str, Any]:
        """The state as JSON-able values."""
        return {
            "state": self.state,
            "by": self.by or None,
            "reason": self.reason or None,
            "since": self.since,
            "problem": self.problem or None,
        }

    def describe(self) -> str:
        """One line: the state, who set it, when (server time, local) and why."""
        if self.problem:
            return f"{self.state} (invalid control key: {self.problem})"
        text = self.state
        if self.since is not None:
            text += " since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        if self.by:
            text += f" by {self.by}"
        if self.reason:
            text += f": {self.reason}"
        return text


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _shown(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): what a hand-written
    hash holds reaches logs and terminals as one line, without escape sequences."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: The fields of a control hash, in the order :func:`read_command` reads them.
FIELDS = ("state", "by", "reason", "since")
#: Latest ``since`` taken as a time (the end of year 9999); later, or not finite, is
#: garbage and reads as unknown.
SINCE_MAX = 253_402_300_799.0


def read_command(keys: RedisKeys) -> tuple[str, ...]:
    """The command that reads a crawl's control state: ``HMGET`` of its four fields (a
    hash given thousands of other fields by hand costs no more to read)."""
    return ("HMGET", keys.control, *FIELDS)


def fields_of(reply: Any) -> dict[Any, Any]:
    """The fields found in a reply of :func:`read_command` (what :func:`parse_state`
    takes)."""
    return {name: value for name, value in zip(FIELDS, reply, strict=True) if value is not None}


def parse_state(raw: Mapping[Any, Any]) -> ControlState:
    """The state a control hash holds (its fields; none: ``running``).

    An unknown ``state``, or a missing one, reads as ``paused`` with
    :attr:`ControlState.problem` saying why; a ``since`` that is not a time reads as
    unknown (``None``); control characters in ``by`` and ``reason`` are escaped. Never
    raises.
    """
    if not raw:
        return ControlState()
    fields = {_text(k): _text(v) for k, v in raw.items()}
    state = fields.get("state", "")
    by = _shown(fields.get("by", "")[:BY_MAX])
    reason = _shown(fields.get("reason", "")[:REASON_MAX])
    try:
        since: float | None = float(fields["since"]) if "since" in fields else None
    except ValueError:
        since = None
    if since is not None and not 0 <= since <= SINCE_MAX:  # nan, inf, years away
        since = None
    if state not in STATES:
        problem = f"state {_shown(state[:40])!r} is not one of {', '.join(STATES)}"
        return ControlState(PAUSED, by, reason, since, problem)
    return ControlState(state, by, reason, since)


def read_state(client: redis.Redis, keys: RedisKeys) -> ControlState:
    """Read a crawl's control state (one ``HMGET``, :func:`read_command`).

    A key of the wrong type reads as ``paused`` with the problem named (as workers
    read it).

    Raises:
        redis.RedisError: Redis is unreachable or refused the read.
    """
    try:
        reply = client.hmget(keys.control, FIELDS)
    except redis.ResponseError as e:
        if not str(e).startswith("WRONGTYPE"):
            raise
        return ControlState(PAUSED, problem=f"{keys.control} is not a hash ({e})")
    return parse_state(fields_of(reply))


def default_by() -> str:
    """``user@host`` of this process (who sets a state when nobody says)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name (a container without /etc/passwd entry)
        user = "?"
    return f"{user}@{socket.gethostname()}"


def check_text(value: str, what: str, most: int) -> str:
    """``value`` stripped, if it is at most ``most`` printable characters.

    Raises:
        ConfigurationError: it is longer, or has control characters (newlines...).
    """
    value = value.strip()
    if len(value) > most:
        raise ConfigurationError(f"{what} must be at most {most} characters, not {len(value)}")
    if not value.isprintable():
        raise ConfigurationError(f"{what} must be printable text, without control characters")
    return value


def set_state(
    client: redis.Redis, keys: RedisKeys, state: str, *, by: str | None = None, reason: str = ""
) -> tuple[ControlState, ControlState]:
    """Set a crawl's control state, recording who, why and when (the server's clock).
    Setting the state it already has changes nothing (its ``since`` is kept).

    Returns:
        ``(before, after)``: the state found and the state now.

    Raises:
        ConfigurationError: an unknown ``state``, an invalid ``by`` or ``reason``
            (:func:`check_text`), or the control key holds another type than a hash
            (it is left alone: delete it if it is garbage).
        redis.RedisError: Redis is unreachable or refused the write.
    """
    if state not in STATES:
        raise ConfigurationError(f"unknown crawl state {state!r}: use one of {', '.join(STATES)}")
    who = check_text(default_by() if by is None else by, "by", BY_MAX)
    why = check_text(reason, "reason", REASON_MAX)
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.type(keys.control)
        pipe.hmget(keys.control, FIELDS)
        now_reply, kind, raw = pipe.execute(raise_on_error=False)
    if _text(kind) not in ("hash", "none"):
        raise ConfigurationError(
            f"Redis key {keys.control!r} (crawl control) holds a {_text(kind)}, not a hash: "
            f"workers read it as paused; delete it if it is garbage (redis-cli del "
            f"'{keys.control}'), then set the state again"
        )
    for reply in (now_reply, raw):
        if isinstance(reply, Exception):
            raise reply
    before = parse_state(fields_of(raw))
    if before.state == state and not before.problem:
        return before, before
    seconds, micros = cast("tuple[int, int]", now_reply)
    since = seconds + micros / 1e6
    after = ControlState(state, who, why, since)
    record = json.dumps(
        {"state": state, "from": before.state, "by": who, "reason": why, "since": since}
    )
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(
            keys.control, mapping={"state": state, "by": who, "reason": why, "since": repr(since)}
        )
        pipe.lpush(keys.control_log, record)  # the audit trail, newest first
        pipe.ltrim(keys.control_log, 0, LOG_MAX - 1)
        pipe.execute()
    return before, after


def read_log(client: redis.Redis, keys: RedisKeys, count: int = 50) -> list[dict[str, Any]]:
    """The last ``count`` changes of the crawl's control state, newest first (one
    ``LRANGE`` of the audit trail :func:`set_state` keeps; records that are not JSON
    objects, written by hand, are left out; a key of the wrong type reads as none)."""
    try:
        raw = client.lrange(keys.control_log, 0, max(0, count - 1))
    except redis.ResponseError:
        return []
    found = []
    for item in cast("list[bytes]", raw):
        try:
            record = json.loads(item)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


def pause(
    client: redis.Redis, keys: RedisKeys, *, reason: str = "", by: str | None = None
) -> ControlState:
    """Pause the crawl (see the module docstring); returns the state now."""
    return set_state(client, keys, PAUSED, by=by, reason=reason)[1]


def resume(
    client: redis.Redis, keys: RedisKeys, *, reason: str = "", by: str | None = None
) -> ControlState:
    """Let the crawl's workers take work again (after a pause or a drain)."""
    return set_state(client, keys, RUNNING, by=by, reason=reason)[1]


def drain(
    client: redis.Redis, keys: RedisKeys, *, reason: str = "", by: str | None = None
) -> ControlState:
    """Drain the crawl: workers finish what they started, hand back the rest and exit."""
    return set_state(client, keys, DRAINING, by=by, reason=reason)[1]


@dataclass(frozen=True)
class Settled:
    """What a wait found: leases still held by live workers, live workers."""

    leased: int
    workers: int


class CrawlControl:
    """Steer one crawl from Python: the same as ``scrapy-dist pause|resume|drain``.

    Example::

        control = CrawlControl.from_settings(get_project_settings(), "books")
        control.pause(reason="deploying")
        control.wait_settled()          # in-flight requests finished
        ...
        control.resume()

    Args:
        client: a client of the crawl's Redis (under Redis Cluster, one that reaches the
            crawl's slot).
        keys: the crawl's keys.
        worker_timeout: seconds without heartbeat after which a worker counts as gone
            (``SCHEDULER_WORKER_TIMEOUT``), for :meth:`wait_settled`.
    """

    def __init__(self, client: redis.Redis, keys: RedisKeys, *, worker_timeout: float = 30.0):
        self.client = client
        self.keys = keys
        self.worker_timeout = worker_timeout

    @classmethod
    def from_settings(
        cls, settings: BaseSettings, spider: str, *, job: str | None = None
    ) -> CrawlControl:
        """The control of spider ``spider``'s crawl (its job from the settings, or
        ``job``), with a client made from the settings (no I/O).

        Raises:
            ConfigurationError: invalid settings.
        """
        from scrapy_dist.config.core import Config
        from scrapy_dist.connection import client_from_config, crawl_client
        from scrapy_dist.keys import hash_tag_on, keys_from_config, server_time

        config = Config.from_settings(settings)
        if job is not None:
            config = config.with_values({"SCHEDULER_JOB_ID": job, "SCHEDULER_JOB_TIMESTAMP": None})
        client = client_from_config(config.connection)
        now = server_time(client) if config.keys.job_timestamp else None
        keys = keys_from_config(config.keys, spider, now, hash_tag=hash_tag_on(config))
        return cls(crawl_client(client, keys), keys, worker_timeout=config.workers.worker_timeout)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CrawlControl:
        """The control of a running crawler's own crawl (e.g. an extension that pauses
        the crawl when the site asks to slow down); its calls block the reactor for one
        round trip each."""
        from scrapy_dist.assembly import assemble

        parts = assemble(crawler)
        return cls(parts.client, parts.keys, worker_timeout=parts.config.workers.worker_timeout)

    @property
    def state(self) -> ControlState:
        """The crawl's control state now (one round trip)."""
        return read_state(self.client, self.keys)

    def pause(self, reason: str = "", *, by: str | None = None) -> ControlState:
        """Pause the crawl; returns the state now (see :func:`set_state` for errors)."""
        return pause(self.client, self.keys, reason=reason, by=by)

    def resume(self, reason: str = "", *, by: str | None = None) -> ControlState:
        """Resume the crawl; returns the state now."""
        return resume(self.client, self.keys, reason=reason, by=by)

    def drain(self, reason: str = "", *, by: str | None = None) -> ControlState:
        """Drain the crawl; returns the state now."""
        return drain(self.client, self.keys, reason=reason, by=by)

    def settled(self) -> Settled:
        """Unexpired leases held by live workers (in every shard of a sharded crawl)
        and live workers, now: one round trip, then one per shard. Leases of a worker
        that died (no heartbeat for ``worker_timeout`` seconds) are not counted: they
        expire, and the next reserve after a resume takes them back. Unexpired leases
        of a previous version's layout (``<crawl>:leases``) count while workers live."""
        from scrapy_dist.frontier.shards import shard_count

        with self.client.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hgetall(self.keys.workers)
            now_reply, workers = pipe.execute()
        seconds, micros = cast("tuple[int, int]", now_reply)
        now = seconds + micros / 1e6
        live: list[str] = []
        for member, beat in cast("dict[bytes, bytes]", workers).items():
            try:
                if now - float(beat) <= self.worker_timeout:
                    live.append(_text(member))
            except ValueError:
                continue
        held = 0
        if live:
            for client, keys in self._shards(shard_count(self.client, self.keys)):
                with client.pipeline(transaction=False) as pipe:
                    pipe.zcount(keys.leases, f"({now}", "+inf")  # a previous version's
                    pipe.zmscore(keys.holders, live)
                    for worker in live:
                        pipe.hlen(keys.holding(worker))
                    previous, scores, *sizes = pipe.execute()
                held += int(previous) + sum(
                    size
                    for score, size in zip(scores, sizes, strict=True)
                    if score is not None and score > now
                )
        return Settled(held, len(live))

    def _shards(self, count: int) -> list[tuple[redis.Redis, RedisKeys]]:
        """The keys of each of the crawl's ``count`` shards, with a client reaching them."""
        from scrapy_dist.frontier.shards import shard_client
        from scrapy_dist.keys import RedisKeys, shard_crawl

        found = [(self.client, self.keys)]
        for index in range(1, count):
            crawl = shard_crawl(self.keys.crawl, index, count)
            keys = RedisKeys(
                crawl, f"{crawl}:requests", f"{crawl}:dupefilter", f"{crawl}:start_urls"
            )
            found.append((shard_client(self.client, keys), keys))
        return found

    def wait_settled(
        self, *, exited: bool = False, timeout: float = 60.0, interval: float = 0.25
    ) -> Settled:
        """Wait until no live worker holds a lease (in-flight requests finished and
        acknowledged, buffers handed back), and with ``exited`` until no worker is
        live (a drain is over).

        Returns:
            What the last look found: all zero when it is settled, else what remains
            after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self.settled()
            if found.leased == 0 and (not exited or found.workers == 0):
                return found
            if time.monotonic() >= deadline:
                return found
            time.sleep(interval)
