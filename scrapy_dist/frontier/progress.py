"""The crawl-wide reads: where the crawl as a whole stands, what a shard holds and
counted, what other workers hold, the crawl's counters; what each asks Redis and what
its reply means.

Each read is a call (a script's, or a function of a client) and a typed answer
(:class:`Progress`, :class:`~scrapy_dist.scripts.OtherShards`, :class:`Elsewhere`, the
counters of :func:`progress_numbers`). The :class:`~scrapy_dist.frontier.core.Frontier`
decides when to send one (after its pending writes, noting outages: its ``call``) and
keeps what an answer means for it (a crawl seen finished); nothing here keeps state but
the garbled values already warned about. ``scrapy-dist status`` reads the progress hash
with :func:`progress_numbers` too.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from scrapy_dist.frontier.epoch import stored_number
from scrapy_dist.frontier.leases import Held, held_by_others
from scrapy_dist.frontier.registry import heartbeats
from scrapy_dist.scripts import OtherShards

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import RedisQueue
    from scrapy_dist.scripts import ScriptCall, Scripts
    from scrapy_dist.seeds import SeedQueue

__all__ = [
    "FINISHED_RECORD_TTL",
    "PROGRESS_COUNTERS",
    "Elsewhere",
    "Progress",
    "census_call",
    "census_of",
    "crawl_totals",
    "progress_call",
    "progress_numbers",
    "read_counters",
    "read_elsewhere",
]

logger = logging.getLogger(__name__)


#: Seconds a finished crawl that does not persist keeps its progress record (and its
#: registry) when a worker of it may still be paused: for it to learn the crawl finished.
FINISHED_RECORD_TTL = 86400


class Progress(NamedTuple):
    """Where the crawl as a whole stands (see ``lua/progress.lua``)."""

    #: ``"busy"``, ``"waiting"`` (nothing settled yet), ``"idle"`` or ``"finished"``.
    state: str
    queued: int
    seeds: int
    leased: int

    @classmethod
    def of(cls, reply: Any) -> Progress:
        """The progress ``lua/progress.lua`` replied (:func:`progress_call`)."""
        state, queued, seeds, leased, _ = reply
        return cls(state.decode(), int(queued), int(seeds), int(leased))


class Elsewhere(NamedTuple):
    """What other workers of the crawl hold, and whether they beat
    (:func:`read_elsewhere`)."""

    #: Worker id -> the leases it holds (workers holding none left out).
    held: dict[str, Held]
    #: Worker id -> its last heartbeat in the crawl's registry (server time, seconds).
    beats: dict[str, float]
    #: The server's time when they were read.
    now: float
    #: Requests queued (every shard's; a queue key of another type holds none).
    queued: int


#: The counters of the progress hash, whole numbers as the scripts write them
#: (``lua/_leases.lua`` ``integer_of``); its other numbers are times (``idle_since``,
#: ``finished_at``).
PROGRESS_COUNTERS = frozenset(
    {"done", "retried", "dead", "run_base", "others_base", "seeds_done", "reclaimed"}
)

#: ``(key, field, value)`` of the garbled progress values already warned about.
_garbled: set[tuple[str, str, bytes]] = set()


def _warn_once(key: str, field: str, value: bytes, message: str) -> None:
    if (key, field, value) in _garbled:
        return
    if len(_garbled) < 1000:  # a bound: a long-running exporter reads it forever
        _garbled.add((key, field, value))
    logger.warning(message, {"key": key, "field": field, "value": value[:80]})


def progress_numbers(raw: Mapping[bytes, bytes] | Exception | None, key: str) -> dict[str, float]:
    """The numbers of the progress hash ``key`` as ``HGETALL`` read it (``raw``), by
    field: its counters (:data:`PROGRESS_COUNTERS`) and times. A counter written by hand
    that is not a whole number (``junk``, ``nan``, ``1.5``) reads as 0, as the scripts
    read it, a time that is not a finite number as absent, and a key of another type
    (``raw``, the ``WRONGTYPE`` error of the read; the next script that counts sets it
    aside) as no numbers: each with one warning (once per value), never an error.

    Raises:
        redis.RedisError: ``raw`` is another error than ``WRONGTYPE``.
    """
    if isinstance(raw, Exception):
        if not str(raw).startswith("WRONGTYPE"):
            raise raw
        _warn_once(
            key,
            "",
            b"",
            "Progress key %(key)s is not a hash (written by hand?): read as no counters; "
            "the next script that counts renames it to %(key)s:wrongtype",
        )
        return {}
    numbers: dict[str, float] = {}
    for name, value in (raw or {}).items():
        field = name.decode(errors="replace")
        number = stored_number(value)
        if number is None:
            number = math.nan
        if field in PROGRESS_COUNTERS and not number.is_integer():
            _warn_once(
                key,
                field,
                value,
                "Progress counter %(field)s of %(key)s is not a whole number (%(value)r, "
                "written by hand?): read as 0",
            )
            numbers[field] = 0
        elif math.isfinite(number):
            numbers[field] = number
    return numbers


def progress_call(
    scripts: Scripts,
    keys: RedisKeys,
    queue: RedisQueue,
    seeds: SeedQueue,
    *,
    clear_keys: Iterable[str],
    epoch: str,
    grace: float,
    clear: bool,
    keep_for: float,
    others: OtherShards | None,
) -> ScriptCall:
    """The call of ``lua/progress.lua`` on a frontier's keys, fenced by ``epoch``: marks
    the crawl finished after ``grace`` seconds of emptiness and then, with ``clear``,
    deletes ``clear_keys`` (exactly once); its reply is read by :meth:`Progress.of`.
    ``others`` (a sharded crawl): what the other shards hold and have counted."""
    return scripts.progress(
        queue=queue.key,
        seeds=seeds.key,
        holders=keys.holders,
        previous=keys.leases,
        progress=keys.progress,
        epoch_key=keys.epoch,
        clear_keys=clear_keys,
        queue_kind=queue.kind,
        seeds_kind=seeds.kind,
        grace=grace,
        clear=clear,
        keep_for=int(keep_for),
        epoch=epoch,
        others=others,
    )


def census_call(scripts: Scripts, keys: RedisKeys, queue: RedisQueue, epoch: str) -> ScriptCall:
    """The call of ``lua/census.lua`` on a shard's keys, fenced by ``epoch``: what they
    hold and counted (read by :func:`census_of`)."""
    return scripts.census(
        queue=queue.key,
        holders=keys.holders,
        previous=keys.leases,
        progress=keys.progress,
        epoch_key=keys.epoch,
        queue_kind=queue.kind,
        epoch=epoch,
    )


def census_of(reply: Any) -> OtherShards:
    """A shard's part of its crawl's progress, from ``lua/census.lua``'s reply: its
    entries queued or leased and its counters."""
    queued, leased, done, dead, retried = (int(x) for x in reply)
    return OtherShards(queued + leased, done, dead, retried)


def read_elsewhere(
    client: redis.Redis,
    keys: RedisKeys,
    shards: Sequence[tuple[redis.Redis, RedisKeys]],
    worker_id: str,
    queue: RedisQueue,
) -> Elsewhere:
    """The leases workers other than ``worker_id`` hold in every shard (each read
    with its client), the crawl's heartbeats, and the requests ``queue`` holds (a
    queue key of another type: none; a reserve sets it aside)."""
    now, beats = heartbeats(client, keys.workers)
    held: dict[str, Held] = {}
    for shard_client, shard_keys in shards:
        for worker, found in held_by_others(shard_client, shard_keys, {worker_id}).items():
            before = held.get(worker)
            held[worker] = (
                found
                if before is None
                else Held(before.leases + found.leases, max(before.until, found.until))
            )
    try:
        queued = len(queue)
    except redis.ResponseError:  # another type (written by hand): a reserve sets it aside
        queued = 0
    return Elsewhere(held, beats, now, queued)


def read_counters(client: redis.Redis, key: str) -> Any:
    """The progress hash ``key`` as ``HGETALL`` reads it, or the ``WRONGTYPE`` error of
    a key of another type (its content, not a refusal of the server: no backoff), for
    :func:`progress_numbers`."""
    try:
        return client.hgetall(key)
    except redis.exceptions.ResponseError as e:
        if str(e).startswith("WRONGTYPE"):
            return e
        raise


def crawl_totals(raw: Mapping[bytes, bytes] | Exception | None, key: str) -> dict[str, int]:
    """The crawl-wide counters (``done``, ``retried``, ``dead``) of the progress hash
    ``key`` as :func:`read_counters` read it; one written by hand reads as 0, a key of
    another type as none (:func:`progress_numbers`)."""
    return {
        name: int(value)
        for name, value in progress_numbers(raw, key).items()
        if name in ("done", "retried", "dead")
    }
