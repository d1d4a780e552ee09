"""The backend ``DUPEFILTER_BACKEND`` names (:func:`backend_from_config`), or for
``"bloom"`` and ``"auto"`` the choice of one when it opens (:class:`BackendChoice`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_dist.bloom import BloomParams, fit_segments
from scrapy_dist.config.core import Config
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters.base import REDISBLOOM_TYPES, wrong_type
from scrapy_dist.filters.bitmap import BitmapBloomBackend
from scrapy_dist.filters.buckets import BucketsBackend
from scrapy_dist.filters.exact import SetBackend, WindowSetBackend
from scrapy_dist.filters.redisbloom import RedisBloomBackend, has_redisbloom
from scrapy_dist.filters.window import GENERATIONS, window_of
from scrapy_dist.keys import key_type

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline
    from scrapy.settings import BaseSettings

    from scrapy_dist.config.components import BloomSize, DupefilterConfig
    from scrapy_dist.filters.base import DupefilterBackend
    from scrapy_dist.keys import RedisKeys

logger = logging.getLogger(__name__)

#: The modes a choice serves (the other values of ``DUPEFILTER_BACKEND`` name a backend).
MODES = ("bloom", "auto")


class BackendChoice:
    """The candidates of ``DUPEFILTER_BACKEND = "bloom"`` or ``"auto"``, one of which
    :meth:`open` picks. Not a backend itself: it cannot filter, only name its
    candidates' keys (:meth:`keys`, :meth:`clear`) before it is opened.

    :meth:`choose` adopts what the dupefilter key already holds (a crawl keeps its
    backend), and for a new crawl asks the server whether it has RedisBloom:
    ``"bloom"`` then uses RedisBloom, else the bitmap; ``"auto"`` uses RedisBloom, else
    the exact set.

    Args:
        client: the crawl's Redis client.
        mode: ``"bloom"`` or ``"auto"``.
        exact: the set backend (``"auto"`` only).
        bitmap: the bitmap Bloom backend.
        redisbloom: the RedisBloom backend.
        buckets: the bucketed exact backend, adopted by ``"auto"`` when the key holds
            its table (never chosen for a new crawl).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`, or ``exact`` is given for
            ``"bloom"`` or missing for ``"auto"``.
    """

    def __init__(
        self,
        client: redis.Redis,
        mode: str,
        *,
        exact: SetBackend | WindowSetBackend | None,
        bitmap: BitmapBloomBackend,
        redisbloom: RedisBloomBackend,
        buckets: BucketsBackend | None = None,
    ) -> None:
        if mode not in MODES or (mode == "auto") != (exact is not None):
            raise ValueError(f"BackendChoice needs mode 'bloom', or 'auto' with a set: {mode!r}")
        self.client = client
        self.mode = mode
        self.exact = exact
        self.bitmap = bitmap
        self.redisbloom = redisbloom
        self.buckets = buckets if mode == "auto" else None
        self.key = bitmap.key

    def _candidates(self) -> list[DupefilterBackend]:
        found: list[DupefilterBackend] = [self.redisbloom, self.bitmap]
        return [*found, self.exact] if self.exact is not None else found

    def choose(self) -> DupefilterBackend:
        """Decide the backend (one or two round trips), without opening it.

        Raises:
            ConfigurationError: the key holds a set and the mode is ``"bloom"``, or a
                type no backend uses.
        """
        actual = key_type(self.client, self.key)
        if actual in REDISBLOOM_TYPES:
            return self.redisbloom
        if actual == "hash":
            if self.client.hget(self.key, "kind") in (b"bf", "bf"):
                return self.redisbloom  # with a recrawl window
            if self.client.hexists(self.key, "gen"):
                if self.buckets is not None:
                    return self.buckets
                raise wrong_type(self.key, "buckets", "a Bloom filter")
            return self.bitmap
        if actual in ("set", "zset") and self.exact is not None:
            return self.exact
        if actual != "none":
            raise wrong_type(self.key, actual, "a Bloom filter")
        if has_redisbloom(self.client, self.key):
            return self.redisbloom
        return self.exact if self.exact is not None else self.bitmap

    def open(self) -> DupefilterBackend:
        """Choose the backend and open it; the dupefilter uses the result from now on."""
        chosen = self.choose().open()
        logger.info(
            "Dupefilter %(key)s: %(kind)s backend (DUPEFILTER_BACKEND = %(mode)r)",
            {"key": self.key, "kind": type(chosen).__name__, "mode": self.mode},
        )
        return chosen

    def keys(self) -> list[str]:
        """Every key any candidate may own."""
        return list(dict.fromkeys(key for c in self._candidates() for key in c.keys()))  # noqa: SIM118

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete every candidate's keys."""
        (pipe or self.client).delete(*self.keys())


def bloom_params_from_config(size: BloomSize) -> BloomParams:
    """The first Bloom stage: ``BLOOMFILTER_BIT``/``BLOOMFILTER_HASH_NUMBER`` if the
    former is set (scrapy-redis-bloomfilter's settings), else ``BLOOM_CAPACITY`` at
    ``BLOOM_ERROR_RATE``.

    Raises:
        ConfigurationError: values out of range.
    """
    try:
        if size.bits is not None:
            return BloomParams.from_bits(size.bits, size.hash_number)
        return BloomParams.from_capacity(size.capacity, size.error_rate)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"invalid Bloom dupefilter size: {e}") from e


def backend_from_config(
    config: DupefilterConfig, client: redis.Redis, keys: RedisKeys
) -> DupefilterBackend | BackendChoice:
    """Build the backend ``DUPEFILTER_BACKEND`` names, or the choice of one (no I/O).

    Args:
        config: the dupefilter's settings.
        client: the crawl's client.
        keys: the crawl's keys.

    Raises:
        ConfigurationError: invalid Bloom sizes.
    """
    mode, ttl, on_full = config.backend, config.ttl, config.on_full
    window = window_of(config.recrawl_after)
    if mode == "buckets":
        return BucketsBackend(
            client, keys.dupefilter, capacity=config.capacity, ttl=ttl, window=window
        )
    exact: SetBackend | WindowSetBackend = (
        SetBackend(client, keys.dupefilter, ttl=ttl)
        if window is None
        else WindowSetBackend(client, keys.dupefilter, window=window)
    )
    if mode == "set" or config.bloom is None:
        return exact
    params = bloom_params_from_config(config.bloom)
    if window is not None:
        params = generation_params(params)
    bitmap = BitmapBloomBackend(
        client, keys, fit_segments(params), ttl=ttl, on_full=on_full, window=window
    )
    redisbloom = RedisBloomBackend(
        client, keys.dupefilter, params, ttl=ttl, on_full=on_full, window=window
    )
    if mode == "bitmap":
        return bitmap
    if mode == "redisbloom":
        return redisbloom
    return BackendChoice(
        client,
        mode,
        exact=exact if mode == "auto" else None,
        bitmap=bitmap,
        redisbloom=redisbloom,
        buckets=BucketsBackend(
            client, keys.dupefilter, capacity=config.capacity, ttl=ttl, window=window
        ),
    )


def generation_params(params: BloomParams) -> BloomParams:
    """One generation's share of a windowed Bloom filter sized ``params`` for a whole
    window: a ``GENERATIONS``-th of the capacity (at least 1,000) at the same error
    rate (per generation: a new fingerprint is tested in every generation alive, so
    the chain's rate is up to ``GENERATIONS`` times it while all are full)."""
    capacity = max(1000, -(-params.capacity // GENERATIONS))
    try:
        return BloomParams.from_capacity(capacity, params.error_rate)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"invalid Bloom dupefilter size: {e}") from e


def backend_from_settings(
    settings: BaseSettings, client: redis.Redis, keys: RedisKeys
) -> DupefilterBackend | BackendChoice:
    """:func:`backend_from_config` from settings (for tests and tools; components get
    the crawler's config)."""
    return backend_from_config(Config.from_settings(settings).dupefilter, client, keys)
