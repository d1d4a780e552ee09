"""The Lua scripts in ``scrapy_dist/lua/`` registered on a client, one typed call each.

Each ``.lua`` file opens with a header naming its ``KEYS`` and ``ARGV``; the method of
:class:`Scripts` named after the script is the one place in Python that builds them, in
that order, from named parameters. Every key a script touches is passed in ``KEYS``,
except those a script can only find out inside itself, built by the Lua twins of
:mod:`scrapy_dist.keys`'s functions with the hash tag of a key passed in: a priority
queue's levels (``lua/_levels.lua``) and a dupefilter's buckets and generations
(``lua/_filters.lua``).

A script's text (the libraries it uses, the constants Python and Lua share written in
as values) is assembled by :mod:`scrapy_dist.lua_source`; the names of that module
code imported from here before it existed (:func:`source`, :data:`NAMES`,
:func:`constants`, :func:`parts`, :func:`used_definitions`, :func:`inline_constants`)
are re-exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple
from weakref import WeakKeyDictionary

from scrapy_dist.lua_source import (
    NAMES,
    constants,
    inline_constants,
    parts,
    source,
    used_definitions,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import redis
    from redis.client import Pipeline
    from redis.commands.core import Script

    from scrapy_dist.keys import RedisKeys

__all__ = [
    "NAMES",
    "Arg",
    "Fence",
    "OtherShards",
    "ScriptCall",
    "Scripts",
    "constants",
    "inline_constants",
    "parts",
    "scripts_for",
    "source",
    "used_definitions",
]

#: A script argument.
Arg = bytes | str | int | float


class Fence(NamedTuple):
    """What a worker's enqueue depends on (``lua/enqueue.lua``): the crawl's epoch it
    joined and, per request, the lease of the request whose callback produced it."""

    epoch_key: str
    #: ``""``: unfenced (a command-line tool).
    epoch: str
    #: The worker's holding hash (``""``: no request names a parent).
    holding: str = ""
    #: The parent lease id of each request (``""``: none).
    parents: Sequence[str] = ()

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`Scripts.enqueue` this fence sets."""
        return self._asdict()


class OtherShards(NamedTuple):
    """What shards of a sharded crawl hold and counted (``lua/census.lua``): one
    shard's (``Frontier.census``), or shards ``1..N-1`` together, for shard 0's
    ``lua/progress.lua``."""

    #: Entries queued or leased.
    busy: int
    #: Their counters: settled (``done`` + ``dead``), and ``retried``.
    done: int
    dead: int
    retried: int


class ScriptCall(NamedTuple):
    """One call of a script: its ``KEYS`` and ``ARGV`` in the order its header gives."""

    script: Script
    keys: list[str]
    args: list[Arg]

    def run(self, client: redis.Redis | Pipeline | None = None) -> Any:
        """Run it with ``EVALSHA`` on the client the script was registered on, or queue
        it on ``client`` (a pipeline); a script missing from the server is loaded."""
        return self.script(keys=self.keys, args=self.args, client=client)


_registered: WeakKeyDictionary[redis.Redis, Scripts] = WeakKeyDictionary()


#: Seconds between two samples of a crawl's history (whichever worker heartbeats first).
HISTORY_STEP = 5
#: Samples a crawl's history keeps: a day at :data:`HISTORY_STEP` (about 1 MB of Redis).
HISTORY_SIZE = 17_280


@dataclass(frozen=True)
class HistoryKeys:
    """What a heartbeat samples into the crawl's history (``lua/heartbeat.lua``): the
    keys it reads and writes, the queue's kind, the step and the size kept."""

    figures: str
    history: str
    stats: str
    progress: str
    queue: str
    holders: str
    previous: str
    dead: str
    queue_kind: str
    step: int = HISTORY_STEP
    size: int = HISTORY_SIZE

    @classmethod
    def of(cls, keys: RedisKeys, queue_kind: str) -> HistoryKeys:
        """The history keys of a crawl (shard 0: a sharded crawl's other shards are not
        counted in its history)."""
        return cls(
            figures=keys.worker_figures,
            history=keys.history,
            stats=keys.stats,
            progress=keys.progress,
            queue=keys.requests,
            holders=keys.holders,
            previous=keys.leases,
            dead=keys.dead,
            queue_kind=queue_kind,
        )


class Scripts:
    """The package's scripts bound to one client, one typed call per script.

    Each method returns the :class:`ScriptCall` of its script (run it, or send it in a
    pipeline); its parameters are the script's ``KEYS`` and ``ARGV``, named as in the
    script's header.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._scripts = {name: client.register_script(source(name)) for name in NAMES}

    def all(self) -> list[Script]:
        """Every script, e.g. to load them all after the server lost its script cache."""
        return list(self._scripts.values())

    def _call(self, name: str, keys: Iterable[str], args: Iterable[Arg]) -> ScriptCall:
        return ScriptCall(self._scripts[name], list(keys), list(args))

    # -- the frontier (lua/enqueue, reserve, settle, renew, release, progress) -----------

    def enqueue(
        self,
        *,
        queue: str,
        seq: str,
        epoch_key: str,
        queue_kind: str,
        filter_kind: str = "none",
        filter_keys: Sequence[str] = (),
        filter_args: Sequence[Arg] = (),
        entries: Iterable[tuple[bytes, float | str, bytes]],
        epoch: str = "",
        holding: str = "",
        parents: Sequence[str] = (),
    ) -> ScriptCall:
        """``lua/enqueue.lua``: dedupe and push ``(token, score, payload)`` entries.

        Args:
            queue: the request queue; ``queue_kind`` its kind (``"list"``, ``"levels"``).
            seq: the sequence counter giving entries their ids.
            epoch_key: the crawl's epoch key (not read when ``epoch`` is ``""``).
            filter_kind: the dupefilter backend's kind, ``"none"`` for no dedupe.
            filter_keys: the backend's keys; ``filter_args`` its arguments.
            entries: the token (``b""``: not filtered), score and payload of each request.
            epoch: the crawl epoch the caller joined (``""``: unfenced).
            holding: the calling worker's holding hash (read only for entries with a
                parent; ``""``: the sequence key stands in, never read).
            parents: the lease id of each entry's parent, aligned with ``entries``
                (``""`` or missing: none, e.g. a seed's or a start request's); an entry
                whose parent lease is not in ``holding`` is refused.
        """
        args: list[Arg] = [queue_kind, filter_kind, len(filter_args), *filter_args]
        for i, (token, score, payload) in enumerate(entries):
            args += (token, score, payload, parents[i] if i < len(parents) else "")
        args.append(epoch)
        return self._call("enqueue", [queue, seq, epoch_key, holding or seq, *filter_keys], args)

    def reserve(
        self,
        *,
        holders: str,
        holding: str,
        deliveries: str,
        dead: str,
        queue: str,
        seeds: str,
        seq: str,
        progress: str,
        epoch_key: str,
        previous: tuple[str, str],
        origin: str,
        take: str,
        queue_put_back: str,
        seeds_put_back: str,
        count: int,
        duration: float,
        worker: str,
        max_deliveries: int,
        reclaim_limit: int,
        epoch: str,
        take_args: Sequence[Arg] = (),
        take_keys: Sequence[str] = (),
    ) -> ScriptCall:
        """``lua/reserve.lua``: reclaim expired leases (``previous``: the previous
        version's leases zset and leased hash too), then lease up to ``count`` entries
        taken from the queue (``origin`` :data:`FROM_QUEUE`) or the seeds key
        (:data:`FROM_SEEDS`) with the command ``take`` into ``holding`` (``take_args``:
        what that way of taking reads after the others, ``RedisQueue.take_args``; and
        ``take_keys``, the keys it reads after the others)."""
        keys = [holders, holding, deliveries, dead, queue, seeds, seq, progress, epoch_key]
        keys += [*previous, *take_keys]
        args: list[Arg] = [
            origin,
            take,
            queue_put_back,
            seeds_put_back,
            count,
            duration,
            worker,
            max_deliveries,
            reclaim_limit,
            epoch,
            *take_args,
        ]
        return self._call("reserve", keys, args)

    def settle(
        self,
        *,
        holding: str,
        deliveries: str,
        dead: str,
        queue: str,
        seeds: str,
        progress: str,
        epoch_key: str,
        worker: str,
        queue_put_back: str,
        seeds_put_back: str,
        max_deliveries: int,
        epoch: str,
        outcomes: Iterable[tuple[str, str]],
    ) -> ScriptCall:
        """``lua/settle.lua``: settle ``(lease id, outcome)`` pairs (outcomes
        :data:`DONE`, :data:`HAND_BACK`, :data:`DEAD_NOW` + a record,
        :data:`DEAD_BECAUSE` + a reason, or a reason)."""
        keys = [holding, deliveries, dead, queue, seeds, progress, epoch_key]
        args: list[Arg] = [worker, queue_put_back, seeds_put_back, max_deliveries, epoch]
        for lease_id, outcome in outcomes:
            args += (lease_id, outcome)
        return self._call("settle", keys, args)

    def renew(
        self,
        *,
        holders: str,
        holding: str,
        epoch_key: str,
        worker: str,
        duration: float,
        epoch: str,
        lease_ids: Iterable[str],
    ) -> ScriptCall:
        """``lua/renew.lua``: extend the deadline of the worker's leases by
        ``duration``; the reply names those of ``lease_ids`` it no longer holds."""
        keys = [holders, holding, epoch_key]
        return self._call("renew", keys, [worker, duration, epoch, *lease_ids])

    def release(
        self,
        *,
        holding: str,
        deliveries: str,
        queue: str,
        seeds: str,
        epoch_key: str,
        dead: str,
        progress: str,
        queue_put_back: str,
        seeds_put_back: str,
        epoch: str,
        worker: str,
        known: Iterable[str],
    ) -> ScriptCall:
        """``lua/release.lua``: hand back the leases of ``holding`` other than ``known``
        (a record it cannot read, and a level set aside, go to ``dead``, counted in
        ``progress``)."""
        keys = [holding, deliveries, queue, seeds, epoch_key, dead, progress]
        args: list[Arg] = [queue_put_back, seeds_put_back, epoch, worker, *known]
        return self._call("release", keys, args)

    def progress(
        self,
        *,
        queue: str,
        seeds: str,
        holders: str,
        previous: str,
        progress: str,
        epoch_key: str,
        clear_keys: Iterable[str],
        queue_kind: str,
        seeds_kind: str,
        grace: float,
        clear: bool,
        keep_for: int,
        epoch: str,
        others: OtherShards | None = None,
    ) -> ScriptCall:
        """``lua/progress.lua``: where the crawl stands; mark it finished after
        ``grace`` seconds of emptiness, then (``clear``) delete ``clear_keys``.
        ``previous``: the previous version's leases zset (counted as leased);
        ``others``: what a sharded crawl's other shards hold and counted."""
        keys = [queue, seeds, holders, progress, epoch_key, previous, *clear_keys]
        args: list[Arg] = [queue_kind, seeds_kind, grace, int(clear), keep_for, epoch]
        if others is not None:
            args += [others.busy, others.done + others.dead, others.done, others.dead]
            args.append(others.retried)
        return self._call("progress", keys, args)

    def census(
        self,
        *,
        queue: str,
        holders: str,
        previous: str,
        progress: str,
        epoch_key: str,
        queue_kind: str,
        epoch: str,
    ) -> ScriptCall:
        """``lua/census.lua``: ``(queued, leased, done, dead, retried)`` of one shard, fenced
        (``previous``: the previous version's leases zset, counted as leased)."""
        keys = [queue, holders, progress, epoch_key, previous]
        return self._call("census", keys, [queue_kind, epoch])

    def leased(self, *, holders: str, previous: str) -> ScriptCall:
        """``lua/leased.lua``: the number of leases held (``previous``: the previous
        version's leases zset, counted too)."""
        return self._call("leased", [holders, previous], [])

    def queued(self, *, queue: str, queue_kind: str) -> ScriptCall:
        """``lua/queued.lua``: the number of entries of ``queue`` (every level's)."""
        return self._call("queued", [queue], [queue_kind])

    def pop(self, *, queue: str, count: int, take_args: Sequence[Arg] = ()) -> ScriptCall:
        """``lua/pop.lua``: pop up to ``count`` entries of priority queue ``queue``, or
        of a queue per slot when ``take_args`` (``SlotQueue.take_args``) are given."""
        return self._call("pop", [queue], [count, *take_args])

    def migrate(self, *, queue: str, count: int) -> ScriptCall:
        """``lua/migrate.lua``: move up to ``count`` entries of a previous version's
        zset at ``queue`` into levels; returns ``[moved, left]``."""
        return self._call("migrate", [queue], [count])

    def to_slots(
        self, *, queue: str, level: str, entries: Sequence[tuple[bytes, str]]
    ) -> ScriptCall:
        """``lua/to_slots.lua``: move these oldest entries of level ``level`` of the
        priority queue at ``queue`` to their slots (``(entry, "<score>@<slot>")``);
        returns ``[moved (-1: they are not the oldest any more), levels left]``."""
        args: list[Arg] = [level]
        for entry, score in entries:
            args += (entry, score)
        return self._call("to_slots", [queue], args)

    def slot_leases(
        self, *, holding: str, records: Sequence[tuple[bytes, bytes, bytes]]
    ) -> ScriptCall:
        """``lua/slot_leases.lua``: rewrite these lease records of ``holding`` (lease id,
        record as read, record with its slot) where they are still as read; returns
        how many."""
        args: list[Arg] = []
        for lease_id, old, new in records:
            args += (lease_id, old, new)
        return self._call("slot_leases", [holding], args)

    # -- the worker registry (lua/join, heartbeat, leave) --------------------------------

    def join(
        self,
        *,
        workers: str,
        progress: str,
        starts: str,
        flush_keys: Iterable[str],
        worker: str,
        timeout: float,
        flush: bool,
        age: float,
    ) -> ScriptCall:
        """``lua/join.lua``: register ``worker``; with ``flush``, delete ``flush_keys``
        if no other worker is alive; delete ``starts`` when this worker starts a new run
        or no other worker is alive."""
        keys = [workers, progress, starts, *flush_keys]
        return self._call("join", keys, [worker, timeout, int(flush), age])

    def heartbeat(
        self,
        *,
        workers: str,
        worker: str,
        history: HistoryKeys | None = None,
        figures: tuple[int, int, int] = (0, 0, 0),
    ) -> ScriptCall:
        """``lua/heartbeat.lua``: stamp ``worker`` alive with the server's clock; with
        ``history``, also record the worker's ``figures`` (pages, items, buffered) and
        sample the crawl's history when a sample is due."""
        if history is None:
            return self._call("heartbeat", [workers], [worker])
        h = history
        keys = [workers, h.figures, h.history, h.stats, h.progress, h.queue, h.holders]
        keys += [h.previous, h.dead]
        args: list[Arg] = [worker, " ".join(str(int(n)) for n in figures), h.queue_kind]
        args += [h.step, h.size]
        return self._call("heartbeat", keys, args)

    def leave(
        self, *, workers: str, worker: str, timeout: float, figures: str | None = None
    ) -> ScriptCall:
        """``lua/leave.lua``: unregister ``worker``, pruning stale workers (and their
        ``figures``, if given)."""
        keys = [workers] if figures is None else [workers, figures]
        return self._call("leave", keys, [worker, timeout])

    # -- the dupefilter and stats (lua/dupefilter, stats) --------------------------------

    def dupefilter(
        self,
        *,
        filter_keys: Sequence[str],
        op: str,
        filter_kind: str,
        filter_args: Sequence[Arg],
        tokens: Iterable[bytes],
    ) -> ScriptCall:
        """``lua/dupefilter.lua``: ``op`` ``"add"`` or ``"check"`` these tokens."""
        args: list[Arg] = [op, filter_kind, len(filter_args), *filter_args, *tokens]
        return self._call("dupefilter", filter_keys, args)

    def dupefilter_prepare(
        self, *, chain: str, segment: str, bits: int, expire_at: int | None = None
    ) -> ScriptCall:
        """``lua/dupefilter.lua`` ``"prepare"``: create a Bloom segment at full size
        (expiring at server time ``expire_at`` ms if given, a windowed generation's)."""
        args: list[Arg] = ["prepare", bits]
        if expire_at is not None:
            args.append(expire_at)
        return self._call("dupefilter", [chain, segment], args)

    def stats(
        self,
        *,
        stats: str,
        timeline: str,
        pages_stat: str,
        items_stat: str,
        window: int,
        ops: Iterable[Sequence[Arg]],
    ) -> ScriptCall:
        """``lua/stats.lua``: apply a batch of stats operations (4 arguments each)."""
        args: list[Arg] = [pages_stat, items_stat, window]
        for op in ops:
            args += op
        return self._call("stats", [stats, timeline], args)

    # -- the items stream (lua/item_stream) -----------------------------------------------

    def item_stream_dead(
        self,
        *,
        stream: str,
        dead: str,
        group: str,
        entry_id: str,
        reason: str,
        consumer: str,
        max_deliveries: int = 0,
    ) -> ScriptCall:
        """``lua/item_stream.lua`` ``"dead"`` (``max_deliveries`` 0) or ``"reject"``:
        move a pending entry to the dead stream and acknowledge it, in one step."""
        op = "reject" if max_deliveries else "dead"
        args: list[Arg] = [op, group, entry_id, reason, consumer, max_deliveries]
        return self._call("item_stream", [stream, dead], args)

    def item_stream_requeue(
        self, *, stream: str, dead: str, dead_id: str, maxlen: int = 0
    ) -> ScriptCall:
        """``lua/item_stream.lua`` ``"requeue"``: a dead entry back to the stream."""
        return self._call("item_stream", [stream, dead], ["requeue", dead_id, maxlen])

    # -- cluster-wide politeness (lua/politeness) ---------------------------------------

    def politeness(
        self,
        *,
        tokens: str,
        busy: str,
        next_send: str,
        pauses: str,
        refused: str,
        prefix: str,
        timeout_ms: int,
        recover_ms: int,
        idle_ms: int,
        lookahead_ms: int,
        mark_ms: int,
        confirms: Iterable[tuple[str, float, float]] = (),
        releases: Sequence[str] = (),
        turns: Sequence[str] = (),
        waiting: Sequence[str] = (),
        holding: Sequence[str] = (),
        asks: Iterable[tuple[str, int, int, float]] = (),
    ) -> ScriptCall:
        """``lua/politeness.lua``: confirm, release and renew download tokens, then grant
        more. ``confirms`` holds ``(token, ms since it was sent, the slot's delay in ms)``
        per turn sent;
        ``turns``, ``waiting`` and ``holding`` the tokens held (turns in the engine not
        sent yet, granted and not used, sent); ``asks`` holds ``(slot, requests waiting,
        concurrency, delay in ms)`` per slot; a slot paused in ``pauses`` is granted
        nothing before its pause ends; ``refused`` marks for ``mark_ms`` a slot without
        delay refused to a worker holding less than half its concurrency, and the other
        workers are granted only what leaves that worker its share meanwhile."""
        confirmed = list(confirms)
        args: list[Arg] = [prefix, timeout_ms, recover_ms, idle_ms, lookahead_ms, mark_ms]
        args.append(len(confirmed))
        for member, ago_ms, delay_ms in confirmed:
            args += (member, ago_ms, delay_ms)
        for members in (releases, turns, waiting, holding):
            args += [len(members), *members]
        for slot, want, concurrency, delay_ms in asks:
            args += (slot, want, concurrency, delay_ms)
        return self._call("politeness", [tokens, busy, next_send, pauses, refused], args)

    # -- slot pauses (lua/slot_pauses) -------------------------------------------------

    def slot_pauses(
        self, *, pauses: str, longest_ms: int, add: Iterable[tuple[str, int]] = ()
    ) -> ScriptCall:
        """``lua/slot_pauses.lua``: pause slots (``add``: ``(slot, ms)``), at most
        ``longest_ms`` each, and read the pauses in force."""
        args: list[Arg] = [longest_ms]
        for slot, ms in add:
            args += (slot, ms)
        return self._call("slot_pauses", [pauses], args)


def scripts_for(client: redis.Redis) -> Scripts:
    """Return the scripts registered on ``client``, registering them on first use (no I/O)."""
    try:
        return _registered[client]
    except KeyError:
        scripts = _registered[client] = Scripts(client)
        return scripts
