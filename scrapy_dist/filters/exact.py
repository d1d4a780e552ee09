"""The exact backend (``DUPEFILTER_BACKEND = "set"``): raw digests in a Redis set, or,
with a recrawl window (``DUPEFILTER_RECRAWL_AFTER``), in a zset scored by the time
each was recorded (:class:`WindowSetBackend`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters.base import (
    FilterState,
    ScriptedBackend,
    copy_set,
    expires_in,
    ttl_ms,
    wrong_type,
)
from scrapy_dist.filters.window import server_ms
from scrapy_dist.keys import key_type

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

    from scrapy_dist.filters.window import RecrawlWindow


def exact_state(key: str, count: int, pttl: int, recrawl_after: float | None = None) -> FilterState:
    """The state of an exact ``set`` dupefilter (a set, or a zset with a recrawl window)
    from its size and ``PTTL``."""
    return FilterState(
        backend="set",
        key=key,
        count=int(count),
        capacity=None,
        design_capacity=None,
        error_rate=0.0,
        fpr_estimate=0.0,
        stages=1,
        expires_in=expires_in(pttl),
        exists=int(pttl) != -2,
        recrawl_after=recrawl_after,
    )


class SetBackend(ScriptedBackend):
    """Exact fingerprint storage: a Redis set of raw digests (about 70 bytes each).

    Args:
        client: the crawl's Redis client.
        key: the set's key (``SCHEDULER_DUPEFILTER_KEY``, scrapy-redis's name).
        ttl: seconds after which the set expires (see ``DUPEFILTER_TTL``); ``None``
            for never.
    """

    kind: ClassVar[str] = "set"

    def __init__(self, client: redis.Redis, key: str, *, ttl: float | None = None) -> None:
        self.client = client
        self.key = key
        self.ttl = ttl

    #: Seconds a record surely counts as seen: forever.
    seen_for: ClassVar[float | None] = None

    def script_keys(self) -> list[str]:
        """Keys the enqueue script's dedupe step touches."""
        return [self.key]

    def script_args(self) -> list[str | int | float]:
        """The expiry in milliseconds when there is one, else nothing."""
        return [ttl_ms(self.ttl)] if self.ttl is not None else []

    def token(self, fingerprint: bytes) -> bytes:
        """The set stores the raw fingerprint."""
        return fingerprint

    def keys(self) -> list[str]:
        """Every key this backend owns."""
        return [self.key]

    def open(self) -> SetBackend:
        """Check that the key holds a set, if anything.

        Raises:
            ConfigurationError: the key holds another type (e.g. a Bloom filter).
        """
        actual = key_type(self.client, self.key)
        if actual == "hash" and self.client.hexists(self.key, "gen"):
            actual = "buckets"
        if actual == "zset":
            raise ConfigurationError(
                f"Redis key {self.key!r} holds an exact dupefilter with a recrawl window "
                "(DUPEFILTER_RECRAWL_AFTER), but these settings have none: set "
                "DUPEFILTER_RECRAWL_AFTER again, or delete the crawl's dupefilter key (its "
                "pages are then crawled again)"
            )
        if actual not in ("none", "set"):
            raise wrong_type(self.key, actual, "the set")
        return self

    def add(self, fingerprint: bytes) -> bool:
        """Record ``fingerprint``; return ``True`` if it was not recorded before."""
        if self.ttl is None:
            return bool(self.client.sadd(self.key, fingerprint))
        return self._run("add", [fingerprint])[0]

    def __contains__(self, fingerprint: bytes) -> bool:
        # redis-py annotates members as str; any bytes-like value is sent as is.
        return bool(self.client.sismember(self.key, fingerprint))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return int(self.client.scard(self.key))

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Forget every fingerprint."""
        (pipe or self.client).delete(self.key)

    def state(self) -> FilterState:
        """The set's size and expiry."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.scard(self.key)
            pipe.pttl(self.key)
            count, pttl = pipe.execute()
        return exact_state(self.key, count, pttl)


class WindowSetBackend(ScriptedBackend):
    """Exact fingerprint storage with a recrawl window: a zset of raw digest -> server
    time recorded (ms). A fingerprint is seen for exactly the window after it was
    recorded, then new again (a new record resets its time; a duplicate does not).

    Memory: every recording call deletes the expired entries, oldest first, up to
    twice as many as it may add, and gives the key an expiry of one window, so the
    zset holds about one window's fingerprints (about 110 bytes each, see
    docs/dupefilters.md). The window may change between runs: times are stored, not
    windows.

    Args:
        client: the crawl's Redis client.
        key: the zset's key (``SCHEDULER_DUPEFILTER_KEY``).
        window: the recrawl window.
    """

    kind: ClassVar[str] = "zset"

    def __init__(self, client: redis.Redis, key: str, *, window: RecrawlWindow) -> None:
        self.client = client
        self.key = key
        self.window = window
        self.ttl = None

    @property
    def seen_for(self) -> float:
        """Seconds a record surely counts as seen."""
        return self.window.exact_seen_for

    def script_keys(self) -> list[str]:
        """The zset."""
        return [self.key]

    def script_args(self) -> list[str | int | float]:
        """No expiry (``0``), then the window in ms."""
        return [0, self.window.ms]

    def token(self, fingerprint: bytes) -> bytes:
        """The zset stores the raw fingerprint."""
        return fingerprint

    def keys(self) -> list[str]:
        """Every key this backend owns."""
        return [self.key]

    def open(self) -> WindowSetBackend:
        """Check that the key holds a zset, if anything.

        Raises:
            ConfigurationError: the key holds a set (the crawl ran without a window:
                see docs/dupefilters.md to migrate) or another type.
        """
        actual = key_type(self.client, self.key)
        if actual == "set":
            raise ConfigurationError(
                f"Redis key {self.key!r} holds an exact dupefilter without a recrawl "
                "window, but DUPEFILTER_RECRAWL_AFTER is set: migrate it once with "
                "scrapy_dist.filters.migrate_to_window (every fingerprint then counts as "
                "seen for one window from now), or unset DUPEFILTER_RECRAWL_AFTER, or "
                "delete the key (its pages are then crawled again)"
            )
        if actual == "hash" and self.client.hexists(self.key, "gen"):
            actual = "buckets"
        if actual not in ("none", "zset"):
            raise wrong_type(self.key, actual, "the set")
        return self

    def _cutoff(self) -> int:
        return server_ms(self.client.time()) - self.window.ms

    def __len__(self) -> int:
        """Fingerprints seen now (one window's)."""
        return int(self.client.zcount(self.key, f"({self._cutoff()}", "+inf"))

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Forget every fingerprint."""
        (pipe or self.client).delete(self.key)

    def state(self) -> FilterState:
        """Fingerprints seen now, and the key's expiry."""
        cutoff = self._cutoff()
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zcount(self.key, f"({cutoff}", "+inf")
            pipe.pttl(self.key)
            count, pttl = pipe.execute()
        return exact_state(self.key, count, pttl, self.window.seconds)


def migrate_to_window(
    client: redis.Redis, set_key: str, backend: WindowSetBackend, batch: int = 1000
) -> int:
    """Copy the fingerprints of a window-less ``set`` dupefilter at ``set_key`` into
    ``backend`` (``SSCAN``, then ``add_many`` per batch; nothing is deleted): each then
    counts as seen for one window from now. Run it with the crawl stopped, the set
    renamed away from the dupefilter key first (see docs/dupefilters.md).

    Returns:
        The number of fingerprints that were new to ``backend``.
    """
    return copy_set(client, set_key, backend, batch)


def window_set_state(client: redis.Redis, key: str) -> FilterState:
    """The state of a windowed exact filter read without its window (``scrapy-dist
    status`` without ``DUPEFILTER_RECRAWL_AFTER``): ``count`` is every entry held,
    expired ones not yet deleted included."""
    with client.pipeline(transaction=False) as pipe:
        pipe.zcard(key)
        pipe.pttl(key)
        count, pttl = pipe.execute()
    return exact_state(key, count, pttl)
