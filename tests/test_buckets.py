"""The bucketed exact dupefilter (``DUPEFILTER_BACKEND = "buckets"``), on real servers:
exactness where fingerprints share buckets, the layout the Lua builds, generations and
their cleanup, Redis refusals, and a crawl of two ``scrapy crawl`` worker processes.

The backend contract it shares with the others (new then seen, atomic enqueue, two
workers at once...) runs in tests/test_filters.py.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters import BucketsBackend, SetBackend, migrate_set
from scrapy_dist.filters.buckets import (
    RAW_LEN,
    bits_for,
    bucket_index,
    stored,
    token,
)
from scrapy_dist.keys import RedisKeys, bucket_key
from scrapy_dist.queue import FifoQueue
from scrapy_dist.testing import TestSite
from scrapy_dist.testing.crawl import WorkerCrawl, duplicates
from scrapy_dist.testing.refusals import OOM_REFUSED

if TYPE_CHECKING:
    from scrapy_dist.testing import RedisServer

pytestmark = pytest.mark.redis_server

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "example"


def fps(seed: int, count: int, length: int = RAW_LEN) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(length) for _ in range(count)]


def backend_for(client: redis.Redis, name: str, capacity: int = 100_000) -> BucketsBackend:
    return BucketsBackend(client, RedisKeys.build(name).dupefilter, capacity=capacity).open()


def bucket_keys(client: redis.Redis, backend: BucketsBackend) -> list[bytes]:
    return list(client.scan_iter(match=f"{backend.key}:*", count=1000))


def generation(client: redis.Redis, backend: BucketsBackend) -> str:
    raw = client.hget(backend.key, "gen")
    assert isinstance(raw, bytes)
    return raw.decode()


def test_bits_follow_the_capacity() -> None:
    assert bits_for(1) == 0
    assert bits_for(128) == 0
    assert bits_for(129) == 1
    assert bits_for(10_000_000) == 17  # 131,072 buckets of 76 on average
    assert bits_for(10**12) == 24  # capped


def test_tokens_are_injective_across_lengths() -> None:
    rng = random.Random(1)
    values = {
        rng.randbytes(n) for n in (0, 1, 14, 15, 16, 17, 19, 20, 21, 40, 300) for _ in range(50)
    }
    values |= {fp.hex().encode() for fp in fps(2, 50)}  # custom hex fingerprints
    values |= {b"a" * 15 + b"\x00", b"a" * 15}  # the padded case next to its neighbour
    tokens = {token(v) for v in values}
    assert len(tokens) == len(values)
    assert all(len(t) >= 3 for t in tokens)
    assert all(len(token(v)) != RAW_LEN for v in values if len(v) != RAW_LEN)


@pytest.mark.parametrize("capacity", [100, 100_000, 2**17 * 128])
def test_no_false_positives_where_fingerprints_share_buckets(
    client: redis.Redis, name: str, capacity: int
) -> None:
    """Fingerprints that differ only in the bytes a bucket stores, or only in the bits
    of the index, or only in the last bit, are all told apart."""
    backend = backend_for(client, name, capacity)
    bits = backend.bits
    base = fps(3, 300)
    near: list[bytes] = []
    for fp in base:
        near.append(fp[:-1] + bytes([fp[-1] ^ 1]))  # same bucket, last bit differs
        near.append(bytes([fp[0] ^ 0x80]) + fp[1:])  # first bit (index) differs
        near.append(fp[:2] + bytes([fp[2] ^ 0x01]) + fp[3:])  # 24th bit
        near.append(fp[:1] + bytes([fp[1] ^ 0x01]) + fp[2:])  # 16th bit
    near = [fp for fp in dict.fromkeys(near) if fp not in set(base)]
    assert all(backend.add_many(base))
    assert not any(backend.contains_many(near))
    assert all(backend.add_many(near))
    assert all(backend.contains_many(base + near))
    assert len(backend) == len(base) + len(near)
    # every bucket the Lua wrote is where Python says, holding what Python says
    gen = generation(client, backend)
    for fp in base[:50]:
        tok = token(fp)
        key = bucket_key(backend.key, gen, bucket_index(tok, bits))
        assert client.lpos(key, stored(tok, bits)) is not None  # type: ignore[arg-type]


def test_no_false_positives_on_many_fingerprints(client: redis.Redis, name: str) -> None:
    backend = backend_for(client, name, capacity=20_000)  # 256 buckets of ~80...
    added = fps(4, 60_000)  # ...filled to three times the capacity
    for start in range(0, len(added), 5_000):
        assert all(backend.add_many(added[start : start + 5_000]))
    others = fps(5, 60_000)
    assert not any(backend.contains_many(others))
    assert all(backend.contains_many(added[::7]))
    assert len(backend) == 60_000


def test_custom_fingerprints_of_any_length(client: redis.Redis, name: str) -> None:
    backend = backend_for(client, name)
    values = [fp.hex().encode() for fp in fps(6, 200)] + [b"x", b"a" * 15, b"a" * 16]
    assert all(backend.add_many(values))
    assert not any(backend.add_many(values))
    assert not any(backend.contains_many([v.upper() for v in values[:200]]))


def test_buckets_stay_in_the_compact_encoding(client: redis.Redis, name: str) -> None:
    backend = backend_for(client, name, capacity=1_000)  # 8 buckets
    backend.add_many(fps(7, 3_000))  # three times the capacity: ~375 per bucket
    encodings = {client.object("encoding", key) for key in bucket_keys(client, backend)}
    assert encodings <= {b"quicklist", b"listpack", b"ziplist"}
    assert len(bucket_keys(client, backend)) == 8


def test_check_on_an_empty_filter_writes_nothing(client: redis.Redis, name: str) -> None:
    backend = BucketsBackend(client, RedisKeys.build(name).dupefilter, capacity=1000)
    assert not any(backend.contains_many(fps(8, 10)))
    assert not client.exists(backend.key)


def test_a_later_worker_adopts_the_layout_in_redis(client: redis.Redis, name: str) -> None:
    first = backend_for(client, name, capacity=1_000)
    added = fps(9, 500)
    first.add_many(added)
    later = backend_for(client, name, capacity=10_000_000)
    assert later.bits != first.bits
    assert all(later.contains_many(added))
    assert not any(later.add_many(added))
    assert len(bucket_keys(client, later)) <= 2**first.bits


def test_atomic_dedupe_and_enqueue(client: redis.Redis, name: str) -> None:
    backend = backend_for(client, name)
    keys = RedisKeys.build(name)
    queue = FifoQueue(client, keys.requests, keys.seq)
    batch = fps(10, 40)
    items = [(b"p%d" % i, 0.0, fp) for i, fp in enumerate(batch)]
    assert queue.push(items + items[:5], backend) == [True] * 40 + [False] * 5
    assert len(queue) == 40
    assert len(backend) == 40
    # a bucket holding another type: the call fails before writing anything
    fresh = fps(11, 1)[0]
    gen = generation(client, backend)
    client.set(bucket_key(backend.key, gen, bucket_index(token(fresh), backend.bits)), b"x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.push([(b"f", 0.0, fresh)], backend)
    assert len(queue) == 40
    assert len(backend) == 40


def test_wrong_key_types_are_refused_at_open(client: redis.Redis, name: str) -> None:
    key = RedisKeys.build(name).dupefilter
    client.sadd(key, b"x" * 20)
    with pytest.raises(ConfigurationError, match="a set"):
        BucketsBackend(client, key, capacity=100).open()
    client.delete(key)
    client.hset(key, "sig", "bloom")  # a bitmap Bloom chain
    with pytest.raises(ConfigurationError, match="bitmap"):
        BucketsBackend(client, key, capacity=100).open()
    client.delete(key)
    BucketsBackend(client, key, capacity=100).open()
    with pytest.raises(ConfigurationError, match="buckets"):
        SetBackend(client, key).open()


def test_a_deleted_table_starts_a_new_generation_and_the_old_is_collected(
    client: redis.Redis, name: str
) -> None:
    """What a finished crawl does (lua/progress.lua unlinks ``keys()``), then a new run."""
    backend = backend_for(client, name, capacity=10_000)  # 128 buckets
    added = fps(12, 2_000)
    backend.add_many(added)
    old = bucket_keys(client, backend)
    assert len(old) == 128
    client.unlink(*backend.keys())
    assert all(backend.add_many(added[:10]))  # forgotten: a new run crawls them again
    assert backend.collect() == 128
    left = bucket_keys(client, backend)
    assert 0 < len(left) <= 10
    assert not set(left) & set(old)
    assert backend.collect() == 0  # the current generation is kept


def test_clear_deletes_every_bucket(client: redis.Redis, name: str) -> None:
    backend = backend_for(client, name, capacity=2**17 * 128)  # 131,072 buckets
    backend.add_many(fps(13, 3_000))
    backend.clear()
    assert bucket_keys(client, backend) == []
    assert not client.exists(backend.key)


def test_the_dupefilter_collects_when_it_closes(client: redis.Redis, name: str) -> None:
    backend = BucketsBackend(client, RedisKeys.build(name).dupefilter, capacity=10_000)
    dupefilter = RFPDupeFilter(backend)
    dupefilter.open()
    backend.add_many(fps(14, 500))
    client.unlink(*dupefilter.keys())
    dupefilter.close("finished")
    assert bucket_keys(client, backend) == []


def test_migrate_from_the_set(client: redis.Redis, name: str) -> None:
    keys = RedisKeys.build(name)
    old = SetBackend(client, keys.dupefilter)
    added = fps(15, 3_000)
    old.add_many(added)
    client.rename(keys.dupefilter, f"{keys.dupefilter}:old")
    backend = BucketsBackend(client, keys.dupefilter, capacity=10_000)
    assert migrate_set(client, f"{keys.dupefilter}:old", backend, batch=500) == 3_000
    assert all(backend.contains_many(added))
    assert len(backend) == 3_000


def test_oom_refusal_writes_nothing(server: RedisServer, name: str) -> None:
    with server.client() as client:
        backend = backend_for(client, name)
        keys = RedisKeys.build(name)
        queue = FifoQueue(client, keys.requests, keys.seq)
        queue.push([(b"a", 0.0, fps(16, 1)[0])], backend)
        client.config_set("maxmemory", 1)  # a private test server
        try:
            fresh = fps(17, 5)
            with pytest.raises(redis.exceptions.ResponseError, match=OOM_REFUSED):
                queue.push([(b"p", 0.0, fp) for fp in fresh], backend)
        finally:
            client.config_set("maxmemory", 0)
        assert len(queue) == 1
        assert len(backend) == 1
        assert not any(backend.contains_many(fresh))


@pytest.mark.e2e
def test_two_worker_processes_crawl_each_page_once(
    module_server: RedisServer, tmp_path: Path
) -> None:
    with TestSite(300) as site:
        site.delay = 0.05
        crawl = WorkerCrawl(
            module_server,
            site,
            tmp_path,
            project_dir=EXAMPLE_DIR,
            settings={
                "MAX_IDLE_TIME_BEFORE_CLOSE": 2,
                "DUPEFILTER_BACKEND": "buckets",
                "DUPEFILTER_CAPACITY": 10_000,
            },
        )
        try:
            crawl.client.flushdb()
            crawl.start(2)
            crawl.seed()
            crawl.wait_ready(timeout=60)
            assert crawl.wait(timeout=90) == [0, 0], crawl.logs(15)
        finally:
            crawl.close()
        hits = site.hits()
        assert set(hits) == site.expected_paths(), crawl.logs(15)
        assert duplicates(hits) == 0
        with module_server.client() as client:
            left = [k for k in client.scan_iter(match="pages:dupefilter*", count=1000)]
        assert left == []  # the finished crawl's table and buckets are gone


def test_auto_adopts_a_bucket_table_and_bloom_refuses_it(client: redis.Redis, name: str) -> None:
    """``"auto"`` (what ``scrapy-dist status`` reads with) adopts the table and its
    count; ``"bloom"`` stops at open."""
    from scrapy.settings import Settings

    from scrapy_dist.filters import BackendChoice, backend_from_settings

    keys = RedisKeys.build(name)
    backend_for(client, name).add_many(fps(18, 30))
    auto = backend_from_settings(Settings({"DUPEFILTER_BACKEND": "auto"}), client, keys)
    assert isinstance(auto, BackendChoice)
    chosen = auto.open()
    assert isinstance(chosen, BucketsBackend)
    assert chosen.state().count == 30
    bloom = backend_from_settings(Settings({"DUPEFILTER_BACKEND": "bloom"}), client, keys)
    with pytest.raises(ConfigurationError, match="bucketed exact"):
        bloom.open()


def test_buckets_expire_with_the_table(client: redis.Redis, name: str) -> None:
    key = RedisKeys.build(name).dupefilter
    backend = BucketsBackend(client, key, capacity=1_000, ttl=60.0).open()
    backend.add_many(fps(19, 200))
    meta = int(client.pttl(key))
    pttls = [int(client.pttl(k)) for k in backend.current_bucket_keys() if client.exists(k)]
    assert len(pttls) == 8
    # a new bucket gets the meta's remaining TTL, read and set in one script: a server
    # descheduled between the two (a loaded machine) stretches it by a few ms
    assert all(0 < p <= meta + 100 for p in pttls), (meta, pttls)
    assert meta - min(pttls) < 1_000  # one expiry for the whole table
