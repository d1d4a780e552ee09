"""The recrawl window (``DUPEFILTER_RECRAWL_AFTER``): how long a fingerprint counts as
seen, and the generations the Bloom backends and ``"buckets"`` rotate.

The exact ``"set"`` backend keeps each fingerprint's time (a zset, see
:class:`~scrapy_dist.filters.exact.WindowSetBackend`): seen for exactly the window. The
others record a fingerprint in the current *generation* (:data:`GENERATIONS` per
window, each ``window / GENERATIONS`` long) and test it in every generation still
alive; a generation's keys expire when it leaves the window, so memory holds one
window's fingerprints. A fingerprint recorded at ``t`` is then seen until the end of
its generation's life: for more than ``window - generation`` (7/8 of the window) and
at most ``window``, never longer. All times are the Redis server's (``TIME`` inside
the scripts, ``PEXPIREAT`` for the keys), never a worker's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Generations per window for the Bloom backends and ``"buckets"``.
GENERATIONS = 8


@dataclass(frozen=True)
class RecrawlWindow:
    """``DUPEFILTER_RECRAWL_AFTER`` as the scripts use it.

    Attributes:
        seconds: how long a fingerprint counts as seen (at most).
    """

    seconds: float

    @property
    def ms(self) -> int:
        """The window in whole milliseconds."""
        return max(1, round(self.seconds * 1000))

    @property
    def generation_ms(self) -> int:
        """Length of one generation in milliseconds."""
        return max(1, self.ms // GENERATIONS)

    @property
    def exact_seen_for(self) -> float:
        """Seconds a record is seen for certain with the exact window."""
        return self.ms / 1000

    @property
    def rotating_seen_for(self) -> float:
        """Seconds a record is seen for certain with rotating generations (more than
        this, at most :attr:`seconds`)."""
        return (self.ms - self.generation_ms) / 1000

    def script_args(self) -> list[str | int | float]:
        """The window and generation length, in ms (appended to a backend's arguments)."""
        return [self.ms, self.generation_ms]

    def generations(self, now_ms: int) -> range:
        """The generations alive at server time ``now_ms`` (as the scripts compute them)."""
        gen = self.generation_ms
        return range((now_ms - self.ms) // gen + 1, now_ms // gen + 1)

    def expires_at(self, generation: int) -> int:
        """Server time (ms) at which ``generation`` leaves the window and its keys expire."""
        return generation * self.generation_ms + self.ms

    def describe(self) -> str:
        """The window for the signature and messages: ``window=<ms>/<generation ms>``."""
        return f"window={self.ms}/{self.generation_ms}"


def window_of(seconds: float | None) -> RecrawlWindow | None:
    """The window of ``DUPEFILTER_RECRAWL_AFTER`` (``None``: seen forever)."""
    return None if seconds is None else RecrawlWindow(seconds)


def server_ms(now: tuple[int, int] | list[int] | object) -> int:
    """A ``TIME`` reply (seconds, microseconds) in milliseconds."""
    sec, usec = now  # type: ignore[misc]
    return int(sec) * 1000 + int(usec) // 1000


def split_window_signature(sig: str) -> tuple[str, RecrawlWindow | None]:
    """A stored bitmap signature without its window part, and the window (``None``
    if it has none, or one this version would not write)."""
    base, sep, part = sig.rpartition(" window=")
    if not sep:
        return sig, None
    ms, _, gen = part.partition("/")
    if not (ms.isdigit() and gen.isdigit()):
        return sig, None
    window = RecrawlWindow(int(ms) / 1000)
    return (base, window) if window.describe() == f"window={part}" else (sig, None)
