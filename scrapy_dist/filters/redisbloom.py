"""The RedisBloom backend (``DUPEFILTER_BACKEND = "redisbloom"``): the server's own
``BF.*`` filter (Redis 8+, Redis Stack, valkey-bloom)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, cast

import redis

from scrapy_dist.bloom import GROWTH, bloom_chain, chain_false_positive_rate
from scrapy_dist.config.components import check_on_full
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
from scrapy_dist.filters.window import RecrawlWindow, server_ms
from scrapy_dist.keys import key_type, window_generation_key

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
        window: the recrawl window (``DUPEFILTER_RECRAWL_AFTER``): the key then holds
            a small hash (signature, run id, window) and each generation is a filter
            of its own (``params`` sizes one), created by ``BF.INSERT`` and expiring
            when it leaves the window (see :mod:`scrapy_dist.filters.window`).

    Raises:
        ConfigurationError: ``on_full`` is not one of
            :data:`scrapy_dist.config.components.ON_FULL`.
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
        window: RecrawlWindow | None = None,
    ) -> None:
        check_on_full(on_full)
        self.window = window
        self.client = client
        self.key = key
        self.params = params
        self.ttl = ttl
        self.on_full = on_full
        self.stages = bloom_chain(params, most=64)

    @property
    def seen_for(self) -> float | None:
        """Seconds a record surely counts as seen (``None``: forever)."""
        return None if self.window is None else self.window.rotating_seen_for

    def script_keys(self) -> list[str]:
        """The filter's key."""
        return [self.key]

    def script_args(self) -> list[str | int | float]:
        """Expiry, capacity, error rate and full policy."""
        args: list[str | int | float] = [
            ttl_ms(self.ttl),
            self.params.capacity,
            repr(self.params.error_rate),
            self.on_full,
        ]
        if self.window is not None:
            args += self.window.script_args()
        return args

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
        windowed = actual == "hash" and text(self.client.hget(self.key, "kind")) == "bf"
        if self.window is not None:
            return self._open_window(actual, windowed)
        if windowed:
            raise ConfigurationError(
                f"Redis key {self.key!r} holds a RedisBloom dupefilter with a recrawl "
                "window (DUPEFILTER_RECRAWL_AFTER), but these settings have none: set it "
                "again, or delete the crawl's dupefilter keys (its pages are then crawled "
                "again)"
            )
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

    def _open_window(self, actual: str, windowed: bool) -> RedisBloomBackend:
        if actual in REDISBLOOM_TYPES:
            raise ConfigurationError(
                f"Redis key {self.key!r} holds a RedisBloom dupefilter without a recrawl "
                "window, but DUPEFILTER_RECRAWL_AFTER is set: unset it, or delete the "
                "crawl's dupefilter keys (its pages are then crawled again)"
            )
        if actual not in ("none", "hash") or (actual == "hash" and not windowed):
            raise wrong_type(self.key, actual, "a RedisBloom filter with a recrawl window")
        if not has_redisbloom(self.client, self.key + ":probe"):
            raise ConfigurationError(
                "DUPEFILTER_BACKEND = 'redisbloom' but the server has no BF.* commands: "
                "use Redis 8+, Redis Stack or valkey-bloom, or 'bloom' to fall back to "
                "the bitmap Bloom filter"
            )
        try:
            self._run("add", [])
        except ConfigurationError as e:
            raise ConfigurationError(
                f"The RedisBloom dupefilter {self.key!r} was created with other "
                f"parameters ({e}): restore BLOOM_CAPACITY, BLOOM_ERROR_RATE and "
                "DUPEFILTER_RECRAWL_AFTER, or delete the crawl's dupefilter keys (its pages "
                "are then crawled again)"
            ) from e
        return self

    def _kind(self) -> str | None:
        """The ``kind`` field of a windowed filter's main hash (``None``: none, or not a
        hash)."""
        try:
            raw = self.client.hget(self.key, "kind")
        except redis.ResponseError:  # a RedisBloom filter, not a hash
            return None
        return None if raw is None else text(raw)

    def _generations(self) -> list[str]:
        """The keys of the generations alive (windowed; one round trip)."""
        window = cast("RecrawlWindow", self.window)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hget(self.key, "run")
            pipe.time()
            run, now = pipe.execute()
        if run is None:
            return []
        return [
            window_generation_key(self.key, text(run), g)
            for g in window.generations(server_ms(now))
        ]

    def _window_counts(self) -> list[int]:
        keys = self._generations()
        with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.exists(key)
            present = [key for key, n in zip(keys, pipe.execute(), strict=True) if n]
        with self.client.pipeline(transaction=False) as pipe:
            for key in present:
                command(pipe, "BF.CARD", key)
            return [int(n) for n in pipe.execute()]

    def __len__(self) -> int:
        if self.window is not None:
            return sum(self._window_counts())
        return int(command(self.client, "BF.CARD", self.key))

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete the filter (the next record re-creates it as configured)."""
        (pipe or self.client).delete(self.key)

    def state(self) -> FilterState:
        """Count, sub-filters and an error estimate modelled on RedisBloom's growth.

        The estimate assumes RedisBloom's scaling (each sub-filter twice the capacity
        of the one before at half its error rate, the earlier ones full); ``capacity``
        is the sum of the sub-filters' design capacities. With a window: the counts
        of the generations alive.
        """
        if self.window is not None:
            counts = self._window_counts()
            pttl = self.client.pttl(self.key)
            gens = max(1, len(counts))
            return FilterState(
                backend="redisbloom",
                key=self.key,
                count=sum(counts),
                capacity=self.params.capacity * gens,
                design_capacity=self.params.capacity
                * round(self.window.ms / self.window.generation_ms),
                error_rate=self.params.error_rate,
                fpr_estimate=min(
                    1.0,
                    sum(abs(chain_false_positive_rate(self.stages[:1], [n])) for n in counts),
                ),
                stages=1,
                expires_in=expires_in(pttl),
                exists=int(pttl) != -2,
                on_full=self.on_full,
                full=False,
                recrawl_after=self.window.seconds,
            )
        with self.client.pipeline(transaction=False) as pipe:
            command(pipe, "BF.INFO", self.key)
            pipe.pttl(self.key)
            info, pttl = pipe.execute(raise_on_error=False)
        exists = not isinstance(info, Exception)
        if not exists and self._kind() == "bf":
            # a windowed filter read without the setting (status): the window it recorded
            stored = self.client.hget(self.key, "window")
            if stored is not None and text(stored).isdigit():
                window = RecrawlWindow(int(stored) / 1000)
                return RedisBloomBackend(
                    self.client, self.key, self.params, on_full=self.on_full, window=window
                ).state()
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
