"""The exact backend (``DUPEFILTER_BACKEND = "set"``): raw digests in a Redis set."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from scrapy_dist.filters.base import (
    FilterState,
    ScriptedBackend,
    expires_in,
    ttl_ms,
    wrong_type,
)
from scrapy_dist.keys import key_type

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline


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
        return FilterState(
            backend="set",
            key=self.key,
            count=int(count),
            capacity=None,
            design_capacity=None,
            error_rate=0.0,
            fpr_estimate=0.0,
            stages=1,
            expires_in=expires_in(pttl),
            exists=int(pttl) != -2,
        )
