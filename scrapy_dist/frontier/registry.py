"""The registry of a crawl's live workers.

Each worker writes a heartbeat (the Redis server's clock, so machines with skewed
clocks agree) into ``<crawl>:workers``. A worker whose heartbeat is older than the
timeout counts as gone and is pruned by the next join or leave. Joining may flush the
crawl's frontier, atomically with the count of the other live workers, so one worker
never wipes state other workers still use; leaving never deletes anything (a finished
crawl does, see :mod:`scrapy_dist.frontier.core`).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, cast

from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import redis

    from scrapy_dist.scripts import HistoryKeys


#: When this process started loading scrapy_dist (monotonic seconds).
STARTED = time.monotonic()
_process_start_taken = False


def crawl_started() -> float:
    """When this worker's crawl started (monotonic seconds): the process start for the
    first crawl of a process (a worker launched before a crawl finished belongs to that
    crawl's run even if it joins after), now for any later crawl of the same process
    (a script that runs a spider again)."""
    global _process_start_taken  # noqa: PLW0603 - one process start, claimed once
    if _process_start_taken:
        return time.monotonic()
    _process_start_taken = True
    return STARTED


def new_worker_id() -> str:
    """Return a unique, readable worker id: ``<host>:<pid>:<random>``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def live_workers(client: redis.Redis, key: str, timeout: float) -> list[str]:
    """The workers registered in ``key`` with a heartbeat within ``timeout`` seconds of
    the server's clock (:func:`heartbeats`). One round trip."""
    now, beats = heartbeats(client, key)
    return sorted(w for w, beat in beats.items() if now - timeout <= beat)


def heartbeats(client: redis.Redis, key: str) -> tuple[float, dict[str, float]]:
    """The server's time and each worker registered in ``key`` with its last heartbeat
    (none if the key is not a hash; a heartbeat that is not a finite number, written by
    hand, is left out: a gone worker's, as in ``lua/join.lua``). One round trip."""
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.hgetall(key)
        (seconds, micros), workers = pipe.execute(raise_on_error=False)
    now = seconds + micros / 1e6
    return now, {} if isinstance(workers, Exception) else beats_of(workers)


def beats_of(raw: Mapping[bytes, bytes]) -> dict[str, float]:
    """A registry hash's workers and their heartbeats, as read (a heartbeat that is not a
    finite number, written by hand, left out; a name that is not UTF-8 read with
    replacement characters)."""
    found = {}
    for worker, beat in raw.items():
        try:
            value = float(beat)
        except ValueError:
            continue
        if math.isfinite(value):
            found[worker.decode(errors="replace")] = value
    return found


def previous_version_running(running: list[str], then: str) -> str:
    """The end of the message refusing to start beside workers of a previous version:
    the ``running`` workers named (five at most), what to do, and ``then``, what this
    worker does once started."""
    shown = ", ".join(running[:5]) + (" ..." if len(running) > 5 else "")
    return (
        f"{len(running)} worker(s) of the crawl are running ({shown}): stop every worker "
        f"of the previous version, then start this one ({then}). A worker killed without "
        "stopping counts as running for SCHEDULER_WORKER_TIMEOUT seconds after its last "
        "heartbeat"
    )


class WorkerRegistry:
    """Join, heartbeat and leave one crawl's worker registry.

    Args:
        client: the crawl's Redis client.
        key: the registry hash key.
        worker_id: this worker's id.
        timeout: seconds without heartbeat after which a worker counts as gone.
        frontier: keys a flush deletes (queue, dupefilter, sequence...).
        progress: the crawl's progress hash (a new run clears its completion marks).
        starts: the set of start requests queued in this run (cleared by a join that
            starts a new run or finds no other worker alive).
        started: when this worker's crawl started (monotonic seconds); default: now.
        history: sample the crawl's history with each heartbeat (``None``: do not).
    """

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        worker_id: str,
        *,
        timeout: float,
        frontier: Sequence[str],
        progress: str,
        starts: str,
        started: float | None = None,
        history: HistoryKeys | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self.worker_id = worker_id
        self.timeout = timeout
        self.frontier = list(frontier)
        self.progress = progress
        self.starts = starts
        self.started = time.monotonic() if started is None else started
        self.history = history
        self._scripts = scripts_for(client)

    def join(self, *, flush: bool = False) -> tuple[int, bool]:
        """Register this worker; with ``flush``, delete the frontier if no other
        worker is alive. A worker started after the crawl finished starts a new run,
        judged complete on its own work; a new run, or a join with no other worker
        alive, forgets which start requests were queued (``lua/join.lua``).

        Returns:
            ``(other live workers, whether the frontier was flushed)``.
        """
        others, flushed, _ = cast(
            "list[int]",
            self._scripts.join(
                workers=self.key,
                progress=self.progress,
                starts=self.starts,
                flush_keys=self.frontier,
                worker=self.worker_id,
                timeout=self.timeout,
                flush=flush,
                age=time.monotonic() - self.started,
            ).run(),
        )
        return int(others), bool(flushed)

    def heartbeat(self, figures: tuple[int, int, int] = (0, 0, 0)) -> None:
        """Tell the others this worker is alive; with :attr:`history`, also record its
        ``figures`` (pages, items, requests buffered) and sample the crawl's history
        when due (in the same script call)."""
        self._scripts.heartbeat(
            workers=self.key, worker=self.worker_id, history=self.history, figures=figures
        ).run()

    def leave(self) -> tuple[int, int]:
        """Unregister this worker, and its figures with it (shared state stays; see
        ``lua/leave.lua``).

        Returns:
            The number of live workers remaining, and of those found gone (no heartbeat
            within the timeout: killed, or paused) and pruned.
        """
        figures = self.history.figures if self.history is not None else None
        call = self._scripts.leave(
            workers=self.key, worker=self.worker_id, timeout=self.timeout, figures=figures
        )
        live, gone = cast("list[int]", call.run())
        return int(live), int(gone)

    def alive(self) -> list[str]:
        """The registered workers with a heartbeat within the timeout (:func:`live_workers`)."""
        return live_workers(self.client, self.key, self.timeout)

    def live(self) -> dict[str, float]:
        """Every registered worker and its last heartbeat (server time, seconds)."""
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.key))
        return {k.decode(): float(v) for k, v in raw.items()}
