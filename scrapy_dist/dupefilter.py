"""Request fingerprint dupefilter over Redis, with an exact or a Bloom backend.

:class:`RFPDupeFilter` hashes requests with the crawler's ``request_fingerprinter`` (so
``REQUEST_FINGERPRINTER_CLASS`` applies) and keeps them in a backend, chosen by
``DUPEFILTER_BACKEND``:

* :class:`SetBackend`: the raw digests in a Redis set. Exact, about 70 bytes each.
* :class:`BitmapBloomBackend`: a scalable chain of Bloom filters in plain Redis strings
  (any server). Offsets come from MurmurHash3 with enhanced double hashing
  (:mod:`scrapy_dist.bloom`); one Lua call tests and sets all of them, so two workers
  adding the same new fingerprint get exactly one "new". Bitmaps over 512 MiB are cut
  into several keys.
* :class:`RedisBloomBackend`: RedisBloom's ``BF.*`` (Redis 8, Redis Stack,
  valkey-bloom), created with the configured capacity and error rate.

Under scrapy_dist's scheduler the test-and-set runs inside the enqueue script,
atomically with the push (``lua/enqueue.lua``); used with Scrapy's own scheduler,
:meth:`RFPDupeFilter.request_seen` makes one round trip (``lua/dupefilter.lua``); both
scripts use the filters of ``lua/_filters.lua``. The Bloom backends count their
insertions; the filter reports count, capacity and estimated false-positive rate as
stats, warns when the count passes the capacity, and then grows or refuses
(``BLOOM_ON_FULL``), never degrading silently. The filter never deletes its keys on
close: the scheduler decides, by ``SCHEDULER_PERSIST``, when a crawl's state goes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import mmh3
import redis
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.misc import load_object
from scrapy.utils.request import RequestFingerprinter, referer_str

from scrapy_dist.assembly import assemble
from scrapy_dist.bloom import (
    HASH_SEED,
    SEGMENT_BITS,
    BloomParams,
    LocalBloom,
    chain_false_positive_rate,
)
from scrapy_dist.connection import get_redis_from_settings
from scrapy_dist.exceptions import ConfigurationError, ScrapyDistError
from scrapy_dist.scripts import scripts_for
from scrapy_dist.settings import BloomSize, Config, DupefilterConfig, check_on_full

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from redis.client import Pipeline
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol
    from typing_extensions import Self

    from scrapy_dist.keys import RedisKeys

logger = logging.getLogger(__name__)

#: scrapy_dist's scheduler, by import path.
DIST_SCHEDULER = "scrapy_dist.scheduler.Scheduler"

#: Key of a standalone filter (under Scrapy's own scheduler): one per run.
STANDALONE_KEY = "dupefilter:%(timestamp)s"


def _dist_scheduler(scheduler: Any) -> bool:
    """Whether ``scheduler`` (the ``SCHEDULER`` setting) is scrapy_dist's scheduler (or a
    subclass)."""
    try:
        cls = load_object(scheduler) if scheduler else None
    except (ImportError, NameError, ValueError):
        return False
    # not issubclass(): Scrapy's scheduler metaclass answers it by duck typing; by name,
    # so that this module does not import the scheduler (which imports it)
    return isinstance(cls, type) and any(
        f"{c.__module__}.{c.__qualname__}" == DIST_SCHEDULER for c in cls.__mro__
    )



#: Most stages a bitmap Bloom chain grows to: 255 times its first capacity in all
#: (fewer when a stage would exceed :data:`scrapy_dist.bloom.MAX_BITS`).
MAX_STAGES = 8

#: Capacity factor between stages of a growing filter (RedisBloom's default expansion).
GROWTH = 2

#: Error-rate factor between stages (RedisBloom's tightening ratio), which keeps a
#: chain's false-positive rate under twice the first stage's however long it grows.
TIGHTENING = 0.5

#: Seconds a worker trusts its view of how many stages a bitmap chain has open.
VIEW_INTERVAL = 5.0

#: Share of its capacity a bitmap stage holds when the worker pre-sizes the next one.
PREPARE_AT = 0.5

#: Seconds a stage stays open before the next may open: three view intervals, so that
#: no worker's view is ever more than one stage behind (see BitmapBloomBackend).
GROWTH_GUARD = 3 * VIEW_INTERVAL

#: Seconds between refreshes of the filter's stats (one round trip each).
STATS_INTERVAL = 10.0

#: The local cache's false-positive rate, as a share of the Bloom error rate: the
#: cache adds at most this fraction to the crawl's error budget.
LOCAL_ERROR_SHARE = 0.01

#: ``TYPE`` of a RedisBloom filter key (RedisBloom, valkey-bloom).
REDISBLOOM_TYPES = frozenset({"MBbloom--", "bloomfltr"})

#: Version of the bitmap format (offsets, token, hash fields), part of every signature.
BITMAP_FORMAT = "v1"


class DupefilterFull(ScrapyDistError):
    """A Bloom dupefilter at its capacity refused new fingerprints.

    Raised when ``BLOOM_ON_FULL = "refuse"`` and a call could take the count past the
    capacity, or when a growing bitmap chain has no stage left. Nothing was written.
    """


class _StaleView(ScrapyDistError):
    """A worker passed fewer bitmap stages than are open; it refreshes and retries."""


_SCRIPT_ERRORS: dict[str, type[ScrapyDistError]] = {
    "DUPEFILTER_FULL": DupefilterFull,
    "DUPEFILTER_MISMATCH": ConfigurationError,
    "DUPEFILTER_STALE": _StaleView,
}


def filter_error(error: redis.ResponseError) -> ScrapyDistError | None:
    """Translate an error a filter script answered into the package's exception.

    The enqueue script and ``lua/dupefilter.lua`` answer ``DUPEFILTER_FULL`` (see
    :class:`DupefilterFull`), ``DUPEFILTER_MISMATCH`` (the filter in Redis was written
    with other Bloom parameters) or ``DUPEFILTER_STALE`` (retry after the backend's
    ``script_keys()``, which refreshes); none of them wrote anything.

    Args:
        error: What redis-py raised.

    Returns:
        The exception to raise instead (chain ``error`` as its cause), or ``None`` if
        the error is not a filter's.
    """
    code = str(error).split(" ", 1)[0]
    cls = _SCRIPT_ERRORS.get(code)
    return cls(str(error)) if cls is not None else None


def _ttl_ms(ttl: float | None) -> int:
    """``DUPEFILTER_TTL`` in whole milliseconds (at least 1), or 0 for none."""
    return 0 if ttl is None else max(1, round(ttl * 1000))


def _command(client: redis.Redis | Pipeline, *args: object) -> Any:
    """Run a command redis-py has no typed method for (``BF.*``)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _type_of(client: redis.Redis, key: str) -> str:
    return _text(client.type(key))


def _wrong_type(key: str, actual: str, backend: str) -> ConfigurationError:
    held = {
        "set": "a set (DUPEFILTER_BACKEND = 'set')",
        "hash": "a bitmap Bloom filter (DUPEFILTER_BACKEND = 'bitmap')",
    }.get(actual)
    if actual in REDISBLOOM_TYPES:
        held = "a RedisBloom filter (DUPEFILTER_BACKEND = 'redisbloom')"
    return ConfigurationError(
        f"Redis key {key!r} holds {held or 'a ' + actual} but DUPEFILTER_BACKEND asks "
        f"for {backend}: keep the backend the crawl started with ('auto' adopts it), or "
        "delete the crawl's dupefilter keys (its pages are then crawled again)"
    )


@dataclass(frozen=True)
class FilterState:
    """What a backend holds, as one round trip reads it.

    Attributes:
        backend: ``"set"``, ``"bitmap"`` or ``"redisbloom"``.
        key: The dupefilter key.
        count: Fingerprints recorded (set members; Bloom insertions).
        capacity: Fingerprints the open stages are sized for (``None`` for the set).
        design_capacity: The configured capacity, the first stage's (``None`` for the set).
        error_rate: The configured false-positive rate (0 for the set).
        fpr_estimate: Estimated false-positive rate now, from the counts.
        stages: Filters in the chain (1 for the set and an ungrown Bloom filter).
        expires_in: Seconds until the filter's keys expire; ``None`` when they have no
            expiry or do not exist.
        exists: Whether the filter exists in Redis.
        on_full: What happens past the capacity: ``"grow"`` or ``"refuse"``.
        full: Whether new fingerprints are refused now (full and cannot grow).
    """

    backend: str
    key: str
    count: int
    capacity: int | None
    design_capacity: int | None
    error_rate: float
    fpr_estimate: float
    stages: int
    expires_in: float | None
    exists: bool
    on_full: str = "grow"
    full: bool = False

    def stats(self) -> dict[str, int | float | str]:
        """Crawler stats that describe this state (``dupefilter/...``)."""
        if self.backend == "set":
            return {"dupefilter/set/count": self.count}
        return {
            "dupefilter/bloom/backend": self.backend,
            "dupefilter/bloom/count": self.count,
            "dupefilter/bloom/capacity": self.capacity or 0,
            "dupefilter/bloom/error_rate": self.error_rate,
            "dupefilter/bloom/fpr_estimate": self.fpr_estimate,
            "dupefilter/bloom/stages": self.stages,
        }


def _expires_in(pttl: object) -> float | None:
    ms = int(cast("int", pttl))
    return ms / 1000 if ms >= 0 else None


class DupefilterBackend(Protocol):
    """Where an :class:`RFPDupeFilter` keeps fingerprints.

    The first four members are what the enqueue script needs
    (:class:`scrapy_dist.queue.FilterBackend`); the others serve the dupefilter.
    """

    #: The filter kind the Lua filter code understands: ``"set"``, ``"bloom"``, ``"bf"``.
    kind: ClassVar[str]

    def script_keys(self) -> list[str]:
        """Keys the scripts' filter code touches, in the order it expects."""
        ...

    def script_args(self) -> list[str | int | float]:
        """Backend-wide filter arguments, consistent with the last ``script_keys()``."""
        ...

    def token(self, fingerprint: bytes) -> bytes:
        """What the scripts test and record for one fingerprint."""
        ...

    def keys(self) -> list[str]:
        """Every key the backend may own (all stages and segments), for flushes."""
        ...

    def open(self) -> DupefilterBackend:
        """Check (and create) the filter in Redis; return the backend to use from now on."""
        ...

    def add(self, fingerprint: bytes) -> bool:
        """Record ``fingerprint`` (one round trip); ``True`` if it was not seen before."""
        ...

    def add_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """:meth:`add` for many fingerprints in one round trip, in order."""
        ...

    def contains_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Whether each fingerprint is (probably) recorded, in one round trip."""
        ...

    def __contains__(self, fingerprint: bytes) -> bool: ...

    def __len__(self) -> int: ...

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Forget every fingerprint (delete every key)."""
        ...

    def state(self) -> FilterState:
        """Read count, capacity, stages and expiry (one round trip)."""
        ...


#: Retries of a call refused as stale. With the growth guard a view is at most one
#: stage behind and calls are never stale; without it (tests) several may be needed.
_STALE_RETRIES = 5


class _ScriptedBackend:
    """Runs ``lua/dupefilter.lua`` for a backend's standalone adds and checks."""

    kind: ClassVar[str]
    client: redis.Redis

    def script_keys(self) -> list[str]:
        raise NotImplementedError

    def script_args(self) -> list[str | int | float]:
        raise NotImplementedError

    def token(self, fingerprint: bytes) -> bytes:
        raise NotImplementedError

    def _refresh_view(self) -> None:
        """Forget what the backend believes about Redis (nothing by default)."""

    def _run(self, op: str, fingerprints: Iterable[bytes]) -> list[bool]:
        """Run the standalone filter script once (retrying on a stale view).

        Raises:
            DupefilterFull: the filter refused new fingerprints.
            ConfigurationError: the filter in Redis has other parameters.
        """
        token = self.token
        tokens = [token(fingerprint) for fingerprint in fingerprints]
        script = scripts_for(self.client).dupefilter
        for attempt in range(_STALE_RETRIES + 1):
            keys = self.script_keys()
            extra = self.script_args()
            try:
                flags = script(keys=keys, args=[op, self.kind, len(extra), *extra, *tokens])
            except redis.ResponseError as e:
                translated = filter_error(e)
                if isinstance(translated, _StaleView) and attempt < _STALE_RETRIES:
                    self._refresh_view()
                    continue
                if translated is not None:
                    raise translated from e
                raise
            return [bool(flag) for flag in cast("list[int]", flags)]
        raise AssertionError("unreachable")  # pragma: no cover

    def add(self, fingerprint: bytes) -> bool:
        """Record ``fingerprint``; return ``True`` if it was not recorded before."""
        return self._run("add", [fingerprint])[0]

    def add_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Record fingerprints in one round trip; ``True`` for each that was new.

        A fingerprint repeated in ``fingerprints`` is new at most once.
        """
        return self._run("add", fingerprints) if fingerprints else []

    def contains_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Whether each fingerprint is (probably) recorded; one round trip, no write."""
        return self._run("check", fingerprints) if fingerprints else []

    def __contains__(self, fingerprint: bytes) -> bool:
        return self._run("check", [fingerprint])[0]


class SetBackend(_ScriptedBackend):
    """Exact fingerprint storage: a Redis set of raw digests.

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
        return [_ttl_ms(self.ttl)] if self.ttl is not None else []

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
        actual = _type_of(self.client, self.key)
        if actual not in ("none", "set"):
            raise _wrong_type(self.key, actual, "the set")
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
            expires_in=_expires_in(pttl),
            exists=int(pttl) != -2,
        )


def bloom_chain(params: BloomParams, most: int = MAX_STAGES) -> tuple[BloomParams, ...]:
    """The stages a growing Bloom filter may open: ``params.stage(i)`` for ``i < most``.

    Each stage has :data:`GROWTH` times the capacity of the one before at
    :data:`TIGHTENING` times its error rate. The chain stops early at a stage that
    would exceed :data:`scrapy_dist.bloom.MAX_BITS` bits or ``MAX_HASHES`` hashes.

    Args:
        params: The first stage.
        most: Most stages, >= 1.

    Returns:
        At least ``(params,)``.
    """
    stages = [params]
    for index in range(1, most):
        try:
            stages.append(params.stage(index, growth=GROWTH, tightening=TIGHTENING))
        except ValueError:
            break
    return tuple(stages)


#: Bytes a Redis string needs beyond its content (sds header, terminator), rounded up.
_STRING_OVERHEAD = 64

#: Bitmaps smaller than this stay in one key, whatever the allocator rounds.
_MIN_FIT_BYTES = 64 * 1024


def _size_class(nbytes: int) -> int:
    """The largest jemalloc size class not above ``nbytes`` (>= 16 bytes): classes are
    ``2**n``, ``1.25 * 2**n``, ``1.5 * 2**n`` and ``1.75 * 2**n``."""
    n = nbytes.bit_length() - 1
    step = 1 << (n - 2)
    return (1 << n) + (nbytes - (1 << n)) // step * step


def fit_segments(params: BloomParams) -> BloomParams:
    """Cut a bitmap into segments the allocator stores without waste.

    jemalloc (Redis's and Valkey's allocator) rounds a large allocation up to the next
    of four size classes per power of two, so one string can waste up to 25%: a
    17.1 MiB bitmap (10 million fingerprints at 0.1%) takes 20 MiB. Segments of one
    size class (minus the string header) and a remainder waste at most a quarter of
    the remainder, under 7% in all.

    Args:
        params: The bitmap's parameters; only ``segment_bits`` changes.

    Returns:
        ``params`` itself when the bitmap is small or fits its class, else a copy with
        ``segment_bits`` set to a size class (at most 512 MiB) minus the header.
    """
    nbytes = params.memory_bytes
    if nbytes < _MIN_FIT_BYTES:
        return params
    segment = _size_class(min(nbytes + _STRING_OVERHEAD, SEGMENT_BITS // 8)) - _STRING_OVERHEAD
    if segment >= nbytes:
        return params
    return replace(params, segment_bits=segment * 8)


def _signature(params: BloomParams) -> str:
    """Everything that decides where a fingerprint's bits are, in readable form."""
    return (
        f"{BITMAP_FORMAT} bits={params.bits} hashes={params.hashes} "
        f"capacity={params.capacity} error_rate={params.error_rate!r} "
        f"segment_bits={params.segment_bits} growth={GROWTH} tightening={TIGHTENING!r}"
    )


def _int_fields(raw: dict[bytes, bytes]) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.items() if k != b"sig" and v.lstrip(b"-").isdigit()}


class BitmapBloomBackend(_ScriptedBackend):
    """A scalable Bloom filter in plain Redis strings, tested and set by Lua.

    Layout: the dupefilter key is a hash holding the parameters' signature, the number
    of open stages and each stage's count and opening time; the bits of stage ``s``
    are in ``<dupefilter>:<s>:<i>``, ``i`` counting segments of ``params.segment_bits``
    (at most 2**32 bits, 512 MiB, the largest Redis string; :func:`fit_segments` picks
    a size the allocator does not round up). Segments are created at full size by
    :meth:`prepare`, in calls of their own (one segment each), never inside an
    enqueue: stage 0 before the chain opens, the next stage when the last holds
    :data:`PREPARE_AT` of its capacity (checked whenever the view is re-read); the
    script grows only into a stage prepared so. A fingerprint's token is its 16-byte
    MurmurHash3; the script derives each stage's ``k`` offsets from it
    (:mod:`scrapy_dist.bloom`'s enhanced double hashing), so a token does not depend on
    how many stages exist.

    Growth: every script call passes the keys of the stages this worker believes
    open, plus the next one. Redis opens the next stage when the last is full, but
    only once the last has been open :data:`GROWTH_GUARD` seconds (until then it takes
    the excess, which the counts show); the worker re-reads the stage count whenever its
    view is older than :data:`VIEW_INTERVAL`, before building a call, so its call
    always covers every open stage. Should it not (a worker stalled mid-call), the
    script answers ``DUPEFILTER_STALE`` without writing.

    Args:
        client: the crawl's Redis client.
        keys: the crawl's keys.
        params: size and hashing of the first stage.
        ttl: seconds after which the filter expires (``DUPEFILTER_TTL``); ``None``
            for never.
        on_full: ``"grow"`` or ``"refuse"`` (``BLOOM_ON_FULL``).
        view_interval: seconds a view of the stage count is trusted.
        growth_guard: seconds a stage stays open before the next may open; at least
            twice ``view_interval`` for the guarantee above.

    Raises:
        ConfigurationError: ``on_full`` is not one of :data:`scrapy_dist.settings.ON_FULL`.
    """

    kind: ClassVar[str] = "bloom"

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        params: BloomParams,
        *,
        ttl: float | None = None,
        on_full: str = "grow",
        view_interval: float = VIEW_INTERVAL,
        growth_guard: float = GROWTH_GUARD,
    ) -> None:
        check_on_full(on_full)
        self.client = client
        self.key = keys.dupefilter
        self.params = params
        self.ttl = ttl
        self.on_full = on_full
        self.view_interval = view_interval
        self.growth_guard = growth_guard
        #: The stages the chain may open, first one first.
        self.stages = bloom_chain(params)
        self.signature = _signature(params)
        self._segment_keys = [
            [keys.bloom_segment(s, i) for i in range(stage.segments)]
            for s, stage in enumerate(self.stages)
        ]
        #: Stages open in Redis, as last read (0: no filter yet).
        self._live = 0
        self._passed = 0
        self._layout: tuple[list[str], list[str | int | float]] = ([], [])
        self._set_view(0)
        #: When the view was read (never yet: the first call reads it).
        self._viewed_at = -math.inf
        #: Stages whose segments this worker has seen pre-sized (stage 0 excepted).
        self._prepared: set[int] = set()

    def _set_view(self, live: int) -> None:
        """Adopt ``live`` open stages: calls pass their keys and the next stage's."""
        self._live = live
        passed = min(max(live, 1) + 1, len(self.stages))
        if passed == self._passed:
            return
        keys = [self.key]
        numbers: list[int | float] = [
            self.growth_guard,
            len(self.stages),
            self.params.segment_bits,
            passed,
        ]
        for stage, segment_keys in zip(self.stages[:passed], self._segment_keys, strict=False):
            keys += segment_keys
            numbers += (stage.bits, stage.hashes, stage.capacity)
        args: list[str | int | float] = [
            _ttl_ms(self.ttl),
            self.signature,
            self.on_full,
            json.dumps(numbers, separators=(",", ":")),
        ]
        self._passed = passed
        self._layout = (keys, args)

    def _read(self) -> tuple[dict[bytes, bytes], object]:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.key)
            pipe.pttl(self.key)
            meta, pttl = pipe.execute()
        fields = cast("dict[bytes, bytes]", meta)
        self._set_view(int(fields.get(b"stages", 0)))
        self._viewed_at = time.monotonic()
        self._prepare_next(fields)
        return fields, pttl

    def _prepare_next(self, fields: dict[bytes, bytes]) -> None:
        """Pre-size the stage the chain opens next, if it is due (see the class doc)."""
        live = self._live
        if live == 0:
            self._prepared.clear()
            self.prepare(0)
            return
        if self.on_full != "grow" or live >= len(self.stages) or live in self._prepared:
            return
        count = int(fields.get(f"n{live - 1}".encode(), 0))
        if count >= self.stages[live - 1].capacity * PREPARE_AT:
            self.prepare(live)
            self._prepared.add(live)

    def prepare(self, stage: int) -> int:
        """Create the segments of ``stage`` at full size if missing, one call each
        (each allocates at most one 512 MiB string, outside any enqueue).

        Returns:
            The number of segments created.
        """
        script = scripts_for(self.client).dupefilter
        spec = self.stages[stage]
        created = 0
        for i, key in enumerate(self._segment_keys[stage]):
            size = min(self.params.segment_bits, spec.bits - i * self.params.segment_bits)
            created += int(script(keys=[self.key, key], args=["prepare", size]))
        return created

    def _refresh_view(self) -> None:
        self._read()

    def script_keys(self) -> list[str]:
        """The chain's hash, then the segments of every open stage and of the next.

        Re-reads the number of open stages first when the view is older than
        ``view_interval`` (one round trip, at most once per interval).
        """
        if time.monotonic() - self._viewed_at > self.view_interval:
            self._read()
        return list(self._layout[0])

    def script_args(self) -> list[str | int | float]:
        """Expiry, signature, full policy, then guard, most stages, bits per segment,
        stages passed and each passed stage's size, as one JSON array.

        Matches the last :meth:`script_keys` (the script checks the key count).
        """
        return list(self._layout[1])

    def token(self, fingerprint: bytes) -> bytes:
        """The fingerprint's MurmurHash3_x64_128: ``h1`` then ``h2``, little-endian."""
        return mmh3.hash_bytes(fingerprint, HASH_SEED, True)

    def keys(self) -> list[str]:
        """The chain's hash and every segment of every stage it may open."""
        return [self.key, *(key for stage in self._segment_keys for key in stage)]

    def open(self) -> BitmapBloomBackend:
        """Create the chain's hash if missing and check its parameters.

        Raises:
            ConfigurationError: the key holds something else, or a chain written with
                other Bloom parameters (which would make every lookup wrong).
        """
        actual = _type_of(self.client, self.key)
        if actual not in ("none", "hash"):
            raise _wrong_type(self.key, actual, "a bitmap Bloom filter")
        try:
            self._run("add", [])
        except ConfigurationError as e:
            stored = _text(self.client.hget(self.key, "sig"))
            raise ConfigurationError(
                f"The Bloom dupefilter {self.key!r} was created with {stored}, but these "
                f"settings give {self.signature}. A Bloom filter cannot be resized: "
                "restore BLOOM_CAPACITY and BLOOM_ERROR_RATE (or BLOOMFILTER_BIT and "
                "BLOOMFILTER_HASH_NUMBER), or delete the crawl's dupefilter keys (its pages "
                "are then crawled again)"
            ) from e
        self._read()
        return self

    def __len__(self) -> int:
        fields = _int_fields(cast("dict[bytes, bytes]", self.client.hgetall(self.key)))
        return sum(v for k, v in fields.items() if k.startswith("n"))

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete the chain: its hash and every segment."""
        (pipe or self.client).delete(*self.keys())
        self._prepared.clear()
        if pipe is None:
            self._set_view(0)

    def state(self) -> FilterState:
        """Counts per stage, their capacities and the chain's estimated error rate."""
        raw, pttl = self._read()
        fields = _int_fields(raw)
        live = min(fields.get("stages", 0), len(self.stages))
        stages = self.stages[: max(live, 1)]
        counts = [fields.get(f"n{s}", 0) for s in range(len(stages))]
        stuck = self.on_full == "refuse" or len(stages) >= len(self.stages)
        return FilterState(
            backend="bitmap",
            key=self.key,
            count=sum(counts),
            capacity=sum(stage.capacity for stage in stages),
            design_capacity=self.params.capacity,
            error_rate=self.params.error_rate,
            fpr_estimate=abs(chain_false_positive_rate(stages, counts)),
            stages=len(stages),
            expires_in=_expires_in(pttl),
            exists=bool(raw),
            on_full=self.on_full,
            full=stuck and counts[-1] >= stages[-1].capacity,
        )


def _info(value: object) -> dict[str, Any]:
    """``BF.INFO``'s answer as a dict, whether redis-py parsed it or not."""
    if isinstance(value, dict):
        return {_text(k): v for k, v in value.items()}
    items = list(cast("list[Any]", value))
    return {_text(k): v for k, v in zip(items[::2], items[1::2], strict=True)}


def _no_module(error: redis.ResponseError) -> bool:
    """Whether an error says the server has no such command (or may not run it)."""
    text = str(error).lower()
    return (
        isinstance(error, redis.exceptions.NoPermissionError)
        or "unknown command" in text
        or "noperm" in text
    )


class RedisBloomBackend(_ScriptedBackend):
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
        ConfigurationError: ``on_full`` is not one of :data:`scrapy_dist.settings.ON_FULL`.
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
            _ttl_ms(self.ttl),
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
        actual = _type_of(self.client, self.key)
        if actual == "none":
            option = ["NONSCALING"] if self.on_full == "refuse" else ["EXPANSION", GROWTH]
            try:
                _command(
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
                    self.client.pexpire(self.key, _ttl_ms(self.ttl))
        elif actual not in REDISBLOOM_TYPES:
            raise _wrong_type(self.key, actual, "a RedisBloom filter")
        else:
            info = _info(_command(self.client, "BF.INFO", self.key))
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
        return int(_command(self.client, "BF.CARD", self.key))

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
            _command(pipe, "BF.INFO", self.key)
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
            expires_in=_expires_in(pttl) if exists else None,
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
        _command(client, "BF.CARD", key)
    except redis.ResponseError as e:
        if _no_module(e):
            return False
        raise
    return True


class BackendChoice:
    """The backend of ``DUPEFILTER_BACKEND = "bloom"`` or ``"auto"``, decided at open.

    Until :meth:`open` it only knows its keys (every candidate's) and can clear them.
    :meth:`open` adopts what the dupefilter key already holds (a crawl keeps its
    backend), and for a new crawl asks the server whether it has RedisBloom:
    ``"bloom"`` then uses RedisBloom, else the bitmap; ``"auto"`` uses RedisBloom, else
    the exact set.

    Args:
        client: the crawl's Redis client.
        mode: ``"bloom"`` or ``"auto"``.
        exact: the set backend (``"auto"`` only).
        bitmap: the bitmap Bloom backend.
        redisbloom: the RedisBloom backend.
    """

    kind: ClassVar[str] = "undecided"

    def __init__(
        self,
        client: redis.Redis,
        mode: str,
        *,
        exact: SetBackend | None,
        bitmap: BitmapBloomBackend,
        redisbloom: RedisBloomBackend,
    ) -> None:
        if mode not in ("bloom", "auto") or (mode == "auto") != (exact is not None):
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
        actual = _type_of(self.client, self.key)
        if actual in REDISBLOOM_TYPES:
            return self.redisbloom
        if actual == "hash":
            return self.bitmap
        if actual == "set" and self.exact is not None:
            return self.exact
        if actual != "none":
            raise _wrong_type(self.key, actual, "a Bloom filter")
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

    def _unopened(self) -> RuntimeError:
        return RuntimeError(
            "the dupefilter backend is chosen when it opens: call RFPDupeFilter.open() first"
        )

    def script_keys(self) -> list[str]:
        raise self._unopened()

    def script_args(self) -> list[str | int | float]:
        raise self._unopened()

    def token(self, fingerprint: bytes) -> bytes:
        raise self._unopened()

    def add(self, fingerprint: bytes) -> bool:
        raise self._unopened()

    def add_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        raise self._unopened()

    def contains_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        raise self._unopened()

    def __contains__(self, fingerprint: bytes) -> bool:
        raise self._unopened()

    def __len__(self) -> int:
        raise self._unopened()

    def state(self) -> FilterState:
        raise self._unopened()


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


def backend_from_settings(
    settings: BaseSettings, client: redis.Redis, keys: RedisKeys
) -> DupefilterBackend:
    """Build the backend ``DUPEFILTER_BACKEND`` names from settings (no I/O); see
    :func:`backend_from_config`."""
    return backend_from_config(Config.from_settings(settings).dupefilter, client, keys)


def backend_from_config(
    config: DupefilterConfig, client: redis.Redis, keys: RedisKeys
) -> DupefilterBackend:
    """Build the backend ``DUPEFILTER_BACKEND`` names (no I/O).

    Args:
        config: the dupefilter's settings.
        client: the crawl's client.
        keys: the crawl's keys.

    Raises:
        ConfigurationError: invalid Bloom sizes.
    """
    mode, ttl, on_full = config.backend, config.ttl, config.on_full
    exact = SetBackend(client, keys.dupefilter, ttl=ttl)
    if mode == "set" or config.bloom is None:
        return exact
    params = bloom_params_from_config(config.bloom)
    bitmap = BitmapBloomBackend(client, keys, fit_segments(params), ttl=ttl, on_full=on_full)
    redisbloom = RedisBloomBackend(client, keys.dupefilter, params, ttl=ttl, on_full=on_full)
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
    )


class LocalSet:
    """An exact per-worker seen-cache: the raw fingerprints themselves (about 100 bytes
    each), emptied when it holds ``capacity``. Used with the exact set backend, where a
    Bloom cache would add false positives the set does not have."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._seen: set[bytes] = set()

    def __contains__(self, fingerprint: bytes) -> bool:
        return fingerprint in self._seen

    def add(self, fingerprint: bytes) -> None:
        """Remember ``fingerprint``."""
        self._seen.add(fingerprint)

    @property
    def count(self) -> int:
        """Fingerprints held."""
        return len(self._seen)

    def clear(self) -> None:
        """Forget everything."""
        self._seen.clear()


class RFPDupeFilter(BaseDupeFilter):
    """Scrapy dupefilter whose fingerprints live in Redis, shared by every worker.

    Args:
        backend: where fingerprints are stored (a :class:`BackendChoice` becomes the
            chosen backend at :meth:`open`).
        fingerprinter: the crawler's request fingerprinter.
        debug: log every filtered request, not only the first (``DUPEFILTER_DEBUG``).
        stats: the crawler's stats collector.
        local: an in-memory cache of fingerprints this worker already knows are
            recorded in Redis, to skip their serialization and round trip; ``None`` to
            always ask Redis. A :class:`LocalSet` (exact) for the set backend; a
            :class:`~scrapy_dist.bloom.LocalBloom` for Bloom backends, whose false
            positives are requests never crawled, so it is sized well below the
            crawl's error budget. It is cleared when it reaches its capacity, and
            whenever the filter in Redis may have expired.
        local_exact_off: replace a Bloom ``local`` by an exact one at :meth:`open` if
            the backend turns out to be the exact set (``"auto"`` without RedisBloom).
        ttl: ``DUPEFILTER_TTL``, which the local cache must follow.
        stats_interval: seconds between refreshes of the filter's stats.
    """

    #: The logger :meth:`log` writes to (scrapy-redis's attribute).
    logger = logger

    def __init__(
        self,
        backend: DupefilterBackend | redis.Redis,
        fingerprinter: RequestFingerprinterProtocol | str | None = None,
        debug: bool = False,
        *,
        key: str | None = None,
        stats: StatsCollector | None = None,
        local: LocalBloom | LocalSet | None = None,
        local_exact_off: bool = False,
        ttl: float | None = None,
        stats_interval: float = STATS_INTERVAL,
        clear_on_close: bool = False,
    ) -> None:
        if isinstance(fingerprinter, str) or key is not None:
            # scrapy-redis's RFPDupeFilter(server, key, debug): a set at ``key``, which
            # close() deletes, as there
            key = key if key is not None else cast("str", fingerprinter)
            backend = SetBackend(cast("redis.Redis", backend), key)
            fingerprinter = None
            clear_on_close = True
        backend = cast("DupefilterBackend", backend)
        if fingerprinter is None or isinstance(fingerprinter, str):
            fingerprinter = RequestFingerprinter()
        self.backend = backend
        #: The Redis client and the fingerprints key (scrapy-redis's attributes).
        self.server: redis.Redis | None = getattr(backend, "client", None)
        self.key: str | None = getattr(backend, "key", None)
        self.clear_on_close = clear_on_close
        self.local = local
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self.logdupes = True
        self.ttl = ttl
        self.stats_interval = stats_interval
        self._local_exact_off = local_exact_off
        #: Last state read from Redis (``None`` before :meth:`open`).
        self.last_state: FilterState | None = None
        self._opened = False
        self._next_refresh = math.inf
        self._local_until = math.inf
        self._stages_reported = 1
        self._reported_over = False
        self._reported_full = False
        self._reported_rate = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """A standalone filter (scrapy-redis's factory): a new client and a per-run key
        ``dupefilter:<timestamp>``, deleted at :meth:`close`."""
        server = get_redis_from_settings(settings)
        key = STANDALONE_KEY % {"timestamp": int(time.time())}
        return cls(server, key=key, debug=Config.from_settings(settings).dupefilter.debug)

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        """A filter over the spider's ``SCHEDULER_DUPEFILTER_KEY`` set (scrapy-redis's
        factory); like any filter built from a server and a key, :meth:`close` deletes it."""
        config = Config.from_settings(spider.settings)
        key = config.keys.dupefilter % {"spider": spider.name}
        return cls(
            get_redis_from_settings(config.settings), key=key, debug=config.dupefilter.debug
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Under scrapy_dist's scheduler: the crawl's shared filter, never deleted by a
        worker. Under another scheduler (Scrapy's own), with
        ``DUPEFILTER_STANDALONE_PER_RUN`` (the default): :meth:`from_settings`'s per-run
        filter, as in scrapy-redis; without it, the crawl's shared filter."""
        parts = assemble(crawler)
        config = parts.config.dupefilter
        if config.standalone_per_run and not _dist_scheduler(parts.config.components.scheduler):
            return cls.from_settings(parts.config.settings)
        backend = backend_from_config(config, parts.client, parts.keys)
        mode = config.backend
        wanted = config.local_cache
        size = config.local_cache_size
        local: LocalBloom | LocalSet | None = None
        enabled = wanted is None or wanted
        if enabled and size > 0 and (mode == "set" or config.bloom is None):
            local = LocalSet(size)
        elif enabled and size > 0 and config.bloom is not None:
            rate = bloom_params_from_config(config.bloom).error_rate * LOCAL_ERROR_SHARE
            try:
                local = LocalBloom(BloomParams.from_capacity(size, rate))
            except ValueError as e:
                raise ConfigurationError(f"invalid DUPEFILTER_LOCAL_CACHE_SIZE: {e}") from e
        return cls(
            backend,
            crawler.request_fingerprinter,
            debug=config.debug,
            stats=crawler.stats,
            local=local,
            local_exact_off=wanted is None,
            ttl=config.ttl,
        )

    def open(self) -> None:
        """Open the backend (choosing it, for ``"bloom"``/``"auto"``) and read its state.

        Raises:
            ConfigurationError: the dupefilter key holds another backend's data, or a
                Bloom filter with other parameters, or RedisBloom is missing.
        """
        self.backend = self.backend.open()
        if self._local_exact_off and self.backend.kind == "set" and self.local is not None:
            self.local = LocalSet(self._local_capacity())  # "auto" chose the exact set
        self._opened = True
        self._refresh(time.monotonic())

    def close(self, reason: str = "") -> None:
        """Report the filter's final state (stats). Deletes the fingerprints only for a
        filter built scrapy-redis's way (from a server and a key, or by
        :meth:`from_settings`): the crawl's shared filter is never deleted here."""
        if self.clear_on_close:
            self.clear()
        if not self._opened:
            return
        try:
            self._refresh(time.monotonic())
        except redis.RedisError as e:
            logger.debug("Could not read the dupefilter's final state: %(error)s", {"error": e})

    def fingerprint(self, request: Request) -> bytes:
        """The raw fingerprint of ``request``: the crawler's fingerprinter, or an
        overridden :meth:`request_fingerprint` (scrapy-redis's hook) encoded as bytes."""
        hook = self.request_fingerprint
        if getattr(hook, "__func__", None) is RFPDupeFilter.request_fingerprint:
            return self.fingerprinter.fingerprint(request)
        value = hook(request)
        return value.encode() if isinstance(value, str) else bytes(value)

    def request_fingerprint(self, request: Request) -> str:
        """The fingerprint of ``request`` as hex text (scrapy-redis's hook: override it,
        in a subclass or on the instance, to change how requests are told apart)."""
        return self.fingerprinter.fingerprint(request).hex()

    def seen_locally(self, fingerprint: bytes) -> bool:
        """Whether this worker already knows ``fingerprint`` is recorded in Redis.

        Also refreshes the filter's stats every ``stats_interval`` seconds (one round
        trip; a failure is logged and retried next time). With ``DUPEFILTER_TTL`` the
        local cache is only trusted until the filter in Redis may have expired.
        """
        now = time.monotonic()
        if now >= self._next_refresh:
            self._tick(now)
        local = self.local
        if local is not None and now < self._local_until and fingerprint in local:
            if self.stats is not None:
                self.stats.inc_value("dupefilter/local/hits")
            return True
        return False

    def remember(self, fingerprint: bytes) -> None:
        """Note that ``fingerprint`` is now recorded in Redis (it was queued or filtered)."""
        local = self.local
        if local is not None and time.monotonic() < self._local_until:
            if local.count >= self._local_capacity():
                local.clear()
            local.add(fingerprint)

    def forget_local(self) -> None:
        """Empty the local cache. The scheduler calls this whenever the worker holds no
        request: a finished crawl deletes its dupefilter only when no worker holds
        anything, so no worker can then trust fingerprints it cached before."""
        if self.local is not None and self.local.count:
            self.local.clear()

    def _local_capacity(self) -> int:
        local = self.local
        if isinstance(local, LocalSet):
            return local.capacity
        return local.params.capacity if local is not None else 0

    def request_seen(self, request: Request) -> bool:
        """Record the request's fingerprint; return ``True`` if it was already there.

        Raises:
            DupefilterFull: a full Bloom filter refused it (``BLOOM_ON_FULL = "refuse"``).
        """
        fingerprint = self.fingerprint(request)
        if self.seen_locally(fingerprint):
            return True
        new = self.backend.add(fingerprint)
        self.remember(fingerprint)
        return not new

    def clear(self) -> None:
        """Forget every fingerprint of this crawl."""
        self.backend.clear()
        if self.local is not None:
            self.local.clear()

    def log(self, request: Request, spider: Spider) -> None:
        """Log a filtered request (the first only, unless ``DUPEFILTER_DEBUG``) and count it."""
        if self.debug:
            self.logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
                extra={"spider": spider},
            )
        elif self.logdupes:
            self.logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be "
                "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self.logdupes = False
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")

    # -- the filter's state ------------------------------------------------------

    def _tick(self, now: float) -> None:
        try:
            self._refresh(now)
        except redis.RedisError as e:
            self._next_refresh = now + self.stats_interval
            logger.warning("Could not refresh the dupefilter's state: %(error)s", {"error": e})

    def _refresh(self, now: float) -> None:
        """Read the state (one round trip), publish it as stats, warn, and renew the
        local cache's validity under ``DUPEFILTER_TTL``."""
        self._next_refresh = now + self.stats_interval
        state = self.backend.state()
        self.last_state = state
        if self.stats is not None:
            for name, value in state.stats().items():
                self.stats.set_value(name, value)
        self._report(state)
        if self.local is not None and self.ttl is not None:
            if now >= self._local_until or self._local_until == math.inf:
                # What the cache learns from now on is recorded in the filter alive
                # now, which expires in expires_in (or later: the state was read after
                # `now`), or in one created later, which lives the whole TTL.
                self.local.clear()
                left = state.expires_in if state.expires_in is not None else self.ttl
                self._local_until = now + left
            self._next_refresh = min(self._next_refresh, self._local_until)

    def _report(self, state: FilterState) -> None:
        """Log once per event: past the capacity, each growth, full, error rate too high."""
        if state.design_capacity is None:
            return
        args = {
            "key": state.key,
            "count": state.count,
            "design": state.design_capacity,
            "capacity": state.capacity,
            "stages": state.stages,
            "fpr": state.fpr_estimate,
            "rate": state.error_rate,
        }
        if state.count > state.design_capacity and not self._reported_over:
            self._reported_over = True
            then = (
                "it grows into bigger, stricter filters (BLOOM_ON_FULL = 'grow')"
                if state.on_full == "grow"
                else "new fingerprints are refused (BLOOM_ON_FULL = 'refuse')"
            )
            logger.warning(
                "Bloom dupefilter %(key)s holds %(count)d fingerprints, more than its "
                "capacity of %(design)d (BLOOM_CAPACITY): %(then)s. Size the next crawl "
                "for at least this many",
                {**args, "then": then},
            )
        if state.stages > self._stages_reported:
            self._stages_reported = state.stages
            logger.warning(
                "Bloom dupefilter %(key)s grew to %(stages)d filters: capacity %(capacity)d, "
                "%(count)d fingerprints, estimated false-positive rate %(fpr).3g "
                "(configured %(rate).3g)",
                args,
            )
        if state.full and not self._reported_full:
            self._reported_full = True
            logger.error(
                "Bloom dupefilter %(key)s is full (%(count)d fingerprints, %(stages)d "
                "filter(s)) and cannot grow: requests with new fingerprints are refused",
                args,
            )
        if state.fpr_estimate > 2 * state.error_rate and not self._reported_rate:
            self._reported_rate = True
            logger.warning(
                "Bloom dupefilter %(key)s: estimated false-positive rate %(fpr).3g is more "
                "than twice the configured %(rate).3g; about that share of new pages is "
                "skipped as if seen",
                args,
            )
