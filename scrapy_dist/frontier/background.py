"""The worker's Redis I/O thread: flushes sent off the reactor thread.

The scheduler's timer sends its flush (enqueues, settlements, a top-up reserve, the
reads riding it) through :class:`IOThread` when ``SCHEDULER_BACKGROUND_FLUSH`` is on, so
that Scrapy's reactor keeps running the engine while the round trip is under way. The
thread only runs the pipeline (:meth:`scrapy_dist.frontier.outbox.Outbox.send`); everything
before it (building the batch) and after it (applying the reply: faults, refusals,
fencing, taken-over leases) runs on the reactor thread, through the code a synchronous
flush runs (:class:`scrapy_dist.frontier.trip.Trip`). At most one flush is in flight.

The thread is a daemon: a process that stops with a flush in flight loses nothing that
a crash would not (its leases expire and return to the queue; its unconfirmed
enqueues were never acknowledged for their parents).
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)


class IOThread:
    """One daemon thread that runs submitted calls in order, started on first use.

    Args:
        name: the thread's name (shown in thread dumps).
    """

    def __init__(self, name: str = "scrapy-dist-io") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, func: Callable[[], Any]) -> Future[Any]:
        """Run ``func`` on the thread after the calls submitted before it.

        Returns:
            A future with ``func``'s result or exception (callbacks added to it run on
            the I/O thread).
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._jobs.put((func, future))
        return future

    def stop(self) -> None:
        """End the thread once the calls submitted so far ran (a later :meth:`submit`
        starts a new one)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                self._jobs.put(None)
            self._thread = None

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            func, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = func()
            except BaseException as e:  # handed to whoever waits for it
                future.set_exception(e)
            else:
                future.set_result(result)


def call_from_thread(func: Callable[[], None]) -> None:
    """Run ``func`` on the reactor thread (from any thread); dropped if the reactor
    stopped meanwhile."""
    from twisted.internet import reactor

    reactor.callFromThread(func)


def reactor_running() -> bool:
    """Whether the installed reactor runs (a flush may then land on it later)."""
    import sys

    if "twisted.internet.reactor" not in sys.modules:
        return False
    from twisted.internet import reactor

    return bool(getattr(reactor, "running", False))
