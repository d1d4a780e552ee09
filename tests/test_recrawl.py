"""The recrawl window (``DUPEFILTER_RECRAWL_AFTER``, issue 16c).

First as a user runs it: a throwaway Scrapy project, two ``scrapy crawl`` workers per
run, seeds pushed to Redis, the local site counting every fetch. With a 5 s window, a
second run 2 s after the first ended fetches nothing new (only its seed, which skips
the dupefilter by default), and a third run 6 s after it fetches every page again.
Then each backend's window edges, the expiry of its memory, the local cache and the
signature checks, against the session's real redis-server.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.settings import Settings

from scrapy_dist.bloom import BloomParams
from scrapy_dist.dupefilter import LocalSet, RFPDupeFilter
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters import (
    BitmapBloomBackend,
    DupefilterBackend,
    RedisBloomBackend,
    SetBackend,
    WindowSetBackend,
    backend_from_settings,
    migrate_to_window,
)
from scrapy_dist.filters.window import GENERATIONS, RecrawlWindow, split_window_signature
from scrapy_dist.keys import RedisKeys
from scrapy_dist.queue import FifoQueue
from scrapy_dist.settings import Config
from scrapy_dist.testing import TestSite, start_workers, stop_workers, wait_ready, wait_workers
from scrapy_dist.testing.refusals import OOM_REFUSED

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy.crawler import Crawler

    from scrapy_dist.testing import RedisServer, Worker

PAGES = 30
RUN_TIMEOUT = 90.0
WINDOW = 5.0

SPIDER = """
from scrapy_dist.spiders import RedisSpider


class PagesSpider(RedisSpider):
    name = "{name}"

    def parse(self, response):
        yield from response.follow_all(css="a", callback=self.parse)
"""

SETTINGS = """
BOT_NAME = "recrawl"
SPIDER_MODULES = ["recrawl.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
ADDONS = {{"scrapy_dist.addon.DistAddon": 0}}
REDIS_URL = "{redis_url}"
CLOSE_WHEN_CRAWL_DONE = True
CRAWL_DONE_GRACE = 0.5
# a periodic crawl: the dupefilter survives between runs, and forgets after 5 s
SCHEDULER_PERSIST = True
DUPEFILTER_RECRAWL_AFTER = {window}
DUPEFILTER_BACKEND = "{backend}"
BLOOM_CAPACITY = 10000
"""


@pytest.fixture
def project(tmp_path: Path, name: str, redis_url: str, request: pytest.FixtureRequest) -> Path:
    root = tmp_path / "project"
    package = root / "recrawl"
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = recrawl.settings\n")
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    backend = getattr(request, "param", "set")
    (package / "settings.py").write_text(
        SETTINGS.format(redis_url=redis_url, window=WINDOW, backend=backend)
    )
    (package / "spiders" / "pages.py").write_text(SPIDER.format(name=name))
    return root


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    stop_workers(started)


def start(workers: list[Worker], project: Path, name: str, **settings: object) -> list[Worker]:
    """Start two workers of the project and wait until both opened their spider."""
    run = start_workers(
        2,
        project_dir=project,
        spider=name,
        log_dir=project.parent,
        settings=settings,
        stats_setting=None,
        first_index=len(workers),
    )
    workers.extend(run)
    wait_ready(run, timeout=RUN_TIMEOUT)
    return run


def wait_hits(site: TestSite, count: int, quiet: float = 1.5) -> dict[str, int]:
    """Wait until the site served ``count`` pages, then ``quiet`` more seconds (time
    for any extra fetch to show); the hits."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while sum(site.hits().values()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} fetches: {site.hits()}"
        time.sleep(0.02)
    time.sleep(quiet)
    return site.hits()


@pytest.mark.e2e
@pytest.mark.parametrize("project", ["set", "bitmap"], indirect=True)
def test_runs_2_s_after_fetch_nothing_new_and_6_s_after_every_page(
    project: Path, name: str, client: redis.Redis, workers: list[Worker]
) -> None:
    """The judged scenario, timed exactly: workers that stay up (a RedisSpider waits
    for seeds), the seed pushed again 2 s, then 6 s, after the first run's last fetch."""
    run = start(workers, project, name, CLOSE_WHEN_CRAWL_DONE=False)
    with TestSite(PAGES, delay=0.01) as site:
        seed = site.page_url(0)
        every = site.expected_paths()
        client.lpush(f"{name}:start_urls", seed)
        first = wait_hits(site, len(every))
        assert set(first) == every, first
        assert set(first.values()) == {1}, first
        ended = site.last_hit_time()
        assert ended is not None

        site.reset_hits()
        time.sleep(max(0.0, ended + 2 - time.time()))
        client.lpush(f"{name}:start_urls", seed)
        # only the seed (dont_filter by default, as in scrapy-redis): its links were seen
        assert wait_hits(site, 1) == {"/page/0": 1}

        site.reset_hits()
        time.sleep(max(0.0, ended + WINDOW + 1 - time.time()))
        client.lpush(f"{name}:start_urls", seed)
        third = wait_hits(site, len(every))
        assert set(third) == every, third
        assert set(third.values()) == {1}, third
    assert all(w.process.poll() is None for w in run), "\n".join(w.log_tail(30) for w in run)


@pytest.mark.e2e
def test_scrapy_crawl_run_again_within_the_window_fetches_only_its_seed(
    project: Path, name: str, client: redis.Redis, workers: list[Worker]
) -> None:
    """``scrapy crawl`` run again (new processes that exit when done, the dupefilter
    persisted): within the window it fetches only its seed. (A window long enough for
    a loaded machine to start the second run within it; the window's end is timed
    exactly in the test above, with workers that stay up.)"""
    settings = {"DUPEFILTER_RECRAWL_AFTER": 120}
    with TestSite(PAGES, delay=0.01) as site:
        seed = site.page_url(0)
        every = site.expected_paths()
        for expected in ("all", "seed"):
            run = start(workers, project, name, **settings)
            site.reset_hits()
            client.lpush(f"{name}:start_urls", seed)
            assert wait_workers(run, RUN_TIMEOUT) == [0, 0], run[0].log_tail(30)
            hits = site.hits()
            if expected == "seed":
                assert hits == {"/page/0": 1}
            else:
                assert set(hits) == every, hits
                assert set(hits.values()) == {1}, hits
    assert client.type(f"{name}:dupefilter") == b"zset"


# -- backends, against the session's redis-server ------------------------------------

#: A short window for the unit tests: generations of 100 ms.
SHORT = 0.8


def fps(seed: int, count: int) -> list[bytes]:
    import random

    rng = random.Random(seed)
    return [rng.randbytes(20) for _ in range(count)]


def backend(
    client: redis.Redis, name: str, kind: str, window: float | None = SHORT, **more: object
) -> DupefilterBackend:
    values: dict[str, object] = {"DUPEFILTER_BACKEND": kind, "BLOOM_CAPACITY": 8000, **more}
    if window is not None:
        values["DUPEFILTER_RECRAWL_AFTER"] = window
    built = backend_from_settings(Settings(values), client, RedisKeys.build(name))
    return built.open()


def held(client: redis.Redis, name: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{name}:dupefilter*", count=1000))


@pytest.mark.parametrize("raw", [0, -1, "0", "abc", "7d", True, float("nan"), float("inf"), 0.05])
def test_bad_windows_are_one_clear_error(raw: object) -> None:
    with pytest.raises(ConfigurationError, match="DUPEFILTER_RECRAWL_AFTER"):
        _ = Config.from_settings(Settings({"DUPEFILTER_RECRAWL_AFTER": raw})).dupefilter


def test_window_settings() -> None:
    def window(values: dict[str, object]) -> float | None:
        return Config.from_settings(Settings(values)).dupefilter.recrawl_after

    assert window({}) is None
    assert window({"DUPEFILTER_RECRAWL_AFTER": "604800"}) == 604800.0
    assert window({"DUPEFILTER_RECRAWL_AFTER": 5}) == 5.0
    with pytest.raises(ConfigurationError, match="cannot be combined"):
        window({"DUPEFILTER_RECRAWL_AFTER": 5, "DUPEFILTER_TTL": 10})


def test_window_generations_and_signature() -> None:
    w = RecrawlWindow(5)
    assert (w.ms, w.generation_ms, GENERATIONS) == (5000, 625, 8)
    assert w.rotating_seen_for == 4.375
    assert w.exact_seen_for == 5.0
    now = 1_000_000_000_123
    alive = w.generations(now)
    assert len(alive) == GENERATIONS
    assert all(w.expires_at(g) > now for g in alive)
    assert w.expires_at(alive.start - 1) <= now
    assert split_window_signature("v1 bits=8 window=5000/625") == ("v1 bits=8", w)
    assert split_window_signature("v1 bits=8") == ("v1 bits=8", None)
    assert split_window_signature("v1 window=5000/7") == ("v1 window=5000/7", None)


def test_no_window_keeps_todays_backends_and_arguments(client: redis.Redis, name: str) -> None:
    plain = backend(client, name, "set", window=None)
    assert type(plain) is SetBackend
    assert plain.script_args() == []
    bitmap = backend(client, name + "b", "bitmap", window=None)
    assert isinstance(bitmap, BitmapBloomBackend)
    assert len(bitmap.script_args()) == 4
    assert " window=" not in bitmap.signature


@pytest.mark.parametrize("kind", ["set", "bitmap", "buckets"])
def test_seen_within_the_window_new_after_it(client: redis.Redis, name: str, kind: str) -> None:
    b = backend(client, name, kind)
    first, later = fps(1, 50), fps(2, 50)
    assert b.add_many(first) == [True] * 50
    assert b.add_many(first) == [False] * 50
    assert all(b.contains_many(first))
    time.sleep(SHORT / 2)
    assert b.add_many(later) == [True] * 50
    time.sleep(SHORT / 2 + 0.15)
    # the first batch left the window, the later one is still in it
    assert b.contains_many(first) == [False] * 50
    assert b.contains_many(later) == [True] * 50
    assert b.add_many(first) == [True] * 50  # fetched again: recorded anew
    assert b.add_many(first) == [False] * 50


def test_exact_window_is_exact(client: redis.Redis, name: str) -> None:
    b = backend(client, name, "set", window=0.5)
    assert isinstance(b, WindowSetBackend)
    fp = fps(3, 1)[0]
    assert b.add(fp)
    time.sleep(0.4)
    assert not b.add(fp)  # a duplicate does not renew its time
    time.sleep(0.15)
    assert b.add(fp)
    assert b.state().recrawl_after == 0.5


@pytest.mark.parametrize("kind", ["set", "bitmap", "buckets"])
def test_memory_is_bounded_old_entries_and_keys_go(
    client: redis.Redis, name: str, kind: str
) -> None:
    b = backend(client, name, kind)
    b.add_many(fps(4, 200))
    time.sleep(SHORT + 0.2)
    b.add_many(fps(5, 3))
    keys = held(client, name)
    if kind == "set":
        assert client.zcard(f"{name}:dupefilter") == 3  # expired entries trimmed
        assert 0 < client.pttl(f"{name}:dupefilter") <= SHORT * 1000
    else:
        # only the main key and the current generation's keys: the rest expired
        assert all(client.pttl(k) > 0 for k in keys if k != f"{name}:dupefilter".encode())
        assert len(keys) <= 8  # 200 fingerprints were in dozens of keys
    assert len(b) == 3
    time.sleep(SHORT + 0.2)
    assert len(b) == 0
    left = held(client, name)
    assert left in ([], [f"{name}:dupefilter".encode()])


def test_bitmap_generations_are_presized_and_expire(client: redis.Redis, name: str) -> None:
    b = backend(client, name, "bitmap")
    assert isinstance(b, BitmapBloomBackend)
    b.add_many(fps(6, 10))
    segments = [k for k in held(client, name) if k.count(b":") >= 5]
    assert segments, held(client, name)
    assert all(0 < client.pttl(k) <= SHORT * 1000 + 200 for k in segments)
    state = b.state()
    assert state.count == 10
    assert state.recrawl_after == SHORT


def test_changing_or_dropping_the_window_is_refused_at_open(client: redis.Redis, name: str) -> None:
    for kind in ("bitmap", "buckets"):
        key = f"{name}{kind}"
        backend(client, key, kind).add(b"x" * 20)
        with pytest.raises(ConfigurationError, match="DUPEFILTER_RECRAWL_AFTER"):
            backend(client, key, kind, window=2 * SHORT)
        with pytest.raises(ConfigurationError, match="DUPEFILTER_RECRAWL_AFTER"):
            backend(client, key, kind, window=None)
    # the exact zset stores times, not a window: a new window is fine
    backend(client, name, "set").add(b"x" * 20)
    assert not backend(client, name, "set", window=2 * SHORT).add(b"x" * 20)
    with pytest.raises(ConfigurationError, match="recrawl window"):
        backend(client, name, "set", window=None)


def test_a_window_on_an_existing_set_is_an_error_or_a_migration(
    client: redis.Redis, name: str
) -> None:
    plain = backend(client, name, "set", window=None)
    plain.add_many(fps(7, 30))
    with pytest.raises(ConfigurationError, match="migrate_to_window"):
        backend(client, name, "set")
    key = f"{name}:dupefilter"
    client.rename(key, f"{key}:old")
    windowed = WindowSetBackend(client, key, window=RecrawlWindow(SHORT))
    assert migrate_to_window(client, f"{key}:old", windowed) == 30
    assert all(windowed.contains_many(fps(7, 30)))
    time.sleep(SHORT + 0.1)
    assert not any(windowed.contains_many(fps(7, 30)))


@pytest.mark.parametrize("kind", ["set", "bitmap", "buckets"])
def test_enqueue_is_atomic_and_queues_again_after_the_window(
    client: redis.Redis, name: str, kind: str
) -> None:
    b = backend(client, name, kind)
    keys = RedisKeys.build(name)
    queue = FifoQueue(client, keys.requests, keys.seq)
    items = [(b"p%d" % i, 0.0, fp) for i, fp in enumerate(fps(8, 20))]
    assert queue.push(items, b) == [True] * 20
    assert queue.push(items, b) == [False] * 20
    assert len(queue) == 20
    time.sleep(SHORT + 0.15)
    assert queue.push(items, b) == [True] * 20
    assert len(queue) == 40


def test_oom_refusal_writes_nothing(server: RedisServer, name: str) -> None:
    with server.client() as client:
        b = backend(client, name, "set")
        keys = RedisKeys.build(name)
        queue = FifoQueue(client, keys.requests, keys.seq)
        queue.push([(b"a", 0.0, fps(9, 1)[0])], b)
        client.config_set("maxmemory", 1)  # a private test server
        try:
            with pytest.raises(redis.exceptions.ResponseError, match=OOM_REFUSED):
                queue.push([(b"p", 0.0, fp) for fp in fps(10, 5)], b)
        finally:
            client.config_set("maxmemory", 0)
        assert len(queue) == 1
        assert not any(b.contains_many(fps(10, 5)))


def test_redisbloom_window(client: redis.Redis, name: str, redisbloom_loaded: bool) -> None:
    if not redisbloom_loaded:
        pytest.skip("the session's Redis has no RedisBloom (--redis-kind=redisbloom)")
    b = backend(client, name, "redisbloom")
    assert isinstance(b, RedisBloomBackend)
    first = fps(11, 40)
    assert b.add_many(first) == [True] * 40
    assert b.add_many(first) == [False] * 40
    assert len(b) == 40
    assert b.state().recrawl_after == SHORT
    time.sleep(SHORT + 0.15)
    assert b.add_many(first) == [True] * 40
    time.sleep(SHORT + 0.15)
    assert held(client, name) == [f"{name}:dupefilter".encode()]
    with pytest.raises(ConfigurationError, match="DUPEFILTER_RECRAWL_AFTER"):
        backend(client, name, "redisbloom", window=None)
    with pytest.raises(ConfigurationError):
        backend(client, name, "redisbloom", window=2 * SHORT)


# -- the per-worker cache ------------------------------------------------------------


def test_local_cache_never_outlives_the_window(client: redis.Redis, name: str) -> None:
    from scrapy import Request

    b = backend(client, name, "set", window=0.5)
    df = RFPDupeFilter(b, None, local=LocalSet(1000))
    df.open()
    assert df.seen_for == 0.5
    request = Request("https://example.com/a")
    assert not df.request_seen(request)
    fingerprint = df.fingerprint(request)
    assert fingerprint in df.local  # type: ignore[operator]
    assert df.request_seen(request)  # from the cache
    time.sleep(0.55)
    assert not df.request_seen(request)  # the cache was emptied with the window
    # a duplicate found in Redis is never cached: its record may be about to expire
    other = Request("https://example.com/b")
    b.add(df.fingerprint(other))
    assert df.request_seen(other)
    assert df.fingerprint(other) not in df.local  # type: ignore[operator]


def test_local_cache_without_window_is_unchanged(client: redis.Redis, name: str) -> None:
    from scrapy import Request

    df = RFPDupeFilter(backend(client, name, "set", window=None), None, local=LocalSet(1000))
    df.open()
    other = Request("https://example.com/b")
    df.backend.add(df.fingerprint(other))
    assert df.request_seen(other)
    assert df.fingerprint(other) in df.local  # type: ignore[operator]


def test_status_shows_the_window(client: redis.Redis, name: str) -> None:
    from scrapy_dist.cli.status import _recrawl_lines
    from scrapy_dist.status import dupefilter_state

    backend(client, name, "set").add_many(fps(12, 4))
    keys = RedisKeys.build(name)
    configured = Config.from_settings(Settings({"DUPEFILTER_RECRAWL_AFTER": SHORT}))
    assert dupefilter_state(client, configured, keys).recrawl_after == SHORT
    bare = dupefilter_state(client, Config.from_settings(Settings()), keys)
    assert bare.count == 4
    assert bare.recrawl_after is None
    assert "recrawl window: 0.8 s" in _recrawl_lines(SHORT)[0]
    bitmap = f"{name}b"
    backend(client, bitmap, "bitmap").add_many(fps(13, 4))
    state = dupefilter_state(client, Config.from_settings(Settings()), RedisKeys.build(bitmap))
    assert state.recrawl_after == SHORT
    assert state.count == 4


def test_bloom_params_share() -> None:
    from scrapy_dist.filters.choice import generation_params

    share = generation_params(BloomParams.from_capacity(80_000, 0.001))
    assert share.capacity == 10_000
    assert share.error_rate == 0.001


def test_a_large_bitmap_generation_is_presized_by_the_worker_never_in_an_enqueue(
    client: redis.Redis, name: str
) -> None:
    """A generation's stage over 8 MiB is never allocated inside a script: the call
    answers DUPEFILTER_STALE, the worker pre-sizes it and retries (also after a flush)."""
    b = backend(client, name, "bitmap", window=2.0, BLOOM_CAPACITY=40_000_000)
    assert isinstance(b, BitmapBloomBackend)
    assert b.stages[0].bits > 2**26
    keys = RedisKeys.build(name)
    queue = FifoQueue(client, keys.requests, keys.seq)
    items = [(b"p", 0.0, fp) for fp in fps(14, 5)]
    assert b.add_many([fp for _, _, fp in items]) == [True] * 5
    b.clear()
    assert b.add_many([fp for _, _, fp in items]) == [True] * 5  # after a flush: a new run
    time.sleep(0.6)  # a later generation, prepared ahead by the worker's view
    b.script_keys()
    assert queue.push(items, b) == [False] * 5


@pytest.mark.parametrize("refusal", ["oom", "noreplicas", "readonly"])
@pytest.mark.parametrize("kind", ["set", "bitmap", "buckets"])
def test_refusals_write_nothing_and_pass(server: RedisServer, kind: str, refusal: str) -> None:
    """Each refusal is an outage for the windowed filters too: the call fails without
    writing (nothing queued, nothing recorded), and works once it is lifted."""
    from scrapy_dist.testing.refusals import refuse_noreplicas, refuse_oom, refuse_readonly

    refuse = {"oom": refuse_oom, "noreplicas": refuse_noreplicas, "readonly": refuse_readonly}
    with server.client() as client:
        b = backend(client, "r", kind)
        keys = RedisKeys.build("r")
        queue = FifoQueue(client, keys.requests, keys.seq)
        queue.push([(b"a", 0.0, fps(15, 1)[0])], b)
        items = [(b"p", 0.0, fp) for fp in fps(16, 5)]
        lift = refuse[refusal](client)
        try:
            with pytest.raises(redis.exceptions.ResponseError):
                queue.push(items, b)
        finally:
            lift()
        assert len(queue) == 1
        assert not any(b.contains_many([fp for _, _, fp in items]))
        assert queue.push(items, b) == [True] * 5


# -- found by attacking the merged window (windows with eviction, deleted keys, huge
# values, status without the setting) -------------------------------------------------


def test_a_volatile_eviction_policy_is_refused_with_a_window(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """The window's keys expire, so a volatile-* policy evicts exactly them (pages
    crawled again, a Bloom segment re-created without expiry): refused at start, as
    with DUPEFILTER_TTL."""
    from scrapy.utils.misc import build_from_crawler

    from scrapy_dist.scheduler import Scheduler
    from scrapy_dist.worker.startup import start_failure

    client.config_set("maxmemory-policy", "volatile-lru")
    try:
        for kind in ("set", "bitmap"):
            crawler = make_crawler({"DUPEFILTER_BACKEND": kind, "DUPEFILTER_RECRAWL_AFTER": 60})
            scheduler: Scheduler = build_from_crawler(Scheduler, crawler)
            scheduler.deliveries.in_flight = set
            assert crawler.spider is not None
            scheduler.open(crawler.spider)
            if scheduler.heartbeat.ticker is not None:
                scheduler.heartbeat.ticker.stop()
            failure = start_failure(crawler)
            assert failure is not None, kind
            assert "maxmemory-policy volatile-lru" in failure.message
    finally:
        client.config_set("maxmemory-policy", "noeviction")


def test_a_deleted_bitmap_segment_comes_back_with_its_generations_expiry(
    client: redis.Redis, name: str
) -> None:
    """A segment deleted (or evicted) mid-generation is re-created by SETBIT: it must
    expire with its generation, not stay forever."""
    b = backend(client, name, "bitmap", window=60)
    b.add_many(fps(20, 5))
    segments = [k for k in held(client, name) if k.count(b":") >= 5]
    client.delete(*segments)
    assert b.add_many(fps(21, 5)) == [True] * 5
    left = [k for k in held(client, name) if k != f"{name}:dupefilter".encode()]
    assert left
    assert all(client.pttl(k) > 0 for k in left), [(k, client.pttl(k)) for k in left]


@pytest.mark.parametrize("raw", [1e308, "1e14", 10**13])
def test_a_window_too_long_for_redis_is_one_clear_error(raw: object) -> None:
    with pytest.raises(ConfigurationError, match="DUPEFILTER_RECRAWL_AFTER must be at most"):
        _ = Config.from_settings(Settings({"DUPEFILTER_RECRAWL_AFTER": raw})).dupefilter


@pytest.mark.parametrize("kind", ["set", "bitmap", "buckets"])
def test_the_longest_window_works(client: redis.Redis, name: str, kind: str) -> None:
    from scrapy_dist.settings import RECRAWL_MAX_SECONDS

    b = backend(client, name, kind, window=RECRAWL_MAX_SECONDS)
    assert b.add_many(fps(22, 2)) == [True, True]
    assert b.add_many(fps(22, 2)) == [False, False]


def test_status_without_the_setting_counts_a_buckets_window(client: redis.Redis, name: str) -> None:
    """``scrapy-dist status`` run without DUPEFILTER_RECRAWL_AFTER reads the window the
    buckets recorded: the window's count, not every fingerprint ever recorded."""
    from scrapy_dist.status import dupefilter_state

    b = backend(client, name, "buckets")
    b.add_many(fps(23, 5))
    time.sleep(SHORT + 0.15)
    b.add_many(fps(24, 3))
    state = dupefilter_state(client, Config.from_settings(Settings()), RedisKeys.build(name))
    assert state.recrawl_after == SHORT
    assert state.count == 3


def test_status_without_the_setting_counts_a_redisbloom_window(
    client: redis.Redis, name: str, redisbloom_loaded: bool
) -> None:
    """Read without DUPEFILTER_RECRAWL_AFTER, a windowed RedisBloom filter was shown as
    missing with 0 fingerprints: it is read with the window its main hash records."""
    if not redisbloom_loaded:
        pytest.skip("the session's Redis has no RedisBloom (--redis-kind=redisbloom)")
    from scrapy_dist.status import dupefilter_state

    backend(client, name, "redisbloom").add_many(fps(25, 5))
    state = dupefilter_state(client, Config.from_settings(Settings()), RedisKeys.build(name))
    assert state.exists
    assert state.count == 5
    assert state.recrawl_after == SHORT


@pytest.mark.parametrize("kind", ["bitmap", "buckets", "set"])
def test_reset_deletes_every_generation_of_a_window(  # noqa: PLR0917
    client: redis.Redis,
    redis_url: str,
    name: str,
    kind: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from scrapy_dist.cli import main

    b = backend(client, name, kind, window=60)
    b.add_many(fps(21, 40))
    assert held(client, name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    common = ["-s", f"REDIS_URL={redis_url}", "-s", f"DUPEFILTER_BACKEND={kind}"]
    assert main(["reset", name, "--yes", *common]) == 0, capsys.readouterr()
    assert held(client, name) == []  # no generation left to expire a window later
