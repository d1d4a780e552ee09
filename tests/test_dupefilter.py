"""The dupefilter: fingerprints, the local cache, stats and logs, under both schedulers.

The backends it stores fingerprints in have their own tests (``test_filters.py``).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_dist.bloom import BloomParams, LocalBloom
from scrapy_dist.dupefilter import LocalSet, RFPDupeFilter
from scrapy_dist.filters import BitmapBloomBackend, DupefilterFull, RedisBloomBackend, SetBackend
from scrapy_dist.keys import RedisKeys
from scrapy_dist.scheduler import Scheduler

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy.crawler import Crawler

#: Bitmap options that let a chain grow as soon as a stage is full (tests only: the
#: guard is what keeps workers' views current in production).
GROW_NOW: dict[str, Any] = {"view_interval": 0.0, "growth_guard": 0.0}


def fingerprints(seed: int, count: int) -> list[bytes]:
    """``count`` reproducible random 20-byte fingerprints (Scrapy's SHA1 size)."""
    rng = random.Random(seed)
    return [rng.randbytes(20) for _ in range(count)]


def bitmap_backend(
    client: redis.Redis, name: str, *, capacity: int, **options: Any
) -> BitmapBloomBackend:
    """An opened bitmap Bloom backend at 0.1% for the crawl ``name``."""
    params = BloomParams.from_capacity(capacity, 0.001)
    return BitmapBloomBackend(client, RedisKeys.build(name), params, **options).open()


# --- the dupefilter -----------------------------------------------------------------


@pytest.fixture
def open_dupefilter(
    make_crawler: Callable[..., Crawler],
) -> Iterator[Callable[..., RFPDupeFilter]]:
    opened: list[RFPDupeFilter] = []

    def make(values: dict[str, Any] | None = None) -> RFPDupeFilter:
        crawler = make_crawler(values)
        dupefilter = build_from_crawler(RFPDupeFilter, crawler)
        dupefilter.open()
        opened.append(dupefilter)
        return dupefilter

    yield make
    for dupefilter in opened:
        dupefilter.close("finished")


def test_memory_per_fingerprint(
    open_dupefilter: Callable[..., RFPDupeFilter], client: redis.Redis
) -> None:
    """At 0.1% a bitmap takes under 2 bytes per fingerprint of capacity, all of it
    allocated when the filter opens."""
    dupefilter = open_dupefilter({"DUPEFILTER_BACKEND": "bitmap", "BLOOM_CAPACITY": 1_000_000})
    owned = dupefilter.backend.keys()
    used = sum(int(client.memory_usage(key) or 0) for key in owned)
    assert 1.79 < used / 1_000_000 < 2.0


@pytest.mark.parametrize("mode", ["set", "bloom"])
def test_request_seen(
    mode: str, open_dupefilter: Callable[..., RFPDupeFilter], redisbloom_loaded: bool
) -> None:
    dupefilter = open_dupefilter({"DUPEFILTER_BACKEND": mode, "BLOOM_CAPACITY": 10_000})
    first = Request("https://example.com/a")
    assert not dupefilter.request_seen(first)
    assert dupefilter.request_seen(Request("https://example.com/a"))
    assert not dupefilter.request_seen(Request("https://example.com/b"))
    other = open_dupefilter({"DUPEFILTER_BACKEND": mode, "BLOOM_CAPACITY": 10_000})
    assert other.request_seen(first)  # another worker of the crawl
    stats = dupefilter.stats.get_stats() if dupefilter.stats else {}
    if mode == "set":
        assert stats["dupefilter/set/count"] == 0  # read at open, before any request
        assert isinstance(dupefilter.local, LocalSet)  # exact, like the set itself
    else:
        # "bloom" is RedisBloom where the server has the module, else the bitmap
        assert stats["dupefilter/bloom/backend"] == (
            "redisbloom" if redisbloom_loaded else "bitmap"
        )
        assert stats["dupefilter/bloom/capacity"] == 10_000
        assert dupefilter.local is not None


def test_stats_are_refreshed_without_a_round_trip_per_request(
    open_dupefilter: Callable[..., RFPDupeFilter],
) -> None:
    dupefilter = open_dupefilter({"DUPEFILTER_BACKEND": "bitmap", "BLOOM_CAPACITY": 1_000})
    assert dupefilter.stats is not None
    for i in range(20):
        dupefilter.request_seen(Request(f"https://example.com/{i}"))
    assert dupefilter.stats.get_value("dupefilter/bloom/count") == 0  # not yet refreshed
    dupefilter._next_refresh = 0.0
    dupefilter.seen_locally(b"x" * 20)
    assert dupefilter.stats.get_value("dupefilter/bloom/count") == 20
    dupefilter.close("finished")
    assert dupefilter.stats.get_value("dupefilter/bloom/fpr_estimate") > 0


def test_capacity_overflow_is_logged_with_growth(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = bitmap_backend(client, name, capacity=100, **GROW_NOW)
    dupefilter = RFPDupeFilter(backend, get_crawler().request_fingerprinter)
    dupefilter.open()
    fps = fingerprints(28, 250)
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.dupefilter"):
        for i in range(0, 250, 25):
            backend.add_many(fps[i : i + 25])
        dupefilter._tick(time.monotonic())
    messages = [record.getMessage() for record in caplog.records]
    assert any("more than its capacity of 100" in m and "grows" in m for m in messages)
    assert any("grew to 2 filters" in m for m in messages)
    assert dupefilter.last_state is not None
    assert dupefilter.last_state.stages == 2


def test_full_filter_is_logged_as_an_error(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = bitmap_backend(client, name, capacity=100, on_full="refuse")
    dupefilter = RFPDupeFilter(backend, get_crawler().request_fingerprinter)
    dupefilter.open()
    backend.add_many(fingerprints(29, 100))
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.dupefilter"):
        dupefilter._tick(time.monotonic())
    assert any(r.levelno == logging.ERROR and "is full" in r.getMessage() for r in caplog.records)
    with pytest.raises(DupefilterFull):
        dupefilter.request_seen(Request("https://example.com/new"))


def test_local_cache_skips_round_trips_and_never_hides_a_page(
    open_dupefilter: Callable[..., RFPDupeFilter], monkeypatch: pytest.MonkeyPatch
) -> None:
    dupefilter = open_dupefilter({"DUPEFILTER_BACKEND": "bitmap", "BLOOM_CAPACITY": 10_000})
    local = dupefilter.local
    assert isinstance(local, LocalBloom)
    assert local.params.error_rate == pytest.approx(0.001 * 0.01)  # 1% of the budget
    requests = [Request(f"https://example.com/{i}") for i in range(200)]
    assert not any(dupefilter.request_seen(r) for r in requests)

    def no_redis(fingerprint: bytes) -> bool:
        raise AssertionError("asked Redis")

    monkeypatch.setattr(dupefilter.backend, "add", no_redis)
    assert all(dupefilter.request_seen(r) for r in requests)  # all answered locally
    assert dupefilter.stats is not None
    assert dupefilter.stats.get_value("dupefilter/local/hits") == 200


def test_local_cache_is_cleared_when_the_filter_may_expire(client: redis.Redis, name: str) -> None:
    backend = bitmap_backend(client, name, capacity=1_000, ttl=0.5)
    local = LocalBloom(BloomParams.from_capacity(1_000, 1e-5))
    dupefilter = RFPDupeFilter(backend, get_crawler().request_fingerprinter, local=local, ttl=0.5)
    dupefilter.open()
    fp = fingerprints(30, 1)[0]
    assert backend.add(fp)
    dupefilter.remember(fp)
    assert dupefilter.seen_locally(fp)
    time.sleep(0.6)  # the filter in Redis expired: the cache must not answer for it
    assert not dupefilter.seen_locally(fp)
    assert backend.add(fp)


@pytest.mark.usefixtures("without_redisbloom")
def test_local_cache_defaults(open_dupefilter: Callable[..., RFPDupeFilter]) -> None:
    # "auto" without RedisBloom became the exact set: its cache is exact too
    assert isinstance(open_dupefilter({"DUPEFILTER_BACKEND": "auto"}).local, LocalSet)
    assert isinstance(open_dupefilter({}).local, LocalSet)
    assert open_dupefilter({"DUPEFILTER_LOCAL_CACHE": False}).local is None
    assert open_dupefilter({"DUPEFILTER_BACKEND": "bitmap"}).local is not None
    off = {"DUPEFILTER_BACKEND": "bitmap", "DUPEFILTER_LOCAL_CACHE": False}
    assert open_dupefilter(off).local is None


def test_the_filter_never_asks_a_backend_its_size(client: redis.Redis, name: str) -> None:
    """A backend's ``len()`` is a round trip (and scrapy-redis's tests pass a mock
    client): opening, clearing and closing never test a backend for truth."""

    class Sizeless(SetBackend):
        def __len__(self) -> int:
            raise AssertionError("asked the backend its size")

    backend = Sizeless(client, RedisKeys.build(name).dupefilter)
    dupefilter = RFPDupeFilter(backend, get_crawler().request_fingerprinter, clear_on_close=True)
    dupefilter.open()
    assert not dupefilter.request_seen(Request("https://example.com/a"))
    dupefilter.clear()
    dupefilter.close("finished")
    assert dupefilter.backend is backend


def test_scheduler_dedupes_with_the_bloom_backend(
    make_crawler: Callable[..., Crawler], redisbloom_loaded: bool
) -> None:
    crawler = make_crawler(
        {
            "DUPEFILTER_BACKEND": "bloom",
            "BLOOM_CAPACITY": 10_000,
            "SCHEDULER_FLUSH_INTERVAL": 0,  # answers from Redis, not batched
        }
    )
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        assert scheduler.enqueue_request(Request("https://example.com/a"))
        assert not scheduler.enqueue_request(Request("https://example.com/a"))
        assert scheduler.enqueue_request(Request("https://example.com/b"))
        assert scheduler.enqueue_request(Request("https://example.com/a", dont_filter=True))
        assert isinstance(scheduler._shared_df, RFPDupeFilter)
        bloom = RedisBloomBackend if redisbloom_loaded else BitmapBloomBackend
        assert isinstance(scheduler._shared_df.backend, bloom)
    finally:
        scheduler.close("finished")
