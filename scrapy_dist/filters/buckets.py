"""The compact exact backend (``DUPEFILTER_BACKEND = "buckets"``): fingerprints in
many small Redis lists, each kept in Redis's compact listpack encoding.

Layout (all keys derived from the dupefilter key by suffixing, so a Cluster hash tag
in it covers them all):

=============================  ======  ===============================================
key                            type    holds
=============================  ======  ===============================================
``<dupefilter>``               hash    ``bits`` (2**bits buckets), ``gen`` (the
                                       generation), ``count`` (fingerprints recorded)
``<dupefilter>:<gen>:<i>``     list    bucket ``i``: the tokens of the fingerprints
                                       whose first ``bits`` bits are ``i``, without
                                       their first ``bits // 8`` bytes
=============================  ======  ===============================================

Why lists: a Redis list is a quicklist of listpacks of up to 8 KB each
(``list-max-listpack-size -2``, the default) whatever its length, so a bucket never
leaves the compact encoding; an element costs its length plus 2 bytes. A small hash
costs its field plus 4 bytes (field and value) and turns into a hash table (about 70
bytes per entry) past ``hash-max-listpack-entries`` (128); a small set of strings is
a hash table below Redis 7.2. ``LPOS`` tests a bucket in one linear scan, as ``HEXISTS``
does in a listpack hash. Past the capacity the table stays exact and compact; buckets
just grow longer, so each test costs more CPU (linear in the bucket's length).

Exactness: the bucket index is the token's leading bits and the bucket stores the
token minus the leading bytes the index determines, so the stored bytes and the index
give back the whole token, and :func:`token` is injective: two fingerprints share a
stored element only if they are equal. No false positives.

Generations: the hash's ``gen`` is fixed when the script creates the hash. A finished
crawl (``lua/progress.lua``), a flush or an expiry deletes the hash; the next record
creates a new generation over empty buckets, so a new run never sees the last run's
fingerprints. The old generation's buckets are then garbage, deleted by
:meth:`BucketsBackend.collect` in batches of ``UNLINK`` (never ``KEYS``): the
dupefilter calls it when it closes. :meth:`BucketsBackend.clear` deletes the current
generation too.
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import TYPE_CHECKING, ClassVar, cast

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters.base import (
    FilterState,
    ScriptedBackend,
    copy_set,
    expires_in,
    text,
    ttl_ms,
    wrong_type,
)
from scrapy_dist.filters.window import RecrawlWindow, server_ms
from scrapy_dist.keys import bucket_key, key_type, window_bucket_count_key

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis
    from redis.client import Pipeline


logger = logging.getLogger(__name__)

#: Fingerprints per bucket the table is sized for at its capacity (the mean lies
#: between half this and this, the bucket count being a power of two). A listpack of
#: 128 elements of 18-20 bytes is about 2.6 KB: one quicklist node.
BUCKET_LOAD = 128

#: Most bits of bucket index (16.7 million buckets, 2 billion fingerprints at the load).
MAX_BITS = 24

#: Keys per ``UNLINK`` when deleting a generation's buckets.
UNLINK_BATCH = 1000

#: Length of the fingerprints Scrapy's fingerprinter gives (SHA1), stored as they are.
RAW_LEN = 20


def bits_for(capacity: int, load: int = BUCKET_LOAD) -> int:
    """Bits of bucket index for ``capacity`` fingerprints at ``load`` per bucket."""
    if capacity <= load:
        return 0
    return min(MAX_BITS, math.ceil(math.log2(capacity / load)))


def token(fingerprint: bytes) -> bytes:
    """What the script stores for one fingerprint (injective, leading bytes uniform).

    A 20-byte fingerprint (Scrapy's SHA1) is its own token. Any other (a custom
    ``request_fingerprint``, e.g. hex text) gets 4 bytes of BLAKE2b in front, for
    uniform buckets, and its length byte behind; were that 20 bytes long (a 15-byte
    fingerprint) a zero byte is appended, so no other token is 20 bytes long and no two
    differ only in how they end.
    """
    if len(fingerprint) == RAW_LEN:
        return fingerprint
    out = (
        hashlib.blake2b(fingerprint, digest_size=4).digest()
        + fingerprint
        + bytes([len(fingerprint) & 0xFF])
    )
    return out + b"\x00" if len(out) == RAW_LEN else out


def bucket_index(tok: bytes, bits: int) -> int:
    """The bucket of a token (its first ``bits`` bits), as the script computes it."""
    head = (tok[:3] + b"\x00\x00\x00")[:3]
    return int.from_bytes(head, "big") >> (24 - bits)


def stored(tok: bytes, bits: int) -> bytes:
    """What bucket :func:`bucket_index` stores of a token."""
    return tok[bits // 8 :]


class BucketsBackend(ScriptedBackend):
    """Exact fingerprint storage in ``2**bits`` compact lists (see the module doc).

    Args:
        client: the crawl's Redis client.
        key: the dupefilter key (holds the layout, the generation and the count).
        capacity: fingerprints the table is sized for (``DUPEFILTER_CAPACITY``); only
            a crawl's first worker's counts: later ones adopt the layout in Redis.
        ttl: seconds after which the filter expires (``DUPEFILTER_TTL``).
        window: the recrawl window (``DUPEFILTER_RECRAWL_AFTER``): each generation
            (:mod:`scrapy_dist.filters.window`) gets buckets of its own,
            ``<dupefilter>:<gen>-<generation>:<i>``, expiring when it leaves the window;
            a fingerprint is tested in every generation alive. The meta hash records
            the window (a change is refused).
    """

    kind: ClassVar[str] = "buckets"

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        *,
        capacity: int,
        ttl: float | None = None,
        window: RecrawlWindow | None = None,
    ) -> None:
        self.window = window
        if capacity < 1:
            raise ValueError(f"the buckets dupefilter needs a capacity >= 1: {capacity!r}")
        self.client = client
        self.key = key
        self.capacity = capacity
        self.ttl = ttl
        self.bits = bits_for(capacity)
        #: Generations seen in Redis -> their bits, for :meth:`collect`.
        self.generations: dict[str, int] = {}

    def script_keys(self) -> list[str]:
        """The meta hash (the buckets are derived from it inside the script)."""
        return [self.key]

    def script_args(self) -> list[str | int | float]:
        """Expiry in ms and the bits a new table gets (then the window's arguments)."""
        args: list[str | int | float] = [ttl_ms(self.ttl), self.bits]
        if self.window is not None:
            args += self.window.script_args()
        return args

    @property
    def seen_for(self) -> float | None:
        """Seconds a record surely counts as seen (``None``: forever)."""
        return None if self.window is None else self.window.rotating_seen_for

    def token(self, fingerprint: bytes) -> bytes:
        """See :func:`token`."""
        return token(fingerprint)

    def keys(self) -> list[str]:
        """The meta hash only: deleting it starts a new generation; the buckets of the
        old one are deleted in batches by :meth:`collect` (a finished crawl's cleanup
        passes these keys to one script call, which 2**bits keys would not fit)."""
        return [self.key]

    def _meta(self) -> tuple[int | None, str | None, int, object]:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hmget(self.key, ["bits", "gen", "count"])
            pipe.pttl(self.key)
            (bits, gen, count), pttl = pipe.execute()
        if gen is not None:
            self.generations[text(gen)] = int(bits)
        return (
            None if bits is None else int(bits),
            None if gen is None else text(gen),
            int(count or 0),
            pttl,
        )

    def open(self) -> BucketsBackend:
        """Create the table if missing (with this worker's bits) and read it.

        Raises:
            ConfigurationError: the key holds something else (a set, a Bloom filter).
        """
        actual = key_type(self.client, self.key)
        if actual == "hash" and not self.client.hexists(self.key, "gen"):
            raise wrong_type(self.key, "bitmap", "the bucketed exact filter")
        if actual not in ("none", "hash"):
            raise wrong_type(self.key, actual, "the bucketed exact filter")
        try:
            self._run("add", [])
        except ConfigurationError as e:
            raise ConfigurationError(
                f"The buckets dupefilter {self.key!r} was created with another recrawl "
                f"window ({e}): restore DUPEFILTER_RECRAWL_AFTER, or delete the crawl's "
                "dupefilter keys (its pages are then crawled again)"
            ) from e
        bits, _gen, _, _ = self._meta()
        if bits is not None and bits != self.bits:
            logger.info(
                "Dupefilter %(key)s keeps its %(n)d buckets (this worker's "
                "DUPEFILTER_CAPACITY would give %(m)d)",
                {"key": self.key, "n": 2**bits, "m": 2**self.bits},
            )
        return self

    def __len__(self) -> int:
        if self.window is not None:
            return self._window_count()
        return int(self.client.hget(self.key, "count") or 0)

    def _window_count(self, window: RecrawlWindow | None = None) -> int:
        """Fingerprints recorded in the generations alive (two round trips)."""
        window = cast("RecrawlWindow", window or self.window)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hget(self.key, "gen")
            pipe.time()
            gen, now = pipe.execute()
        if gen is None:
            return 0
        names = [
            window_bucket_count_key(self.key, text(gen), g)
            for g in window.generations(server_ms(now))
        ]
        return sum(int(n or 0) for n in cast("list[bytes | None]", self.client.mget(names)))

    def bucket_keys(self, gen: str, bits: int) -> Iterator[str]:
        """Every bucket key of generation ``gen`` (no I/O)."""
        for index in range(2**bits):
            yield bucket_key(self.key, gen, index)

    def current_bucket_keys(self) -> list[str]:
        """Every bucket key of the current generation (one round trip; none before the
        table exists)."""
        bits, gen, _, _ = self._meta()
        return [] if gen is None else list(self.bucket_keys(gen, bits or 0))

    def drop(self, gen: str, bits: int) -> int:
        """Delete generation ``gen``'s buckets, :data:`UNLINK_BATCH` keys per ``UNLINK``
        (freed in the background), a few commands per round trip.

        Returns:
            The number of keys deleted.
        """
        deleted = 0
        batch: list[str] = []
        with self.client.pipeline(transaction=False) as pipe:
            for key in self.bucket_keys(gen, bits):
                batch.append(key)
                if len(batch) == UNLINK_BATCH:
                    pipe.unlink(*batch)
                    batch = []
                    if len(pipe) == 8:
                        deleted += sum(int(n) for n in pipe.execute())
            if batch:
                pipe.unlink(*batch)
            deleted += sum(int(n) for n in pipe.execute())
        return deleted

    def collect(self) -> int:
        """Delete the buckets of every generation seen that is no longer the current one
        (the crawl finished, was flushed or expired since). One round trip when there
        is none.

        Returns:
            The number of keys deleted.
        """
        current = self._meta()[1]
        deleted = 0
        for gen, bits in list(self.generations.items()):
            if gen != current:
                deleted += self.drop(gen, bits)
                del self.generations[gen]
        return deleted

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Forget every fingerprint: delete the meta hash, then every known
        generation's buckets (in batches, outside ``pipe``)."""
        self._meta()
        (pipe or self.client).unlink(self.key)
        if pipe is not None:
            pipe.execute()
        self.collect()

    def state(self) -> FilterState:
        """Count and expiry (one round trip); ``capacity`` is what the layout in Redis
        is sized for."""
        bits, _, count, pttl = self._meta()
        window = self.window
        if window is None:  # read without the setting (status): the window it recorded
            stored = self.client.hget(self.key, "window")
            window = None if stored is None else RecrawlWindow(int(stored) / 1000)
        if window is not None:
            count = self._window_count(window)
        bits = self.bits if bits is None else bits
        return FilterState(
            backend="buckets",
            key=self.key,
            count=count,
            capacity=max(1, 2**bits) * BUCKET_LOAD,
            design_capacity=None,
            error_rate=0.0,
            fpr_estimate=0.0,
            stages=1,
            expires_in=expires_in(pttl),
            exists=int(cast("int", pttl)) != -2,
            recrawl_after=None if window is None else window.seconds,
        )


def migrate_set(
    client: redis.Redis, set_key: str, backend: BucketsBackend, batch: int = 1000
) -> int:
    """Copy the fingerprints of a ``set`` dupefilter at ``set_key`` into ``backend``
    (``SSCAN``, then ``add_many`` per batch; nothing is deleted). Run it with the crawl
    stopped, the set renamed away from the dupefilter key first (see
    docs/dupefilters.md).

    Returns:
        The number of fingerprints that were new to ``backend``.
    """
    return copy_set(client, set_key, backend, batch)
