"""What every dupefilter backend shares: the protocol, its state, its errors.

:class:`DupefilterBackend` is the contract :class:`~scrapy_dist.dupefilter.RFPDupeFilter`
and the enqueue script rely on; :class:`ScriptedBackend` runs ``lua/dupefilter.lua``
for a backend's own adds and checks; :func:`filter_error` maps the errors the filter
scripts answer (``lua/_filters.lua``) to the package's exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import redis

from scrapy_dist.exceptions import ConfigurationError, ScrapyDistError, StaleFilterView
from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from redis.client import Pipeline

#: ``TYPE`` of a RedisBloom filter key (RedisBloom, valkey-bloom).
REDISBLOOM_TYPES = frozenset({"MBbloom--", "bloomfltr"})


class DupefilterFull(ScrapyDistError):
    """A Bloom dupefilter at its capacity refused new fingerprints.

    Raised when ``BLOOM_ON_FULL = "refuse"`` and a call could take the count past the
    capacity, or when a growing bitmap chain has no stage left. Nothing was written.
    """


_SCRIPT_ERRORS: dict[str, type[ScrapyDistError]] = {
    "DUPEFILTER_FULL": DupefilterFull,
    "DUPEFILTER_MISMATCH": ConfigurationError,
    "DUPEFILTER_STALE": StaleFilterView,
}


def filter_error(error: redis.ResponseError) -> ScrapyDistError | None:
    """Translate an error a filter script answered into the package's exception.

    The enqueue script and ``lua/dupefilter.lua`` answer ``DUPEFILTER_FULL`` (see
    :class:`DupefilterFull`), ``DUPEFILTER_MISMATCH`` (the filter in Redis was written
    with other Bloom parameters) or ``DUPEFILTER_STALE``
    (:class:`~scrapy_dist.exceptions.StaleFilterView`: retry after the backend's
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


def ttl_ms(ttl: float | None) -> int:
    """``DUPEFILTER_TTL`` in whole milliseconds (at least 1), or 0 for none."""
    return 0 if ttl is None else max(1, round(ttl * 1000))


def command(client: redis.Redis | Pipeline, *args: object) -> Any:
    """Run a command redis-py has no typed method for (``BF.*``)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def text(value: object) -> str:
    """A reply as text (redis-py answers bytes unless told otherwise)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def expires_in(pttl: object) -> float | None:
    """A ``PTTL`` reply in seconds; ``None`` for no expiry or no key."""
    ms = int(cast("int", pttl))
    return ms / 1000 if ms >= 0 else None


def copy_set(client: redis.Redis, set_key: str, backend: UnopenedBackend, batch: int = 1000) -> int:
    """Open ``backend`` and add to it every member of the set at ``set_key`` (``SSCAN``,
    then ``add_many`` per ``batch``; nothing is deleted): the loop of the migrations from
    a plain ``set`` dupefilter.

    Returns:
        The number of fingerprints that were new to ``backend``.
    """
    opened = backend.open()
    new = 0
    chunk: list[bytes] = []
    for member in client.sscan_iter(set_key, count=batch):
        chunk.append(member if isinstance(member, bytes) else str(member).encode())
        if len(chunk) >= batch:
            new += sum(opened.add_many(chunk))
            chunk = []
    if chunk:
        new += sum(opened.add_many(chunk))
    return new


def wrong_type(key: str, actual: str, backend: str) -> ConfigurationError:
    """The error for a dupefilter key that holds another backend's data (or anything
    else): what it holds, and what to do."""
    held = {
        "set": "a set (DUPEFILTER_BACKEND = 'set')",
        "hash": "a bitmap Bloom filter (DUPEFILTER_BACKEND = 'bitmap')",
        "bitmap": "a bitmap Bloom filter (DUPEFILTER_BACKEND = 'bitmap')",
        "buckets": "a bucketed exact filter (DUPEFILTER_BACKEND = 'buckets')",
        "zset": "an exact filter with a recrawl window (DUPEFILTER_BACKEND = 'set', "
        "DUPEFILTER_RECRAWL_AFTER)",
        "bf-window": "a RedisBloom filter with a recrawl window (DUPEFILTER_BACKEND = "
        "'redisbloom', DUPEFILTER_RECRAWL_AFTER)",
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
        backend: ``"set"``, ``"buckets"``, ``"bitmap"`` or ``"redisbloom"``.
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
        recrawl_after: The recrawl window in seconds (``None``: seen forever).
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
    recrawl_after: float | None = None

    def stats(self) -> dict[str, int | float | str]:
        """Crawler stats that describe this state (``dupefilter/...``)."""
        window: dict[str, int | float | str] = (
            {} if self.recrawl_after is None else {"dupefilter/recrawl_after": self.recrawl_after}
        )
        if self.backend == "set":
            return {"dupefilter/set/count": self.count, **window}
        if self.backend == "buckets":
            return {"dupefilter/buckets/count": self.count, **window}
        return {
            **window,
            "dupefilter/bloom/backend": self.backend,
            "dupefilter/bloom/count": self.count,
            "dupefilter/bloom/capacity": self.capacity or 0,
            "dupefilter/bloom/error_rate": self.error_rate,
            "dupefilter/bloom/fpr_estimate": self.fpr_estimate,
            "dupefilter/bloom/stages": self.stages,
        }


class DupefilterBackend(Protocol):
    """Where an :class:`~scrapy_dist.dupefilter.RFPDupeFilter` keeps fingerprints.

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


class UnopenedBackend(Protocol):
    """What ``DUPEFILTER_BACKEND`` gives before any I/O: a :class:`DupefilterBackend`,
    or a :class:`~scrapy_dist.filters.choice.BackendChoice` that picks one when it
    opens. Either knows its keys and can delete them; :meth:`open` gives the backend
    that filters."""

    def keys(self) -> list[str]:
        """Every key the backend (any candidate, for a choice) may own."""
        ...

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete every key of :meth:`keys`."""
        ...

    def open(self) -> DupefilterBackend:
        """Check (and create) the filter in Redis; return the backend that filters."""
        ...


#: Retries of a call refused as stale. With the growth guard a view is at most one
#: stage behind and calls are never stale; without it (tests) several may be needed.
STALE_RETRIES = 5


class ScriptedBackend:
    """Runs ``lua/dupefilter.lua`` for a backend's standalone adds and checks.

    A subclass provides ``client``, ``kind``, ``script_keys()``, ``script_args()`` and
    ``token()``, and overrides :meth:`_refresh_view` if it caches what Redis holds.
    """

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
        scripts = scripts_for(self.client)
        for attempt in range(STALE_RETRIES + 1):
            call = scripts.dupefilter(
                filter_keys=self.script_keys(),
                op=op,
                filter_kind=self.kind,
                filter_args=self.script_args(),
                tokens=tokens,
            )
            try:
                flags = call.run()
            except redis.ResponseError as e:
                translated = filter_error(e)
                if isinstance(translated, StaleFilterView) and attempt < STALE_RETRIES:
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
