"""How many requests one reserve leases: sized by the engine's demand.

A worker leases at least ``SCHEDULER_PREFETCH`` requests per reserve (the *floor*) and
at most ``SCHEDULER_PREFETCH_MAX`` (the *ceiling*). Between the two, a reserve leases
what the engine takes in :data:`AHEAD` seconds at the rate it took requests over the
last :data:`WINDOW`: a fast crawl makes fewer, larger script calls (each call's fixed
cost in Redis is paid once per batch), a crawl held back by download delays, the start
horizon or a slow site stays at the floor, and leases no more than it can start soon.

A floor of 1 never grows: such a worker leases one request when Scrapy asks for one,
never ahead, so that requests come in Scrapy's own order.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["AHEAD", "WINDOW", "BatchSize"]

#: Seconds of the engine's current demand one reserve leases.
AHEAD = 0.5
#: Seconds over which the engine's demand is measured.
WINDOW = 1.0


class BatchSize:
    """The size of the next reserve, between ``floor`` and ``ceiling`` (see the module
    docstring).

    Args:
        floor: requests leased per reserve at least (``SCHEDULER_PREFETCH``).
        ceiling: requests leased per reserve at most (``SCHEDULER_PREFETCH_MAX``);
            raised to ``floor`` when lower; ignored when ``floor`` is 1.
        clock: monotonic seconds (tests give their own).
    """

    def __init__(
        self, floor: int, ceiling: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.floor = floor
        self.ceiling = floor if floor <= 1 else max(ceiling, floor)
        self._clock = clock
        #: Requests the engine took since :attr:`_since`.
        self._taken = 0
        self._since = clock()
        #: The size measured at the end of the last whole window.
        self._size = floor

    def took(self, count: int = 1) -> None:
        """The engine took ``count`` requests from the buffer."""
        self._taken += count

    def __call__(self) -> int:
        """Requests the next reserve leases (at most: the worker's room bounds it)."""
        if self.ceiling == self.floor:
            return self.floor
        now = self._clock()
        elapsed = now - self._since
        if elapsed >= WINDOW:
            rate = self._taken / elapsed
            self._size = min(self.ceiling, max(self.floor, math.ceil(rate * AHEAD)))
            self._taken, self._since = 0, now
        return self._size
