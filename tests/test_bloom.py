"""Tests of scrapy_dist.bloom: sizing formulas, offsets, segments, error rates, chains
and the stored signature."""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import Counter

import mmh3
import pytest
from bitarray.util import zeros

from scrapy_dist.bloom import (
    MAX_BITS,
    MAX_LOCAL_BYTES,
    SEGMENT_BITS,
    BloomParams,
    LocalBloom,
    chain_false_positive_rate,
    fit_segments,
    parse_signature,
    signature,
)


def random_fingerprints(seed: int, count: int, size: int = 20) -> list[bytes]:
    """``count`` reproducible random fingerprints of ``size`` bytes."""
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def reference_offsets(fingerprint: bytes, bits: int, hashes: int) -> list[int]:
    """The offsets, straight from the documented formula (one 128-bit hash)."""
    digest = mmh3.hash128(fingerprint, seed=0, x64arch=True, signed=False)
    h1, h2 = digest & (2**64 - 1), digest >> 64
    return [(h1 + i * h2 + (i**3 - i) // 6) % bits for i in range(hashes)]


def small_split() -> BloomParams:
    """10,000 bits cut into ten 1,000-bit segments."""
    return BloomParams(bits=10_000, hashes=7, capacity=1_000, error_rate=0.01, segment_bits=1_000)


# --- sizing -----------------------------------------------------------------------


def test_from_capacity_million_at_one_per_thousand() -> None:
    params = BloomParams.from_capacity(1_000_000, 0.001)
    assert params.bits == 14_377_588
    assert params.hashes == 10
    assert params.capacity == 1_000_000
    assert params.error_rate == 0.001
    assert params.segment_bits == SEGMENT_BITS
    assert params.segments == 1
    assert params.memory_bytes == math.ceil(14_377_588 / 8)
    assert params.memory_bytes / params.capacity == pytest.approx(1.8, abs=0.01)
    assert params.false_positive_rate(params.capacity) == pytest.approx(0.001, rel=0.01)


def test_from_capacity_thousand_at_one_percent() -> None:
    params = BloomParams.from_capacity(1000, 0.01)
    assert params.hashes == 7
    assert params.bits == 9586
    # Rounding k moves the estimate at capacity by well under 1 %.
    assert params.false_positive_rate(1000) == pytest.approx(0.01, rel=0.01)


def test_from_capacity_tiny_filter() -> None:
    params = BloomParams.from_capacity(1, 0.5)
    assert params.bits >= 1
    assert params.hashes >= 1


@pytest.mark.parametrize(
    ("capacity", "error_rate"),
    [
        (0, 0.01),
        (-5, 0.01),
        (1000, 0.0),
        (1000, 1.0),
        (1000, -0.1),
        (1000, 1.5),
        (1000, math.nan),
        (1000, math.inf),
        (10**12, 1e-9),  # more than MAX_BITS
        (1000, 1e-30),  # more than MAX_HASHES
    ],
)
def test_from_capacity_rejects_invalid(capacity: int, error_rate: float) -> None:
    with pytest.raises(ValueError, match=r"capacity|error_rate|bits|hashes"):
        BloomParams.from_capacity(capacity, error_rate)


def test_from_capacity_rejects_wrong_types() -> None:
    with pytest.raises(TypeError, match="capacity must be an int"):
        BloomParams.from_capacity(1e6, 0.01)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capacity must be an int"):
        BloomParams.from_capacity(True, 0.01)
    with pytest.raises(TypeError, match="error_rate must be a float"):
        BloomParams.from_capacity(1000, "0.01")  # type: ignore[arg-type]


def test_from_bits_scrapy_redis_bloomfilter_defaults() -> None:
    params = BloomParams.from_bits(30, 6)
    assert params.bits == 2**30
    assert params.hashes == 6
    assert params.segments == 1
    assert params.memory_bytes == 128 * 2**20
    # Design point: the count for which 6 hashes are optimal, and its rate (~2**-6).
    assert params.capacity == math.floor(2**30 * math.log(2) / 6)
    assert params.error_rate == pytest.approx(2**-6, rel=1e-6)
    assert params.error_rate == params.false_positive_rate(params.capacity)


def test_from_bits_with_error_rate_derives_capacity() -> None:
    params = BloomParams.from_bits(30, 6, error_rate=0.001)
    assert params.error_rate == 0.001
    assert params.false_positive_rate(params.capacity) <= 0.001
    assert params.false_positive_rate(params.capacity + 1) > 0.001
    assert params.capacity == params.capacity_at(0.001)


def test_from_bits_spans_several_keys_above_32() -> None:
    assert BloomParams.from_bits(32, 6).segments == 1
    assert BloomParams.from_bits(33, 6).segments == 2
    assert BloomParams.from_bits(40, 6).segments == 256
    assert BloomParams.from_bits(1, 64).bits == 2


@pytest.mark.parametrize(("bit_exponent", "hashes"), [(0, 6), (41, 6), (-1, 6), (30, 0), (30, 65)])
def test_from_bits_rejects_out_of_range(bit_exponent: int, hashes: int) -> None:
    with pytest.raises(ValueError, match=r"bit_exponent|hashes"):
        BloomParams.from_bits(bit_exponent, hashes)


def test_from_bits_rejects_unreachable_error_rate() -> None:
    with pytest.raises(ValueError, match="single item"):
        BloomParams.from_bits(1, 1, error_rate=0.001)
    with pytest.raises(ValueError, match="error_rate"):
        BloomParams.from_bits(30, 6, error_rate=0.0)


@pytest.mark.parametrize(
    "fields",
    [
        {"bits": 0},
        {"bits": MAX_BITS + 1},
        {"hashes": 0},
        {"hashes": 65},
        {"capacity": 0},
        {"error_rate": 0.0},
        {"error_rate": 1.0},
        {"segment_bits": 0},
        {"segment_bits": SEGMENT_BITS + 1},
    ],
)
def test_constructor_validates(fields: dict[str, float]) -> None:
    base: dict[str, float] = {"bits": 1000, "hashes": 3, "capacity": 100, "error_rate": 0.01}
    with pytest.raises(ValueError, match=next(iter(fields))):
        BloomParams(**{**base, **fields})  # type: ignore[arg-type]


def test_params_are_immutable_values() -> None:
    params = BloomParams.from_capacity(1000, 0.01)
    assert params == BloomParams.from_capacity(1000, 0.01)
    assert hash(params) == hash(BloomParams.from_capacity(1000, 0.01))
    with pytest.raises(AttributeError):
        params.bits = 5  # type: ignore[misc]


# --- false-positive estimates ---------------------------------------------------------


def test_false_positive_rate_estimate() -> None:
    params = BloomParams.from_capacity(1000, 0.01)
    assert params.false_positive_rate(0) == 0.0
    rates = [params.false_positive_rate(n) for n in (1, 10, 100, 1000, 10_000)]
    assert rates == sorted(rates)
    k, m = params.hashes, params.bits
    assert rates[3] == pytest.approx((1 - math.exp(-k * 1000 / m)) ** k, rel=1e-12)
    assert params.false_positive_rate(10**12) == 1.0
    with pytest.raises(ValueError, match="count"):
        params.false_positive_rate(-1)


@pytest.mark.parametrize("error_rate", [0.5, 0.01, 0.001, 1e-6])
def test_capacity_at_inverts_false_positive_rate(error_rate: float) -> None:
    params = BloomParams.from_capacity(50_000, 0.001)
    n = params.capacity_at(error_rate)
    assert params.false_positive_rate(n) <= error_rate
    assert params.false_positive_rate(n + 1) > error_rate


def test_capacity_at_design_point() -> None:
    params = BloomParams.from_capacity(1_000_000, 0.001)
    assert params.capacity_at(0.001) == pytest.approx(1_000_000, rel=0.001)


# --- offsets ------------------------------------------------------------------------


def test_offsets_basic_contract() -> None:
    params = BloomParams.from_capacity(1_000_000, 0.001)
    for fingerprint in random_fingerprints(1, 1000):
        offsets = params.offsets(fingerprint)
        assert len(offsets) == params.hashes
        assert all(0 <= offset < params.bits for offset in offsets)
        assert offsets == params.offsets(fingerprint)
        assert offsets == BloomParams.from_capacity(1_000_000, 0.001).offsets(fingerprint)


def test_offsets_match_the_documented_formula() -> None:
    for params in (
        BloomParams.from_capacity(1_000_000, 0.001),
        BloomParams.from_capacity(1000, 0.01),
        BloomParams.from_bits(30, 6),
        BloomParams.from_bits(40, 20),
        BloomParams.from_bits(1, 64),
    ):
        for fingerprint in [b"", b"x", bytes(20), *random_fingerprints(2, 300, 32)]:
            expected = reference_offsets(fingerprint, params.bits, params.hashes)
            assert params.offsets(fingerprint) == expected


def test_offsets_are_pinned() -> None:
    """The offsets are the stored format: these values must never change."""
    params = BloomParams.from_capacity(1_000_000, 0.001)
    assert params.offsets(bytes(20)) == [
        10638497,
        4332974,
        12405040,
        6099520,
        14171591,
        7866078,
        1560570,
        9632656,
        3327161,
        11399262,
    ]
    fingerprint = hashlib.sha1(b"https://example.com/").digest()
    assert params.offsets(fingerprint) == [
        7183554,
        8976601,
        10769649,
        12562699,
        14355752,
        1771221,
        3564283,
        5357351,
        7150426,
        8943509,
    ]
    assert BloomParams.from_bits(30, 6).offsets(fingerprint) == [
        64356118,
        99975833,
        135595549,
        171215267,
        206834988,
        242454713,
    ]


def test_offsets_do_not_depend_on_segment_size() -> None:
    whole = BloomParams(bits=10_000, hashes=7, capacity=1_000, error_rate=0.01)
    for fingerprint in random_fingerprints(3, 200):
        assert small_split().offsets(fingerprint) == whole.offsets(fingerprint)


@pytest.mark.statistical
@pytest.mark.parametrize(
    "params",
    [
        BloomParams.from_capacity(1_000_000, 0.001),  # m ~ 1.4e7, k = 10
        BloomParams.from_bits(24, 10),  # m = 2**24: where plain double hashing degrades
        BloomParams.from_bits(30, 6),
    ],
    ids=["from_capacity", "pow2-24", "pow2-30"],
)
def test_offsets_are_k_distinct_values(params: BloomParams) -> None:
    fingerprints = random_fingerprints(4, 10_000)
    distinct = sum(len(set(params.offsets(fp))) == params.hashes for fp in fingerprints)
    assert distinct >= 0.999 * len(fingerprints)


@pytest.mark.statistical
def test_offsets_are_uniform_and_pairwise_independent() -> None:
    """Each hash function fills every segment evenly, and g_0, g_1 are uncorrelated."""
    params = small_split()
    fingerprints = random_fingerprints(5, 20_000)
    per_hash = [Counter[int]() for _ in range(params.hashes)]
    joint = Counter[tuple[int, int]]()
    for fingerprint in fingerprints:
        located = params.locate_all(fingerprint)
        for i, (segment, _bit) in enumerate(located):
            per_hash[i][segment] += 1
        joint[located[0][0], located[1][0]] += 1
    for counts in per_hash:
        assert set(counts) == set(range(10))
        assert all(1700 <= n <= 2300 for n in counts.values())  # expected 2000
    assert len(joint) == 100
    assert all(120 <= n <= 280 for n in joint.values())  # expected 200


def test_offsets_cost(capsys: pytest.CaptureFixture[str]) -> None:
    """Report the cost of offsets(); the bound only catches a gross regression."""
    fingerprints = random_fingerprints(6, 20_000)
    for params in (BloomParams.from_capacity(10**6, 0.001), BloomParams.from_capacity(10**6, 0.01)):
        offsets = params.offsets
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            for fingerprint in fingerprints:
                offsets(fingerprint)
            best = min(best, time.perf_counter() - start)
        per_call_us = best / len(fingerprints) * 1e6
        with capsys.disabled():
            print(f"\noffsets() k={params.hashes}: {per_call_us:.2f} us per call")
        assert per_call_us < 50


# --- segments -----------------------------------------------------------------------


def test_split_segments_and_locate() -> None:
    params = small_split()
    assert params.segments == 10
    assert params.locate(0) == (0, 0)
    assert params.locate(999) == (0, 999)
    assert params.locate(1000) == (1, 0)
    assert params.locate(4321) == (4, 321)
    assert params.locate(9999) == (9, 999)
    for offset in range(params.bits):
        segment, bit = params.locate(offset)
        assert 0 <= segment < params.segments
        assert 0 <= bit < params.segment_bits
        assert segment * params.segment_bits + bit == offset
    for bad in (-1, 10_000, 10**9):
        with pytest.raises(ValueError, match="offset"):
            params.locate(bad)


def test_split_with_partial_last_segment() -> None:
    params = BloomParams(bits=10_500, hashes=3, capacity=1_000, error_rate=0.1, segment_bits=1_000)
    assert params.segments == 11
    assert params.locate(10_499) == (10, 499)


def test_default_segments_are_redis_strings() -> None:
    params = BloomParams.from_bits(33, 6)
    assert params.segments == 2
    assert params.locate(2**32 - 1) == (0, 2**32 - 1)
    assert params.locate(2**32) == (1, 0)
    assert BloomParams(bits=2**32 + 1, hashes=1, capacity=1, error_rate=0.5).segments == 2


def test_locate_all_uses_every_segment() -> None:
    params = small_split()
    used: set[int] = set()
    for fingerprint in random_fingerprints(7, 1000):
        located = params.locate_all(fingerprint)
        offsets = params.offsets(fingerprint)
        assert len(located) == params.hashes
        assert [s * params.segment_bits + b for s, b in located] == offsets
        used.update(segment for segment, _bit in located)
    assert used == set(range(params.segments))


def test_locate_flat_layout() -> None:
    params = small_split()
    fingerprints = random_fingerprints(8, 5)
    flat = params.locate_flat(fingerprints)
    assert len(flat) == 2 * params.hashes * len(fingerprints)
    for j, fingerprint in enumerate(fingerprints):
        for i, (segment, bit) in enumerate(params.locate_all(fingerprint)):
            position = 2 * (j * params.hashes + i)
            assert flat[position : position + 2] == [segment, bit]
    assert params.locate_flat(iter(fingerprints)) == flat
    assert params.locate_flat([]) == []
    with pytest.raises(TypeError, match="iterable of fingerprints"):
        params.locate_flat(b"one fingerprint")  # type: ignore[arg-type]


def test_locate_flat_drives_a_segmented_filter_like_the_lua_script() -> None:
    """Apply ARGV as the Lua script would (KEYS[segment + 1]); compare with LocalBloom."""
    params = small_split()
    keys = [zeros(params.segment_bits) for _ in range(params.segments)]

    def script_add(batch: list[bytes]) -> list[bool]:
        flat = params.locate_flat(batch)
        width = 2 * params.hashes
        result = []
        for j in range(len(batch)):
            new = False
            for p in range(j * width, (j + 1) * width, 2):
                segment, bit = flat[p], flat[p + 1]
                if not keys[segment][bit]:
                    keys[segment][bit] = 1
                    new = True
            result.append(new)
        return result

    local = LocalBloom(params)
    batch = random_fingerprints(9, 300)
    assert script_add(batch) == [local.add(fp) for fp in batch]
    assert script_add(batch) == [False] * len(batch)
    for fingerprint in random_fingerprints(10, 300):
        located = params.locate_all(fingerprint)
        in_keys = all(keys[segment][bit] for segment, bit in located)
        assert in_keys == (fingerprint in local)


# --- scalable chains -------------------------------------------------------------------


def test_stage_capacities_and_error_rates() -> None:
    base = BloomParams.from_capacity(1000, 0.01, segment_bits=1000)
    assert base.stage(0) is base
    first = base.stage(1)
    assert (first.capacity, first.error_rate) == (2000, 0.005)
    assert first == BloomParams.from_capacity(2000, 0.005, segment_bits=1000)
    third = base.stage(3, growth=4, tightening=0.25)
    assert third.capacity == 64_000
    assert third.error_rate == pytest.approx(0.01 * 0.25**3)
    assert third.segment_bits == 1000
    same = base.stage(5, growth=1, tightening=1.0)
    assert (same.capacity, same.error_rate) == (1000, 0.01)
    assert [base.stage(i).bits for i in range(6)] == sorted(base.stage(i).bits for i in range(6))


def test_stage_of_from_bits_params() -> None:
    base = BloomParams.from_bits(20, 6)
    assert base.stage(0) is base
    assert base.stage(2).capacity == base.capacity * 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"index": -1},
        {"index": 1, "growth": 0},
        {"index": 1, "tightening": 0.0},
        {"index": 1, "tightening": 1.5},
        {"index": 40},  # capacity * 2**40 needs more than MAX_BITS
    ],
)
def test_stage_rejects_invalid(kwargs: dict[str, float]) -> None:
    base = BloomParams.from_capacity(1000, 0.01)
    with pytest.raises(ValueError, match=r"index|growth|tightening|bits"):
        base.stage(**kwargs)  # type: ignore[arg-type]


def test_chain_false_positive_rate_bound() -> None:
    base = BloomParams.from_capacity(1000, 0.01)
    stages = [base.stage(i) for i in range(10)]
    rates = [0.01 * 0.5**i for i in range(10)]
    bound = chain_false_positive_rate(stages)
    assert bound == pytest.approx(1 - math.prod(1 - r for r in rates), rel=1e-12)
    assert bound <= sum(rates) < 0.01 / (1 - 0.5)
    assert chain_false_positive_rate(stages[:1]) == pytest.approx(0.01)
    assert chain_false_positive_rate(iter(stages)) == bound
    assert chain_false_positive_rate([]) == 0.0


def test_chain_false_positive_rate_with_counts() -> None:
    base = BloomParams.from_capacity(1000, 0.01)
    stages = [base.stage(i) for i in range(4)]
    assert chain_false_positive_rate(stages, [0, 0, 0, 0]) == 0.0
    full = chain_false_positive_rate(stages, [s.capacity for s in stages])
    assert full == pytest.approx(chain_false_positive_rate(stages), rel=0.02)
    partial = chain_false_positive_rate(stages, [1000, 2000, 10, 0])
    expected = 1 - (1 - stages[0].false_positive_rate(1000)) * (
        1 - stages[1].false_positive_rate(2000)
    ) * (1 - stages[2].false_positive_rate(10))
    assert partial == pytest.approx(expected, rel=1e-12)
    assert chain_false_positive_rate(stages, [10**12, 0, 0, 0]) == 1.0
    with pytest.raises(ValueError, match="one entry per stage"):
        chain_false_positive_rate(stages, [1, 2])


def test_segments_fit_the_allocator() -> None:
    """10M fingerprints at 0.1% (17.1 MiB) would take a 20 MiB allocation in one key;
    cut at a 16 MiB size class, the two keys take 17.25 MiB."""
    params = fit_segments(BloomParams.from_capacity(10_000_000, 0.001))
    assert params.segments == 2
    assert params.segment_bits == (16 * 2**20 - 64) * 8
    assert fit_segments(BloomParams.from_capacity(1_000, 0.001)).segments == 1
    huge = fit_segments(BloomParams.from_capacity(1_000_000_000, 0.001))
    assert huge.segment_bits == (2**29 - 64) * 8  # at most 512 MiB per key


# --- the signature a bitmap chain stores ----------------------------------------------


def test_signature_is_readable_and_pinned() -> None:
    """The signature is part of the stored format: a change orphans every filter."""
    params = BloomParams.from_capacity(1_000, 0.01)
    assert signature(params) == (
        "v1 bits=9586 hashes=7 capacity=1000 error_rate=0.01 "
        "segment_bits=4294967296 growth=2 tightening=0.5"
    )


@pytest.mark.parametrize(
    "params",
    [
        BloomParams.from_capacity(1_000, 0.01),
        BloomParams.from_bits(20, 6),
        BloomParams.from_capacity(3, 0.3, segment_bits=7),
        fit_segments(BloomParams.from_capacity(10_000_000, 0.001)),
    ],
)
def test_parse_signature_gives_back_the_params(params: BloomParams) -> None:
    assert parse_signature(signature(params)) == params


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "v0 bits=9586 hashes=7 capacity=1000 error_rate=0.01 segment_bits=4294967296 growth=2 "
        "tightening=0.5",
        "v1 bits=9586 hashes=7 capacity=1000 error_rate=0.01 segment_bits=4294967296 growth=3 "
        "tightening=0.5",
        "v1 bits=9586 hashes=7 capacity=1000 error_rate=0.01",
        "v1 bits=0 hashes=7 capacity=1000 error_rate=0.01 segment_bits=4294967296 growth=2 "
        "tightening=0.5",
        "v1 bits=x hashes=7 capacity=1000 error_rate=0.01 segment_bits=4294967296 growth=2 "
        "tightening=0.5",
    ],
)
def test_parse_signature_refuses_what_this_version_does_not_write(text: str) -> None:
    assert parse_signature(text) is None


# --- LocalBloom ---------------------------------------------------------------------


def test_local_bloom_add_and_contains() -> None:
    bloom = LocalBloom(BloomParams.from_capacity(1000, 0.01))
    assert bloom.count == 0
    assert bloom.false_positive_rate() == 0.0
    assert b"a" not in bloom
    assert bloom.add(b"a") is True
    assert b"a" in bloom
    assert bloom.add(b"a") is False
    assert bloom.count == 1
    assert bloom.add(b"b") is True
    assert bloom.count == 2
    assert bloom.false_positive_rate() == bloom.params.false_positive_rate(2)


def test_local_bloom_clear() -> None:
    bloom = LocalBloom(BloomParams.from_capacity(1000, 0.01))
    fingerprints = random_fingerprints(13, 100)
    for fingerprint in fingerprints:
        bloom.add(fingerprint)
    bloom.clear()
    assert bloom.count == 0
    assert not any(fp in bloom for fp in fingerprints)
    assert bloom.add(fingerprints[0]) is True


def test_local_bloom_has_no_false_negatives() -> None:
    bloom = LocalBloom(BloomParams.from_capacity(100_000, 0.01))
    fingerprints = random_fingerprints(11, 100_000)
    added = sum(bloom.add(fp) for fp in fingerprints)
    assert all(fp in bloom for fp in fingerprints)
    assert added == bloom.count
    # A new item is only refused when its bits were all set already (rate < 1 %).
    assert 0.99 * len(fingerprints) <= bloom.count <= len(fingerprints)


@pytest.mark.statistical
def test_local_bloom_measured_false_positive_rate(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    params = BloomParams.from_capacity(1_000_000, 0.01)
    bloom = LocalBloom(params)
    rng = random.Random(12)
    for _ in range(1_000_000):
        bloom.add(rng.randbytes(20))
    # Fresh 20-byte strings from the same generator: distinct from the inserted ones
    # except with probability ~1e-36.
    false_positives = sum(rng.randbytes(20) in bloom for _ in range(1_000_000))
    elapsed = time.perf_counter() - start
    measured = false_positives / 1_000_000
    with capsys.disabled():
        print(f"\nLocalBloom 1M/1M: measured FPR {measured:.5f} in {elapsed:.1f} s")
    assert 0.005 <= measured <= 0.015
    assert measured == pytest.approx(bloom.false_positive_rate(), rel=0.1)


def test_local_bloom_refuses_absurd_sizes() -> None:
    with pytest.raises(ValueError, match="more than the"):
        LocalBloom(BloomParams.from_capacity(10**10, 0.01))  # ~12 GB
    with pytest.raises(ValueError, match="more than the"):
        LocalBloom(BloomParams.from_bits(34, 6))  # 2 GiB
    too_big = BloomParams(bits=MAX_LOCAL_BYTES * 8 + 1, hashes=1, capacity=1, error_rate=0.5)
    with pytest.raises(ValueError, match="more than the"):
        LocalBloom(too_big)
