"""What a crawl's frontier tells the rest of the worker, and the reads its flushes carry.

One :class:`FrontierEvents` per frontier, made before it and handed at construction to
the frontier and to the parts of it that report something (its round trip,
:mod:`scrapy_dist.frontier.trip`; its replication,
:mod:`scrapy_dist.frontier.replication`). The worker's parts subscribe once, when they
are built; the frontier never learns who listens, and nothing of it is changed from
outside. A sharded crawl's shard 0 shares the crawl's events; the other shards have
their own, which the sharded frontier listens to (:mod:`scrapy_dist.frontier.shards`).

The events:

- **crawl lost** (``state``: ``finished``, ``vanished`` or ``replaced``): the crawl's
  epoch is gone; the worker drops what it holds (:mod:`scrapy_dist.worker.membership`);
- **leases taken** (their ids): Redis refused the children of these leases, which
  another worker now holds;
- **master changed**: the Redis master is another (a failover or a restart): what
  assumes the server's state is dropped (the dupefilter's seen-cache);
- **flush landed**: a flush sent by the I/O thread was applied, on the reactor thread
  (the scheduler wakes an engine it left waiting);
- **reads carried**: each flush asks for the reads due now
  (:class:`Read`, such as the crawl control state) and
  carries them in its pipeline, after its writes.

Listeners run in the order they subscribed, on the emitter's thread; an exception
propagates to the emitter, as a direct call's would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_dist.frontier.outbox import Command

__all__ = ["FrontierEvents", "Read"]


class Read(NamedTuple):
    """A plain read another part of the worker has carried by the next flush's pipeline
    (see :meth:`FrontierEvents.carry`): ``on_reply`` gets its reply, or the exception it
    answered with; it is not called when the flush is not sent or fails as a whole."""

    command: Command
    on_reply: Callable[[Any], None]


class FrontierEvents:
    """The events of one frontier and the reads its flushes carry (see the module
    docstring)."""

    def __init__(self) -> None:
        self._lost: list[Callable[[str], None]] = []
        self._taken: list[Callable[[set[str]], None]] = []
        self._changed: list[Callable[[], None]] = []
        self._landed: list[Callable[[], None]] = []
        self._riders: list[Callable[[], Read | None]] = []

    # -- subscribing (the worker's parts, as they are built) ------------------------

    def on_crawl_lost(self, listener: Callable[[str], None]) -> None:
        """Call ``listener`` with the state when the crawl is found gone."""
        self._lost.append(listener)

    def on_leases_taken(self, listener: Callable[[set[str]], None]) -> None:
        """Call ``listener`` with the ids of leases found taken over (children refused)."""
        self._taken.append(listener)

    def on_master_changed(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the Redis master was found to be another."""
        self._changed.append(listener)

    def on_flush_landed(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` once a flush sent by the I/O thread was applied."""
        self._landed.append(listener)

    def carry(self, rider: Callable[[], Read | None]) -> None:
        """Ask ``rider`` at each flush for a read to carry (``None``: nothing due)."""
        self._riders.append(rider)

    # -- emitting (the frontier and its parts) --------------------------------------

    def crawl_lost(self, state: str) -> None:
        for listener in list(self._lost):
            listener(state)

    def leases_taken(self, ids: set[str]) -> None:
        for listener in list(self._taken):
            listener(ids)

    def master_changed(self) -> None:
        for listener in list(self._changed):
            listener()

    def flush_landed(self) -> None:
        for listener in list(self._landed):
            listener()

    def reads(self) -> list[Read]:
        """The reads due now, one per rider that has one."""
        return [read for read in (rider() for rider in self._riders) if read is not None]
