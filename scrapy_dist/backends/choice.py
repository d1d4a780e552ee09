"""The backend of ``DUPEFILTER_BACKEND = "bloom"`` or ``"auto"``, chosen when it opens."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_dist.backends.base import REDISBLOOM_TYPES, type_of, wrong_type
from scrapy_dist.backends.redisbloom import has_redisbloom

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

    from scrapy_dist.backends.base import DupefilterBackend
    from scrapy_dist.backends.bitmap import BitmapBloomBackend
    from scrapy_dist.backends.exact import SetBackend
    from scrapy_dist.backends.redisbloom import RedisBloomBackend

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

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`, or ``exact`` is given for
            ``"bloom"`` or missing for ``"auto"``.
    """

    def __init__(
        self,
        client: redis.Redis,
        mode: str,
        *,
        exact: SetBackend | None,
        bitmap: BitmapBloomBackend,
        redisbloom: RedisBloomBackend,
    ) -> None:
        if mode not in MODES or (mode == "auto") != (exact is not None):
            raise ValueError(f"BackendChoice needs mode 'bloom', or 'auto' with a set: {mode!r}")
        self.client = client
        self.mode = mode
        self.exact = exact
        self.bitmap = bitmap
        self.redisbloom = redisbloom
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
        actual = type_of(self.client, self.key)
        if actual in REDISBLOOM_TYPES:
            return self.redisbloom
        if actual == "hash":
            return self.bitmap
        if actual == "set" and self.exact is not None:
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
