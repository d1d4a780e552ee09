"""The bitmap Bloom backend (``DUPEFILTER_BACKEND = "bitmap"``): a scalable chain of
Bloom filters in plain Redis strings, on any server.

The maths (sizes, stages, offsets, the signature) are :mod:`scrapy_dist.bloom`'s; this
module owns the chain's keys in Redis and the worker's view of how many stages are open.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, ClassVar, cast

import mmh3

from scrapy_dist.bloom import HASH_SEED, bloom_chain, chain_false_positive_rate, signature
from scrapy_dist.config.components import check_on_full
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters.base import (
    FilterState,
    ScriptedBackend,
    expires_in,
    text,
    ttl_ms,
    wrong_type,
)
from scrapy_dist.filters.window import server_ms
from scrapy_dist.keys import key_type, window_generation_key, window_segment_key
from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

    from scrapy_dist.bloom import BloomParams
    from scrapy_dist.filters.window import RecrawlWindow
    from scrapy_dist.keys import RedisKeys

#: Seconds a worker trusts its view of how many stages a bitmap chain has open.
VIEW_INTERVAL = 5.0

#: Share of its capacity a bitmap stage holds when the worker pre-sizes the next one.
PREPARE_AT = 0.5

#: Seconds a stage stays open before the next may open: three view intervals, so that
#: no worker's view is ever more than one stage behind (see BitmapBloomBackend).
GROWTH_GUARD = 3 * VIEW_INTERVAL


def _int_fields(raw: dict[bytes, bytes]) -> dict[str, int]:
    """The chain hash's numeric fields (``stages``, ``n<s>``, ``t<s>``)."""
    return {k.decode(): int(v) for k, v in raw.items() if k != b"sig" and v.lstrip(b"-").isdigit()}


class BitmapBloomBackend(ScriptedBackend):
    """A scalable Bloom filter in plain Redis strings, tested and set by Lua.

    Layout: the dupefilter key is a hash holding the parameters' signature
    (:func:`scrapy_dist.bloom.signature`), the number of open stages and each stage's
    count and opening time; the bits of stage ``s`` are in ``<dupefilter>:<s>:<i>``,
    ``i`` counting segments of ``params.segment_bits`` (at most 2**32 bits, 512 MiB,
    the largest Redis string; :func:`scrapy_dist.bloom.fit_segments` picks a size the
    allocator does not round up). Segments are created at full size by
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
        window: the recrawl window (``DUPEFILTER_RECRAWL_AFTER``): ``params`` then
            sizes one generation, each a chain of its own (see
            :mod:`scrapy_dist.filters.window`); the dupefilter key holds the signature
            (with the window) and the run id generations are named after. Calls pass
            the main key and every stage's sizes; the script derives the generations'
            keys. The worker pre-sizes stage 0 of the current and the next generation
            (and the next stage of the current one when due) whenever it re-reads its
            view, at least twice per generation.

    Raises:
        ConfigurationError: ``on_full`` is not one of
            :data:`scrapy_dist.config.components.ON_FULL`.
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
        window: RecrawlWindow | None = None,
    ) -> None:
        check_on_full(on_full)
        self.window = window
        if window is not None:
            view_interval = min(view_interval, window.generation_ms / 2000)
            growth_guard = 0
        self.client = client
        self.key = keys.dupefilter
        self.params = params
        self.ttl = ttl
        self.on_full = on_full
        self.view_interval = view_interval
        self.growth_guard = growth_guard
        #: The stages the chain may open, first one first.
        self.stages = bloom_chain(params)
        self.signature = signature(params)
        if window is not None:
            self.signature += " " + window.describe()
        #: The windowed chain's run id (generation names), as last read.
        self._run_id: str | None = None
        #: (generation, stage) pairs this worker has pre-sized (window only).
        self._prepared_gens: set[tuple[int, int]] = set()
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

    @property
    def seen_for(self) -> float | None:
        """Seconds a record surely counts as seen (``None``: forever)."""
        return None if self.window is None else self.window.rotating_seen_for

    def _set_view(self, live: int) -> None:
        """Adopt ``live`` open stages: calls pass their keys and the next stage's (with
        a window: the main key and every stage's sizes)."""
        self._live = live
        passed = min(max(live, 1) + 1, len(self.stages))
        if self.window is not None:
            passed = len(self.stages)
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
            if self.window is None:
                keys += segment_keys
            numbers += (stage.bits, stage.hashes, stage.capacity)
        args: list[str | int | float] = [
            ttl_ms(self.ttl),
            self.signature,
            self.on_full,
            json.dumps(numbers, separators=(",", ":")),
        ]
        if self.window is not None:
            args += self.window.script_args()
        self._passed = passed
        self._layout = (keys, args)

    def _read(self) -> tuple[dict[bytes, bytes], object]:
        if self.window is not None:
            return self._read_window()
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.key)
            pipe.pttl(self.key)
            meta, pttl = pipe.execute()
        fields = cast("dict[bytes, bytes]", meta)
        self._set_view(int(fields.get(b"stages", 0)))
        self._viewed_at = time.monotonic()
        self._prepare_next(fields)
        return fields, pttl

    # -- the recrawl window ----------------------------------------------------------

    def _generation_key(self, run: str, generation: int) -> str:
        return window_generation_key(self.key, run, generation)

    def _read_window(self) -> tuple[dict[bytes, bytes], object]:
        """Read the main hash and the server's clock; pre-size what is due: stage 0 of
        the current and the next generation, the next stage of the current one once
        its last holds :data:`PREPARE_AT` of its capacity."""
        window = cast("RecrawlWindow", self.window)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.key)
            pipe.pttl(self.key)
            pipe.time()
            meta, pttl, now = pipe.execute()
        fields = cast("dict[bytes, bytes]", meta)
        self._set_view(0)
        self._viewed_at = time.monotonic()
        run = fields.get(b"run")
        run_id = None if run is None else text(run)
        if run_id != self._run_id:  # a new filter (flushed, finished): nothing prepared
            self._prepared_gens.clear()
        self._run_id = run_id
        if self._run_id is None:
            return fields, pttl
        current = server_ms(now) // window.generation_ms
        self._prepared_gens = {p for p in self._prepared_gens if p[0] >= current}
        for generation in (current, current + 1):
            if (generation, 0) not in self._prepared_gens:
                self.prepare_generation(generation, 0)
        if self.on_full == "grow":
            chain = self._generation_key(self._run_id, current)
            raw = cast("dict[bytes, bytes]", self.client.hgetall(chain))
            live = int(raw.get(b"stages", 0))
            if 0 < live < len(self.stages) and (current, live) not in self._prepared_gens:
                count = int(raw.get(f"n{live - 1}".encode(), 0))
                if count >= self.stages[live - 1].capacity * PREPARE_AT:
                    self.prepare_generation(current, live)
        return fields, pttl

    def prepare_generation(self, generation: int, stage: int) -> int:
        """Create the segments of ``stage`` of a windowed ``generation`` at full size if
        missing, expiring when the generation leaves the window (one call each).

        Returns:
            The number of segments created.
        """
        window = cast("RecrawlWindow", self.window)
        if self._run_id is None:
            return 0
        chain = self._generation_key(self._run_id, generation)
        scripts = scripts_for(self.client)
        spec = self.stages[stage]
        created = 0
        for i in range(spec.segments):
            size = min(self.params.segment_bits, spec.bits - i * self.params.segment_bits)
            call = scripts.dupefilter_prepare(
                chain=chain,
                segment=window_segment_key(chain, stage, i),
                bits=size,
                expire_at=window.expires_at(generation),
            )
            created += int(call.run())
        self._prepared_gens.add((generation, stage))
        return created

    def _window_chains(self) -> list[dict[str, int]]:
        """The numeric fields of every generation alive (one round trip after the
        view's; none before the filter exists)."""
        window = cast("RecrawlWindow", self.window)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hget(self.key, "run")
            pipe.time()
            run, now = pipe.execute()
        if run is None:
            return []
        generations = window.generations(server_ms(now))
        with self.client.pipeline(transaction=False) as pipe:
            for generation in generations:
                pipe.hgetall(self._generation_key(text(run), generation))
            chains = pipe.execute()
        return [_int_fields(cast("dict[bytes, bytes]", c)) for c in chains if c]

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
        scripts = scripts_for(self.client)
        spec = self.stages[stage]
        created = 0
        for i, key in enumerate(self._segment_keys[stage]):
            size = min(self.params.segment_bits, spec.bits - i * self.params.segment_bits)
            created += int(scripts.dupefilter_prepare(chain=self.key, segment=key, bits=size).run())
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
        """The chain's hash and every segment of every stage it may open (with a
        window: the main hash; deleting it retires every generation, whose keys expire
        within one window)."""
        if self.window is not None:
            return [self.key]
        return [self.key, *(key for stage in self._segment_keys for key in stage)]

    def open(self) -> BitmapBloomBackend:
        """Create the chain's hash if missing and check its parameters.

        Raises:
            ConfigurationError: the key holds something else, or a chain written with
                other Bloom parameters (which would make every lookup wrong).
        """
        actual = key_type(self.client, self.key)
        if actual not in ("none", "hash"):
            raise wrong_type(self.key, actual, "a bitmap Bloom filter")
        if actual == "hash" and self.client.hexists(self.key, "gen"):
            raise wrong_type(self.key, "buckets", "a bitmap Bloom filter")
        try:
            self._run("add", [])
        except ConfigurationError as e:
            stored = text(self.client.hget(self.key, "sig"))
            raise ConfigurationError(
                f"The Bloom dupefilter {self.key!r} was created with {stored}, but these "
                f"settings give {self.signature}. A Bloom filter cannot be resized nor "
                "given another recrawl window: restore BLOOM_CAPACITY and "
                "BLOOM_ERROR_RATE (or BLOOMFILTER_BIT and BLOOMFILTER_HASH_NUMBER) and "
                "DUPEFILTER_RECRAWL_AFTER, or delete the crawl's dupefilter keys (its "
                "pages are then crawled again)"
            ) from e
        self._read()
        return self

    def __len__(self) -> int:
        if self.window is not None:
            chains = self._window_chains()
        else:
            chains = [_int_fields(cast("dict[bytes, bytes]", self.client.hgetall(self.key)))]
        return sum(v for fields in chains for k, v in fields.items() if k.startswith("n"))

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete the chain: its hash and every segment (with a window: the main hash,
        which retires every generation; they expire within one window)."""
        (pipe or self.client).delete(*self.keys())
        self._prepared.clear()
        self._prepared_gens.clear()
        self._run_id = None
        if pipe is None:
            self._set_view(0)

    def _window_state(self) -> FilterState:
        raw, pttl = self._read()
        chains = self._window_chains()
        counts: list[int] = []
        stages_open = 1
        fpr = 0.0
        for fields in chains:
            live = min(fields.get("stages", 0), len(self.stages))
            stages = self.stages[: max(live, 1)]
            stage_counts = [fields.get(f"n{s}", 0) for s in range(len(stages))]
            counts += stage_counts
            stages_open = max(stages_open, len(stages))
            fpr += abs(chain_false_positive_rate(stages, stage_counts))
        window = cast("RecrawlWindow", self.window)
        return FilterState(
            backend="bitmap",
            key=self.key,
            count=sum(counts),
            capacity=self.params.capacity * max(1, len(chains)),
            design_capacity=self.params.capacity * round(window.ms / window.generation_ms),
            error_rate=self.params.error_rate,
            fpr_estimate=min(1.0, fpr),
            stages=stages_open,
            expires_in=expires_in(pttl),
            exists=bool(raw),
            on_full=self.on_full,
            full=False,
            recrawl_after=window.seconds,
        )

    def state(self) -> FilterState:
        """Counts per stage, their capacities and the chain's estimated error rate
        (with a window: summed over the generations alive)."""
        if self.window is not None:
            return self._window_state()
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
            expires_in=expires_in(pttl),
            exists=bool(raw),
            on_full=self.on_full,
            full=stuck and counts[-1] >= stages[-1].capacity,
        )
