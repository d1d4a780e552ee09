"""The RedisBloom backend (``DUPEFILTER_BACKEND = "redisbloom"``): the server's own
``BF.*`` filter (Redis 8+, Redis Stack, valkey-bloom)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, cast

import redis

from scrapy_dist.bloom import GROWTH, bloom_chain, chain_false_positive_rate
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters.base import (
    REDISBLOOM_TYPES,
    FilterState,
    ScriptedBackend,
    command,
    expires_in,
    text,
    ttl_ms,
    wrong_type,
)
from scrapy_dist.keys import key_type
from scrapy_dist.settings import check_on_full

if TYPE_CHECKING:
    from redis.client import Pipeline

    from scrapy_dist.bloom import BloomParams

logger = logging.getLogger(__name__)


def _info(value: object) -> dict[str, Any]:
    """``BF.INFO``'s answer as a dict, whether redis-py parsed it or not."""
    if isinstance(value, dict):
        return {text(k): v for k, v in value.items()}
    items = list(cast("list[Any]", value))
    return {text(k): v for k, v in zip(items[::2], items[1::2], strict=True)}


def _no_module(error: redis.ResponseError) -> bool:
    """Whether an error says the server has no such command (or may not run it)."""
    text = str(error).lower()
    return (
        isinstance(error, redis.exceptions.NoPermissionError)
        or "unknown command" in text
        or "noperm" in text
    )


class RedisBloomBackend(ScriptedBackend):
    """RedisBloom's ``BF.*`` filter (Redis 8+, Redis Stack, valkey-bloom).

    :meth:`open` reserves the filter with the configured capacity and error rate
    (``BF.RESERVE``, ``EXPANSION 2`` to grow or ``NONSCALING`` to refuse); records use
    ``BF.INSERT`` with the same parameters, so a filter that expired or was deleted
    mid-crawl is re-created as configured, never with the module's defaults. The
    module grows by itself: each new sub-filter has twice the capacity at half the
    error rate.

    Args:
        client: the crawl's Redis client.
        key: the filter's key (the dupefilter key).
        params: its capacity and error rate (``bits`` and ``hashes`` are the module's
            business).
        ttl: seconds after which the filter expires; ``None`` for never.
        on_full: ``"grow"`` or ``"refuse"``.

    Raises:
        ConfigurationError: ``on_full`` is not one of
            :data:`scrapy_dist.settings.ON_FULL`.
    """

    kind: ClassVar[str] = "bf"

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        params: BloomParams,
        *,
        ttl: float | None = None,
        on_full: str = "grow",
    ) -> None:
        check_on_full(on_full)
        self.client = client
        self.key = key
        self.params = params
        self.ttl = ttl
        self.on_full = on_full
        self.stages = bloom_chain(params, most=64)

    def script_keys(self) -> list[str]:
        """The filter's key."""
        return [self.key]

    def script_args(self) -> list[str | int | float]:
        """Expiry, capacity, error rate and full policy."""
        return [
            ttl_ms(self.ttl),
            self.params.capacity,
            repr(self.params.error_rate),
            self.on_full,
        ]

    def token(self, fingerprint: bytes) -> bytes:
        """RedisBloom hashes the raw fingerprint itself."""
        return fingerprint

    def keys(self) -> list[str]:
        """The filter's key."""
        return [self.key]

    def open(self) -> RedisBloomBackend:
        """Reserve the filter if it does not exist; warn if an existing one differs.

        Raises:
            ConfigurationError: the server has no RedisBloom, or the key holds something
                else.
        """
        actual = key_type(self.client, self.key)
        if actual == "none":
            option = ["NONSCALING"] if self.on_full == "refuse" else ["EXPANSION", GROWTH]
            try:
                command(
                    self.client,
                    "BF.RESERVE",
                    self.key,
                    repr(self.params.error_rate),
                    self.params.capacity,
                    *option,
                )
            except redis.ResponseError as e:
                if _no_module(e):
                    raise ConfigurationError(
                        "DUPEFILTER_BACKEND = 'redisbloom' but the server has no BF.* "
                        "commands: use Redis 8+, Redis Stack or valkey-bloom, or 'bloom' to "
                        "fall back to the bitmap Bloom filter"
                    ) from e
                if "exist" not in str(e).lower():  # another worker reserved it first
                    raise
            else:
                if self.ttl is not None:
                    self.client.pexpire(self.key, ttl_ms(self.ttl))
        elif actual not in REDISBLOOM_TYPES:
            raise wrong_type(self.key, actual, "a RedisBloom filter")
        else:
            info = _info(command(self.client, "BF.INFO", self.key))
            filters = int(info.get("Number of filters") or 1)
            capacity = int(info.get("Capacity") or 0)
            if filters == 1 and capacity != self.params.capacity:
                logger.warning(
                    "RedisBloom dupefilter %(key)s exists with capacity %(old)d; the "
                    "settings ask for %(new)d. It keeps its own size (and hashing), so "
                    "it stays correct; delete it to start over with the new size",
                    {"key": self.key, "old": capacity, "new": self.params.capacity},
                )
        return self

    def __len__(self) -> int:
        return int(command(self.client, "BF.CARD", self.key))

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete the filter (the next record re-creates it as configured)."""
        (pipe or self.client).delete(self.key)

    def state(self) -> FilterState:
        """Count, sub-filters and an error estimate modelled on RedisBloom's growth.

        The estimate assumes RedisBloom's scaling (each sub-filter twice the capacity
        of the one before at half its error rate, the earlier ones full); ``capacity``
        is the sum of the sub-filters' design capacities.
        """
        with self.client.pipeline(transaction=False) as pipe:
            command(pipe, "BF.INFO", self.key)
            pipe.pttl(self.key)
            info, pttl = pipe.execute(raise_on_error=False)
        exists = not isinstance(info, Exception)
        fields = _info(info) if exists else {}
        count = int(fields.get("Number of items inserted") or 0)
        filters = max(1, min(int(fields.get("Number of filters") or 1), len(self.stages)))
        stages = self.stages[:filters]
        counts = [stage.capacity for stage in stages[:-1]]
        counts.append(max(0, count - sum(counts)))
        return FilterState(
            backend="redisbloom",
            key=self.key,
            count=count,
            capacity=sum(stage.capacity for stage in stages),
            design_capacity=self.params.capacity,
            error_rate=self.params.error_rate,
            fpr_estimate=abs(chain_false_positive_rate(stages, counts)),
            stages=filters,
            expires_in=expires_in(pttl) if exists else None,
            exists=exists,
            on_full=self.on_full,
            full=self.on_full == "refuse" and count >= self.params.capacity,
        )


def has_redisbloom(client: redis.Redis, key: str) -> bool:
    """Whether the server runs RedisBloom's ``BF.*`` commands (one round trip).

    Args:
        client: the client.
        key: a key that does not exist or holds a Bloom filter (``BF.CARD`` is probed
            on it).

    Raises:
        redis.RedisError: the probe failed for another reason than a missing command.
    """
    try:
        command(client, "BF.CARD", key)
    except redis.ResponseError as e:
        if _no_module(e):
            return False
        raise
    return True
