"""The maths of a Bloom filter: sizes, hash offsets, segments, error rates, the chain
of stages a filter grows into, and the signature a bitmap filter stores. No I/O.

This module is over 500 lines on purpose: it is one concept, the Bloom filter's
arithmetic and stored format, in about 200 lines of code; the rest is the docstrings
that specify the formulas every worker (and the Lua of ``lua/_filters.lua``) must
compute alike.

Two users share it:

* the Redis bitmap dupefilter (:mod:`scrapy_dist.filters.bitmap`), whose bits live
  in one or more Redis string keys ("segments", each at most :data:`SEGMENT_BITS`
  bits, the 512 MiB limit of a Redis string). Its Lua (``lua/_filters.lua``) derives
  the offsets below from the fingerprint's MurmurHash3, which the worker sends;
  :meth:`BloomParams.offsets` is their Python reference;
* :class:`LocalBloom`, a small in-memory filter over a :class:`bitarray.bitarray`.

The offsets of a fingerprint are part of the stored format: a filter already in Redis
is only meaningful if every worker computes exactly the same offsets for the same
``(bits, hashes)``. They are (``m`` bits, ``k`` hashes)::

    h1, h2 = the two 64-bit halves of MurmurHash3_x64_128(fingerprint, seed=0),
             read as unsigned integers (mmh3.hash64(..., signed=False))
    g_i    = (h1 + i*h2 + (i**3 - i) // 6) mod m        for i in 0 .. k-1

which is *enhanced double hashing* (Kirsch & Mitzenmacher 2006; Dillinger & Manolios
2004): ``k`` effectively independent hash functions from one 128-bit hash. The cubic
term keeps the ``k`` offsets distinct even when ``h2 mod m`` shares a factor with
``m`` (e.g. ``m`` a power of two), the degenerate case of plain double hashing.
``segment_bits`` is not part of that format: it only decides how the ``m`` bits are
cut into keys. A bitmap chain in Redis records its first stage's numbers (segment
size included) and its growth factors in a signature (:func:`signature`, read back by
:func:`parse_signature`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import mmh3
from bitarray.util import zeros

if TYPE_CHECKING:
    from collections.abc import Iterable

#: Bits one Redis string can hold (512 MiB = 2**32 bits, ``SETBIT`` offsets
#: 0 .. 2**32-1): the largest segment allowed, and the default segment size.
SEGMENT_BITS = 2**32

#: Largest filter accepted, in bits: 2**40 bits = 128 GiB, i.e. 256 full segments.
#: Anything bigger does not fit a Redis deployment this package targets.
MAX_BITS = 2**40

#: Largest number of hash functions accepted (``BLOOMFILTER_HASH_NUMBER`` range).
MAX_HASHES = 64

#: Smallest ``bit_exponent`` accepted by :meth:`BloomParams.from_bits`.
MIN_BIT_EXPONENT = 1

#: Largest ``bit_exponent`` accepted by :meth:`BloomParams.from_bits` (2**40 bits is
#: :data:`MAX_BITS`).
MAX_BIT_EXPONENT = 40

#: Seed of the MurmurHash3 hash. Part of the stored format: changing it makes every
#: existing filter answer "never seen" for everything.
HASH_SEED = 0

#: Largest bitmap (bytes) a :class:`LocalBloom` accepts: 1 GiB.
MAX_LOCAL_BYTES = 2**30

#: Most stages a bitmap Bloom chain grows to: 255 times its first capacity in all
#: (fewer when a stage would exceed :data:`MAX_BITS`).
MAX_STAGES = 8

#: Capacity factor between stages of a growing filter (RedisBloom's default expansion).
GROWTH = 2

#: Error-rate factor between stages (RedisBloom's tightening ratio), which keeps a
#: chain's false-positive rate under twice the first stage's however long it grows.
TIGHTENING = 0.5

#: Version of the bitmap format (offsets, token, hash fields), part of every signature.
BITMAP_FORMAT = "v1"

#: Bytes a Redis string needs beyond its content (sds header, terminator), rounded up.
_STRING_OVERHEAD = 64

#: Bitmaps smaller than this stay in one key, whatever the allocator rounds.
_MIN_FIT_BYTES = 64 * 1024


def _require_int(name: str, value: object) -> None:
    """Reject anything that is not a true ``int`` (``bool`` and ``float`` included).

    Args:
        name: The argument's name, for the message.
        value: The value to check.

    Raises:
        TypeError: If ``value`` is not an ``int`` or is a ``bool``.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")


def _check_error_rate(name: str, value: float) -> None:
    """Check that a probability lies strictly between 0 and 1.

    Args:
        name: The argument's name, for the message.
        value: The value to check.

    Raises:
        TypeError: If ``value`` is not a real number.
        ValueError: If ``value`` is not in the open interval (0, 1) (NaN included).
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}: {value!r}")
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")


@dataclass(frozen=True)
class BloomParams:
    """Size and hashing of one Bloom filter, and the maths that follow from them.

    Immutable and hashable; validated on construction. Build it with
    :meth:`from_capacity` (size for ``capacity`` items at ``error_rate``) or
    :meth:`from_bits` (scrapy-redis-bloomfilter's ``BLOOMFILTER_BIT`` and
    ``BLOOMFILTER_HASH_NUMBER``), or directly when all four numbers are known.

    ``capacity`` and ``error_rate`` are the design point and change nothing in the
    offsets: they say how many insertions the filter is meant for and the
    false-positive rate the design aims at when it holds that many. The estimate at
    any count is :meth:`false_positive_rate`.

    Attributes:
        bits: ``m``, number of bits, 1 .. :data:`MAX_BITS`.
        hashes: ``k``, number of hash functions (bits set per item),
            1 .. :data:`MAX_HASHES`.
        capacity: Design number of items, >= 1.
        error_rate: Design false-positive rate at ``capacity`` items, in (0, 1).
        segment_bits: Bits per Redis key, 1 .. :data:`SEGMENT_BITS`; the filter spans
            :attr:`segments` keys. Only the split changes with it, never the offsets.
    """

    bits: int
    hashes: int
    capacity: int
    error_rate: float
    segment_bits: int = SEGMENT_BITS
    #: ``(i, (i**3 - i) // 6)`` for ``i`` in ``0 .. hashes-1``, precomputed for speed.
    _terms: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Validate the fields and precompute the hashing terms.

        Raises:
            TypeError: If a field has the wrong type.
            ValueError: If a field is out of range.
        """
        for name in ("bits", "hashes", "capacity", "segment_bits"):
            _require_int(name, getattr(self, name))
        if not 1 <= self.bits <= MAX_BITS:
            raise ValueError(
                f"bits must be between 1 and {MAX_BITS} (2**40), got {self.bits}; "
                "a bigger filter needs a bigger error_rate or a smaller capacity"
            )
        if not 1 <= self.hashes <= MAX_HASHES:
            raise ValueError(f"hashes must be between 1 and {MAX_HASHES}, got {self.hashes}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        _check_error_rate("error_rate", self.error_rate)
        if not 1 <= self.segment_bits <= SEGMENT_BITS:
            raise ValueError(
                f"segment_bits must be between 1 and {SEGMENT_BITS} (2**32, the size "
                f"limit of a Redis string), got {self.segment_bits}"
            )
        terms = tuple((i, (i**3 - i) // 6) for i in range(self.hashes))
        object.__setattr__(self, "_terms", terms)

    @classmethod
    def from_capacity(
        cls, capacity: int, error_rate: float, *, segment_bits: int = SEGMENT_BITS
    ) -> BloomParams:
        """Size a filter for ``capacity`` items at a false-positive rate ``error_rate``.

        Uses the standard optimum ``m = ceil(-n ln p / (ln 2)**2)`` and
        ``k = max(1, round(m / n * ln 2))``. Rounding ``k`` to an integer moves the
        estimate at ``capacity`` a little (about 0.2 % above ``error_rate`` for
        ``(1000, 0.01)``); :meth:`false_positive_rate` gives the exact estimate.

        Args:
            capacity: ``n``, number of items the filter must hold, >= 1.
            error_rate: ``p``, wanted false-positive rate at ``capacity``, in (0, 1).
            segment_bits: Bits per Redis key (see the class).

        Returns:
            Params with these ``capacity`` and ``error_rate``.

        Raises:
            TypeError: If ``capacity`` is not an int or ``error_rate`` not a number.
            ValueError: If ``capacity < 1``, ``error_rate`` is not in (0, 1), or the
                filter would need more than :data:`MAX_BITS` bits or
                :data:`MAX_HASHES` hashes.
        """
        _require_int("capacity", capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        _check_error_rate("error_rate", error_rate)
        bits = math.ceil(-capacity * math.log(error_rate) / (math.log(2) ** 2))
        hashes = max(1, round(bits / capacity * math.log(2)))
        return cls(
            bits=bits,
            hashes=hashes,
            capacity=capacity,
            error_rate=error_rate,
            segment_bits=segment_bits,
        )

    @classmethod
    def from_bits(
        cls,
        bit_exponent: int,
        hashes: int,
        *,
        error_rate: float | None = None,
        segment_bits: int = SEGMENT_BITS,
    ) -> BloomParams:
        """Build params from scrapy-redis-bloomfilter's settings.

        ``m = 2**bit_exponent`` (``BLOOMFILTER_BIT``, e.g. 30 for 128 MiB) and
        ``k = hashes`` (``BLOOMFILTER_HASH_NUMBER``, e.g. 6). The same bits and
        hashes give the same sizes, not the same offsets as that package: its hash
        functions are different, so its existing filters cannot be reused.

        The design point is derived, not given:

        * without ``error_rate``: ``capacity`` is the count for which ``k`` is the
          optimal number of hashes, ``floor(m ln 2 / k)`` (at least 1), and
          ``error_rate`` is the estimate there (about ``2**-k``);
        * with ``error_rate``: ``capacity`` is :meth:`capacity_at` that rate, the
          largest count whose estimated false-positive rate is <= ``error_rate``.

        Args:
            bit_exponent: ``log2(m)``, :data:`MIN_BIT_EXPONENT` ..
                :data:`MAX_BIT_EXPONENT` (1 .. 40). Exponents above 32 span several
                Redis keys.
            hashes: ``k``, 1 .. :data:`MAX_HASHES`.
            error_rate: Optional design false-positive rate, in (0, 1).
            segment_bits: Bits per Redis key (see the class).

        Returns:
            Params with ``bits == 2**bit_exponent`` and ``hashes == hashes``.

        Raises:
            TypeError: If an argument has the wrong type.
            ValueError: If ``bit_exponent`` or ``hashes`` is out of range, if
                ``error_rate`` is not in (0, 1), or if even one item would exceed it.
        """
        _require_int("bit_exponent", bit_exponent)
        _require_int("hashes", hashes)
        if not MIN_BIT_EXPONENT <= bit_exponent <= MAX_BIT_EXPONENT:
            raise ValueError(
                f"bit_exponent must be between {MIN_BIT_EXPONENT} and {MAX_BIT_EXPONENT}, "
                f"got {bit_exponent}"
            )
        if not 1 <= hashes <= MAX_HASHES:
            raise ValueError(f"hashes must be between 1 and {MAX_HASHES}, got {hashes}")
        bits = 2**bit_exponent
        # Provisional design point, only so that the helpers below can run.
        probe = cls(bits=bits, hashes=hashes, capacity=1, error_rate=0.5)
        if error_rate is None:
            capacity = max(1, math.floor(bits * math.log(2) / hashes))
            rate = probe.false_positive_rate(capacity)
        else:
            _check_error_rate("error_rate", error_rate)
            capacity = probe.capacity_at(error_rate)
            if capacity < 1:
                raise ValueError(
                    f"a filter of 2**{bit_exponent} bits and {hashes} hashes exceeds "
                    f"error_rate={error_rate!r} with a single item"
                )
            rate = error_rate
        return cls(
            bits=bits,
            hashes=hashes,
            capacity=capacity,
            error_rate=rate,
            segment_bits=segment_bits,
        )

    @property
    def segments(self) -> int:
        """Number of Redis keys the bits span: ``ceil(bits / segment_bits)``.

        Segments ``0 .. segments-2`` hold ``segment_bits`` bits; the last one holds
        the rest.
        """
        return -(-self.bits // self.segment_bits)

    @property
    def memory_bytes(self) -> int:
        """Size of the bitmap in bytes, ``ceil(bits / 8)``, once every bit was touched.

        Redis allocates a key up to the highest bit set so far, so a fresh filter
        grows to this size quickly. When ``segment_bits`` is not a multiple of 8
        each key is rounded up to whole bytes, a few bytes more in total.
        """
        return -(-self.bits // 8)

    def offsets(self, fingerprint: bytes) -> list[int]:
        """The ``k`` bit offsets of a fingerprint, in ``[0, bits)``.

        Deterministic across processes, machines and Python versions (see the module
        docstring for the exact formula). Offsets are returned in hash order
        ``g_0 .. g_{k-1}``; for a realistic ``m`` they are almost always ``k``
        distinct values (two coincide with probability about ``k**2 / (2 m)``).

        Args:
            fingerprint: The item, as bytes (e.g. a 20-byte Scrapy request
                fingerprint); any length.

        Returns:
            A new list of ``hashes`` ints.
        """
        h1, h2 = mmh3.hash64(fingerprint, seed=HASH_SEED, x64arch=True, signed=False)
        m = self.bits
        # Reducing first keeps the arithmetic on small ints; same result mod m.
        a = h1 % m
        b = h2 % m
        return [(a + i * b + c) % m for i, c in self._terms]

    def locate(self, offset: int) -> tuple[int, int]:
        """Map a filter offset to the Redis key that holds it.

        Args:
            offset: Bit offset in ``[0, bits)``.

        Returns:
            ``(segment, bit)``: the 0-based segment index, in ``[0, segments)``, and
            the bit offset inside that segment, in ``[0, segment_bits)``, such that
            ``offset == segment * segment_bits + bit``.

        Raises:
            ValueError: If ``offset`` is outside ``[0, bits)``.
        """
        if not 0 <= offset < self.bits:
            raise ValueError(f"offset must be in [0, {self.bits}), got {offset}")
        segment, bit = divmod(offset, self.segment_bits)
        return segment, bit

    def locate_all(self, fingerprint: bytes) -> list[tuple[int, int]]:
        """:meth:`locate` applied to every offset of a fingerprint, in hash order.

        Args:
            fingerprint: The item, as bytes.

        Returns:
            ``hashes`` pairs ``(segment, bit)``.
        """
        size = self.segment_bits
        return [divmod(offset, size) for offset in self.offsets(fingerprint)]

    def locate_flat(self, fingerprints: Iterable[bytes]) -> list[int]:
        """ARGV for a Lua script that sets or tests the bits of many fingerprints.

        The contract with the script:

        * ``KEYS`` are the filter's segment keys in segment order, all
          :attr:`segments` of them (one key when the filter fits a Redis string);
        * the returned list is ``2 * hashes`` ints per fingerprint, fingerprints in
          the order given, each fingerprint's pairs in hash order:
          ``segment, bit, segment, bit, ...``. ``segment`` is 0-based, so the key is
          ``KEYS[segment + 1]`` in Lua, and ``bit`` is the ``SETBIT``/``GETBIT``
          offset inside it (< 2**32, exact in a Lua number).

        The script needs ``hashes`` to know where a fingerprint's pairs end; pass it
        alongside (e.g. as ``ARGV[1]``, the list after it). For one fingerprint ``j``
        (0-based) and hash ``i``, the pair is at 0-based positions
        ``2 * (j * hashes + i)`` and ``+ 1`` of the returned list. The fingerprint
        was new if any ``SETBIT`` of its pairs returned 0, and is (probably) present
        if every ``GETBIT`` returns 1.

        Args:
            fingerprints: The items, as bytes. A single ``bytes`` is refused, since
                it would be read as a sequence of ints.

        Returns:
            A new flat list of ``2 * hashes * len(fingerprints)`` ints.

        Raises:
            TypeError: If ``fingerprints`` is itself a bytes-like object.
        """
        if isinstance(fingerprints, (bytes, bytearray, memoryview)):
            raise TypeError("locate_flat() takes an iterable of fingerprints, not one")
        size = self.segment_bits
        flat: list[int] = []
        extend = flat.extend
        for fingerprint in fingerprints:
            for offset in self.offsets(fingerprint):
                extend(divmod(offset, size))
        return flat

    def false_positive_rate(self, count: int) -> float:
        """Estimated false-positive rate after ``count`` distinct insertions.

        The classic estimate ``(1 - exp(-k * count / m)) ** k``, which assumes
        independent, uniform hash functions (enhanced double hashing is close to
        that) and is accurate for any ``m`` worth using.

        Args:
            count: Number of distinct items inserted, >= 0.

        Returns:
            A probability in ``[0, 1]``; 0.0 for ``count == 0``.

        Raises:
            ValueError: If ``count`` is negative.
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        filled = -math.expm1(-self.hashes * count / self.bits)
        rate: float = filled**self.hashes
        return rate

    def capacity_at(self, error_rate: float) -> int:
        """Largest number of insertions whose estimated rate stays within a bound.

        The inverse of :meth:`false_positive_rate`:
        ``n = floor(-(m / k) * ln(1 - p ** (1 / k)))``, corrected to the exact
        integer.

        Args:
            error_rate: The bound ``p``, in (0, 1).

        Returns:
            The largest ``n >= 0`` with ``false_positive_rate(n) <= error_rate``
            (0 when even one item exceeds it).

        Raises:
            TypeError: If ``error_rate`` is not a number.
            ValueError: If ``error_rate`` is not in (0, 1).
        """
        _check_error_rate("error_rate", error_rate)
        k = self.hashes
        count = max(0, math.floor(-(self.bits / k) * math.log1p(-(error_rate ** (1 / k)))))
        while count > 0 and self.false_positive_rate(count) > error_rate:
            count -= 1
        while self.false_positive_rate(count + 1) <= error_rate:
            count += 1
        return count

    def stage(self, index: int, *, growth: int = 2, tightening: float = 0.5) -> BloomParams:
        """Params of the ``index``-th filter of a scalable chain that starts here.

        A scalable Bloom filter (Almeida et al. 2007; RedisBloom's ``EXPANSION``)
        adds a new, bigger and stricter filter when the current one reaches its
        capacity; a lookup checks every stage. Stage 0 is ``self`` unchanged. Stage
        ``i >= 1`` is ``from_capacity(capacity * growth**i, error_rate *
        tightening**i)`` with the same ``segment_bits`` (so its ``bits`` is in
        general not a power of two, even when ``self`` came from :meth:`from_bits`).
        With ``tightening < 1`` the chain's design bound
        (:func:`chain_false_positive_rate`) stays below
        ``error_rate / (1 - tightening)`` however long the chain grows; with
        ``tightening == 1`` it grows with every stage.

        Args:
            index: Stage number, >= 0.
            growth: Capacity factor between stages, >= 1.
            tightening: Error-rate factor between stages, in (0, 1].

        Returns:
            The stage's params.

        Raises:
            TypeError: If ``index`` or ``growth`` is not an int.
            ValueError: If an argument is out of range, or the stage would exceed
                :data:`MAX_BITS` bits or :data:`MAX_HASHES` hashes.
        """
        _require_int("index", index)
        _require_int("growth", growth)
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        if growth < 1:
            raise ValueError(f"growth must be >= 1, got {growth}")
        if not 0.0 < tightening <= 1.0:
            raise ValueError(f"tightening must be in (0, 1], got {tightening!r}")
        if index == 0:
            return self
        rate = self.error_rate * tightening**index
        if rate <= 0.0:
            raise ValueError(f"stage {index} has an error rate that underflows to 0")
        return BloomParams.from_capacity(
            self.capacity * growth**index, rate, segment_bits=self.segment_bits
        )


def chain_false_positive_rate(
    stages: Iterable[BloomParams], counts: Iterable[int] | None = None
) -> float:
    """False-positive rate of a chain of filters queried together.

    An item is reported as seen if any stage reports it, so with independent stages
    the rate is ``1 - prod(1 - p_i)`` (which is <= ``sum(p_i)``).

    Args:
        stages: The chain's params, e.g. ``[base.stage(i) for i in range(n)]``.
        counts: Number of items in each stage, same length as ``stages``. Without
            it every ``p_i`` is the stage's design ``error_rate``: the bound that
            holds while no stage holds more than its ``capacity``. With it, ``p_i``
            is ``stage.false_positive_rate(count)``.

    Returns:
        A probability in ``[0, 1]``; 0.0 for an empty chain.

    Raises:
        ValueError: If ``counts`` and ``stages`` differ in length, or a count is
            negative.
    """
    stages = list(stages)
    if counts is None:
        rates = [stage.error_rate for stage in stages]
    else:
        counts = list(counts)
        if len(counts) != len(stages):
            raise ValueError(
                f"counts must have one entry per stage: {len(counts)} counts "
                f"for {len(stages)} stages"
            )
        rates = [
            stage.false_positive_rate(count) for stage, count in zip(stages, counts, strict=True)
        ]
    if any(rate >= 1.0 for rate in rates):
        return 1.0
    # 1 - prod(1 - p) without the cancellation of tiny rates.
    return -math.expm1(math.fsum(math.log1p(-rate) for rate in rates))


def bloom_chain(params: BloomParams, most: int = MAX_STAGES) -> tuple[BloomParams, ...]:
    """The stages a growing Bloom filter may open: ``params.stage(i)`` for ``i < most``.

    Each stage has :data:`GROWTH` times the capacity of the one before at
    :data:`TIGHTENING` times its error rate. The chain stops early at a stage that
    would exceed :data:`MAX_BITS` bits or :data:`MAX_HASHES` hashes.

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


def signature(params: BloomParams) -> str:
    """The signature a bitmap chain stores: everything that decides where a
    fingerprint's bits are, in readable form (the format version, the first stage's
    numbers, :data:`GROWTH` and :data:`TIGHTENING`). Two workers may share a chain
    only if their signatures are equal (the Lua compares them)."""
    return (
        f"{BITMAP_FORMAT} bits={params.bits} hashes={params.hashes} "
        f"capacity={params.capacity} error_rate={params.error_rate!r} "
        f"segment_bits={params.segment_bits} growth={GROWTH} tightening={TIGHTENING!r}"
    )


def parse_signature(text: str) -> BloomParams | None:
    """The first stage a chain with signature ``text`` was created with.

    Args:
        text: A stored signature (untrusted: any text).

    Returns:
        The params whose :func:`signature` is exactly ``text``, or ``None`` when
        ``text`` is not one this version writes (another format version, other growth
        factors, missing or invalid numbers).
    """
    fields = dict(part.split("=", 1) for part in text.split()[1:] if "=" in part)
    try:
        params = BloomParams(
            bits=int(fields["bits"]),
            hashes=int(fields["hashes"]),
            capacity=int(fields["capacity"]),
            error_rate=float(fields["error_rate"]),
            segment_bits=int(fields["segment_bits"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return params if signature(params) == text else None


class LocalBloom:
    """An in-memory Bloom filter, e.g. a worker's small cache of fingerprints it saw.

    Uses exactly the offsets of :meth:`BloomParams.offsets`, over one
    :class:`bitarray.bitarray` of ``params.bits`` bits (``segment_bits`` is
    ignored). No false negatives: every fingerprint added is reported present.
    Not thread-safe.
    """

    __slots__ = ("_bits", "_count", "_params")

    def __init__(self, params: BloomParams) -> None:
        """Allocate a zeroed bitmap for ``params``.

        Args:
            params: Size and hashing of the filter.

        Raises:
            ValueError: If the bitmap would exceed :data:`MAX_LOCAL_BYTES` (1 GiB).
        """
        if params.memory_bytes > MAX_LOCAL_BYTES:
            raise ValueError(
                f"a local Bloom filter of {params.bits} bits needs {params.memory_bytes} "
                f"bytes, more than the {MAX_LOCAL_BYTES} allowed for an in-memory "
                "cache; use a smaller capacity or a larger error_rate"
            )
        self._params = params
        self._bits = zeros(params.bits)
        self._count = 0

    @property
    def params(self) -> BloomParams:
        """The filter's params."""
        return self._params

    @property
    def count(self) -> int:
        """Number of :meth:`add` calls that returned True.

        A lower bound of the distinct items added: a new item whose bits were all
        set already (a false positive) is not counted.
        """
        return self._count

    def add(self, fingerprint: bytes) -> bool:
        """Add a fingerprint: set its ``k`` bits.

        Args:
            fingerprint: The item, as bytes.

        Returns:
            True if it was new, i.e. at least one of its bits was 0 before (the
            item was certainly not added before); False if all were set already
            (added before, or a false positive).
        """
        bits = self._bits
        new = False
        for offset in self._params.offsets(fingerprint):
            if not bits[offset]:
                bits[offset] = 1
                new = True
        if new:
            self._count += 1
        return new

    def __contains__(self, fingerprint: bytes) -> bool:
        """Whether a fingerprint is (probably) present: all its bits are set.

        Args:
            fingerprint: The item, as bytes.

        Returns:
            True for every fingerprint added; True with probability about
            :meth:`false_positive_rate` for one never added.
        """
        return all(map(self._bits.__getitem__, self._params.offsets(fingerprint)))

    def clear(self) -> None:
        """Forget everything: zero every bit and reset :attr:`count` to 0.

        A cache that has reached ``params.capacity`` can be cleared instead of
        letting its false-positive rate climb.
        """
        self._bits.setall(0)
        self._count = 0

    def false_positive_rate(self) -> float:
        """Estimated false-positive rate at the current :attr:`count`.

        Returns:
            ``params.false_positive_rate(count)``.
        """
        return self._params.false_positive_rate(self._count)
