"""Items as a stream: RedisStreamPipeline, consumer groups (scrapy_dist.streams), the
``scrapy-dist items`` commands, status and metrics.

From the user's side first: two ``scrapy crawl`` workers write the stream, two groups
each read every item, a consumer killed with items pending loses none; then the API
against a real redis-server."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy.utils.test import get_crawler

from scrapy_dist.cli import main
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.metrics import CrawlMetrics
from scrapy_dist.pipelines import RedisPipeline, RedisStreamPipeline
from scrapy_dist.settings import Config
from scrapy_dist.status import CrawlLayout, read_status
from scrapy_dist.stream_admin import (
    count_after,
    create_group,
    group_states,
    read_range,
    requeue_dead,
    set_group_position,
    stream_state,
    to_stream_id,
)
from scrapy_dist.streams import ItemConsumer
from scrapy_dist.testing.crawl import WorkerCrawl
from scrapy_dist.testing.refusals import refuse_noreplicas, refuse_oom, refuse_readonly
from scrapy_dist.testing.site import TestSite
from scrapy_dist.writers import StreamWriter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy.crawler import Crawler

    from scrapy_dist.testing.redis_server import RedisServer

PROJECT = Path(__file__).parent / "project"
PAGES = 60

CONSUMER = textwrap.dedent(
    """
    import sys, time, redis
    from scrapy_dist.streams import ItemConsumer

    url, stream, group, name, out, delay, min_idle = sys.argv[1:8]
    client = redis.Redis.from_url(url)
    consumer = ItemConsumer(client, stream, group, name, min_idle=float(min_idle))
    idle_since = time.monotonic()
    with open(out, "a", buffering=1) as f:
        while time.monotonic() - idle_since < 2:
            entries = consumer.read(count=10, block=0.2)
            if entries:
                idle_since = time.monotonic()
            for entry in entries:
                f.write(f"got {entry.id} {entry.item['url']}\\n")
                time.sleep(float(delay))
                consumer.ack(entry.id)
                f.write(f"ack {entry.id}\\n")
    """
)


def _consumer(
    tmp_path: Path, url: str, stream: str, group: str, name: str, *, delay: float, min_idle: float
) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    out = tmp_path / f"{name}.log"
    args = [url, stream, group, name, str(out), str(delay), str(min_idle)]
    process = subprocess.Popen([sys.executable, str(script), *args], env=dict(os.environ))
    return process, out


def _lines(path: Path, verb: str) -> list[str]:
    if not path.exists():
        return []
    return [line.split()[1] for line in path.read_text().splitlines() if line.startswith(verb)]


@pytest.mark.e2e
@pytest.mark.redis_server
def test_two_groups_each_read_every_item_and_a_killed_consumer_loses_none(
    server: RedisServer, tmp_path: Path
) -> None:
    stream = "pages:items:stream"
    admin = server.client()
    create_group(admin, stream, "store")
    create_group(admin, stream, "index")
    settings = {
        "CONCURRENT_REQUESTS": 4,
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_WORKER_TIMEOUT": 2,
        "CLOSE_WHEN_CRAWL_DONE": True,
        "CRAWL_DONE_GRACE": 1,
        "ITEM_PIPELINES": json.dumps({"scrapy_dist.pipelines.RedisStreamPipeline": 300}),
        "REDIS_ITEMS_FLUSH_INTERVAL": 0.1,
        "REDIS_ITEMS_BATCH_SIZE": 7,
    }
    # both workers open before the seed, and pages slow enough (60 pages last at least
    # 1.5 s for one worker) that both take part: on a loaded machine one worker could
    # otherwise open after the other had crawled the whole site alone
    with TestSite(pages=PAGES, delay=0.1) as site:
        crawl = WorkerCrawl(server, site, tmp_path, project_dir=PROJECT, settings=settings)
        try:
            crawl.start(2)
            crawl.wait_ready()
            crawl.seed()
            assert crawl.wait(90) == [0, 0], crawl.logs()
            assert not crawl.missing()
            assert "has no cap (REDIS_ITEMS_STREAM_MAXLEN = 0)" in crawl.full_logs()
        finally:
            crawl.close()
        urls = {site.page_url(i) for i in range(PAGES)}

    entries = list(read_range(admin, stream))
    assert len(entries) == PAGES
    assert {json.loads(f["item"])["url"] for _, f in entries} == urls
    assert {f["spider"] for _, f in entries} == {"pages"}
    assert len({f["worker"] for _, f in entries}) == 2  # both workers wrote
    # lag exact before anyone reads
    assert {g.name: (g.lag, g.pending) for g in group_states(admin, stream)} == {
        "store": (PAGES, 0),
        "index": (PAGES, 0),
    }

    # group "store": a slow consumer is killed with items pending, another takes over
    first, first_log = _consumer(
        tmp_path, server.url, stream, "store", "store-1", delay=0.1, min_idle=60
    )
    try:
        deadline = time.monotonic() + 20
        while len(_lines(first_log, "ack")) < 5:
            assert time.monotonic() < deadline
            assert first.poll() is None
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    (state,) = [g for g in group_states(admin, stream) if g.name == "store"]
    held = {c.name: c.pending for c in state.consumers}["store-1"]
    assert held > 0  # killed with items pending
    assert state.pending == held
    # delivered to the group = acknowledged + pending: the lag is the rest, exactly
    assert state.lag == PAGES - len(_lines(first_log, "ack")) - held
    rows: Any = admin.xpending_range(stream, "store", "-", "+", 100, consumername="store-1")
    orphans = {r["message_id"].decode() for r in rows}
    assert len(orphans) == held

    # "index" read in this process meanwhile: k of n read, lag n - k, exactly
    index = ItemConsumer(admin, stream, "index", "index-1")
    got = index.read(count=25)
    assert len(got) == 25
    (idx,) = [g for g in group_states(admin, stream) if g.name == "index"]
    assert (idx.lag, idx.pending) == (PAGES - 25, 25)
    index.ack(*[e.id for e in got[:10]])
    (idx,) = [g for g in group_states(admin, stream) if g.name == "index"]
    assert (idx.lag, idx.pending) == (PAGES - 25, 15)
    while batch := index.read(count=25):
        got += batch
        index.ack(*[e.id for e in batch])
    index.ack(*[e.id for e in got])
    assert sorted(e.item["url"] for e in got) == sorted(urls)

    second, second_log = _consumer(
        tmp_path, server.url, stream, "store", "store-2", delay=0, min_idle=0.5
    )
    try:
        assert second.wait(30) == 0
    finally:
        if second.poll() is None:
            second.kill()
    acked = _lines(first_log, "ack") + _lines(second_log, "ack")
    assert len(set(acked)) == PAGES  # every item acknowledged, none lost
    assert len(acked) == PAGES  # and none acknowledged twice
    assert orphans <= set(_lines(second_log, "ack"))  # the killed one's, taken over
    for group in group_states(admin, stream):
        assert (group.lag, group.pending) == (0, 0), group


# -- the API against a real server ---------------------------------------------------


@pytest.fixture
def rclient(module_server: RedisServer) -> Iterator[redis.Redis]:
    client = module_server.client()
    client.flushall()
    yield client
    client.close()


def _fill(client: redis.Redis, n: int, stream: str = "s") -> list[str]:
    added: list[Any] = [
        client.xadd(stream, {"item": json.dumps({"i": i}), "spider": "x"}) for i in range(n)
    ]
    return [entry_id.decode() for entry_id in added]


@pytest.mark.redis_server
def test_lag_and_pending_are_exact_at_every_step(rclient: redis.Redis) -> None:
    ids = _fill(rclient, 20)
    create_group(rclient, "s", "g")
    consumer = ItemConsumer(rclient, "s", "g", "c")

    def figures() -> tuple[int | None, int]:
        (g,) = group_states(rclient, "s")
        return g.lag, g.pending

    assert figures() == (20, 0)
    first = consumer.read(count=7)
    assert [e.item["i"] for e in first] == list(range(7))
    assert figures() == (13, 7)
    assert consumer.ack(*[e.id for e in first[:3]]) == 3
    assert figures() == (13, 4)
    rest = consumer.read(count=100)
    assert len(rest) == 13
    assert figures() == (0, 17)
    _fill(rclient, 5)
    assert figures() == (5, 17)
    # after a deletion Redis 7 cannot tell the lag: it is counted, still exact
    rclient.xdel("s", ids[3])
    set_group_position(rclient, "s", "g", ids[10])
    (g,) = group_states(rclient, "s")
    assert (g.lag, g.lag_source) == (15, "counted")
    assert count_after(rclient, "s", ids[10]) == 14
    assert count_after(rclient, "s", "0") == 24


@pytest.mark.redis_server
def test_lag_is_counted_where_redis_has_none(
    rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(rclient, 12)
    create_group(rclient, "s", "g")
    ItemConsumer(rclient, "s", "g", "c").read(count=5)
    real = rclient.xinfo_groups

    def without_lag(name: str) -> Any:  # Redis 6.2: no lag, no entries-read
        return [
            {k: v for k, v in g.items() if k not in ("lag", "entries-read")} for g in real(name)
        ]

    monkeypatch.setattr(rclient, "xinfo_groups", without_lag)
    (g,) = group_states(rclient, "s")
    assert (g.lag, g.pending, g.lag_source, g.entries_read) == (7, 5, "counted", None)


@pytest.mark.redis_server
def test_an_item_rejected_n_times_lands_in_the_dead_stream(rclient: redis.Redis) -> None:
    _fill(rclient, 3)
    a = ItemConsumer(rclient, "s", "g", "a", max_deliveries=3)
    b = ItemConsumer(rclient, "s", "g", "b", max_deliveries=3)
    (bad, *good) = a.read(count=3)
    a.ack(*[e.id for e in good])
    assert not a.reject(bad.id, "no price")
    again = b.read(count=10)  # at once, by any consumer of the group
    assert [(e.id, e.deliveries) for e in again] == [(bad.id, 2)]
    assert not b.reject(bad.id, "no price")
    (third,) = a.read(count=10)
    assert third.deliveries == 3
    assert a.reject(bad.id, "no price, really")
    assert a.read(count=10) == []
    (dead,) = list(read_range(rclient, "s:dead-letters"))
    fields = dead[1]
    assert json.loads(fields["item"]) == {"i": 0}
    assert fields["dead_reason"] == "no price, really"
    assert (fields["dead_id"], fields["dead_group"], fields["dead_deliveries"]) == (
        bad.id,
        "g",
        "3",
    )
    (g,) = group_states(rclient, "s")
    assert (g.lag, g.pending) == (0, 0)  # in the dead stream, not pending: never both
    new_id = requeue_dead(rclient, "s", dead[0])
    assert new_id is not None
    assert rclient.xlen("s:dead-letters") == 0
    (back,) = a.read(count=10)
    assert back.item == {"i": 0}
    assert back.fields["requeued_from"] == dead[0]
    assert "dead_reason" not in back.fields
    assert requeue_dead(rclient, "s", dead[0]) is None


@pytest.mark.redis_server
def test_items_of_a_dead_consumer_are_reclaimed_and_dead_after_max_deliveries(
    rclient: redis.Redis,
) -> None:
    _fill(rclient, 4)
    crashed = ItemConsumer(rclient, "s", "g", "crashed", min_idle=0.1, max_deliveries=2)
    assert len(crashed.read(count=4)) == 4  # never acknowledged: it "dies"
    time.sleep(0.15)
    heir = ItemConsumer(rclient, "s", "g", "heir", min_idle=0.1, max_deliveries=2)
    taken = heir.read(count=10)
    assert [e.deliveries for e in taken] == [2] * 4
    assert heir.counts["reclaimed"] == 4
    time.sleep(0.15)  # the heir dies too: a third delivery is one too many
    third = ItemConsumer(rclient, "s", "g", "third", min_idle=0.1, max_deliveries=2)
    assert third.read(count=10) == []
    assert rclient.xlen("s:dead-letters") == 4
    reasons = {f["dead_reason"] for _, f in read_range(rclient, "s:dead-letters")}
    assert reasons == {"delivered 2 time(s) without acknowledgement"}


@pytest.mark.redis_server
def test_a_restarted_consumer_gets_its_own_pending_items_first(rclient: redis.Redis) -> None:
    _fill(rclient, 6)
    ItemConsumer(rclient, "s", "g", "c").read(count=4)
    again = ItemConsumer(rclient, "s", "g", "c")  # same name, after a restart
    entries = again.read(count=10)
    assert [e.item["i"] for e in entries] == [0, 1, 2, 3, 4, 5]
    assert [e.deliveries for e in entries] == [2, 2, 2, 2, 1, 1]


@pytest.mark.redis_server
def test_hostile_entries_go_to_the_dead_stream_and_the_consumer_goes_on(
    rclient: redis.Redis,
) -> None:
    import pickle

    rclient.xadd("s", {"item": pickle.dumps({"x": 1})})
    rclient.xadd("s", {"no_item": "x"})
    rclient.xadd("s", {"item": b"\xff\xfe{"})
    rclient.xadd("s", {"item": "[1, 2"})
    rclient.xadd("s", {"item": json.dumps({"ok": True}), "dead_reason": "forged"})
    consumer = ItemConsumer(rclient, "s", "g", "c")
    (good,) = consumer.read(count=10)
    assert good.item == {"ok": True}
    assert rclient.xlen("s:dead-letters") == 4
    reasons = [f["dead_reason"] for _, f in read_range(rclient, "s:dead-letters")]
    assert all(r.startswith("malformed") for r in reasons), reasons
    with pytest.raises(ConfigurationError):
        consumer.ack("1-0; FLUSHALL")
    with pytest.raises(ConfigurationError):
        consumer.reject("+", "x")


@pytest.mark.redis_server
def test_an_acknowledgement_redis_refuses_is_kept_and_sent_again(
    rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(rclient, 3)
    consumer = ItemConsumer(rclient, "s", "g", "c")
    entries = consumer.read(count=3)
    real = rclient.xack
    calls = {"n": 0}

    def failing(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.ConnectionError("cut")
        return real(*args)

    monkeypatch.setattr(rclient, "xack", failing)
    with pytest.raises(redis.ConnectionError):
        consumer.ack(*[e.id for e in entries])
    assert consumer.unacked == 3
    assert consumer.read(count=3, block=None) == []  # sends the kept ones first
    assert consumer.unacked == 0
    (g,) = group_states(rclient, "s")
    assert g.pending == 0


@pytest.mark.redis_server
def test_run_survives_an_outage_and_acks_everything(
    module_server: RedisServer, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(rclient, 10)
    consumer = ItemConsumer(rclient, "s", "g", "c")
    seen: list[int] = []
    real = rclient.xreadgroup
    state = {"fails": 2}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if state["fails"]:
            state["fails"] -= 1
            raise redis.ConnectionError("down")
        return real(*args, **kwargs)

    monkeypatch.setattr(rclient, "xreadgroup", flaky)
    monkeypatch.setattr("scrapy_dist.streams.BACKOFF_MIN", 0.01)

    def handle(entry: Any) -> None:
        if entry.item["i"] == 4:
            raise ValueError("bad item")
        seen.append(entry.item["i"])

    consumer.max_deliveries = 1
    consumer.run(handle, count=3, block=0.05, stop=lambda: len(seen) >= 9)
    assert sorted(seen) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert rclient.xlen("s:dead-letters") == 1
    (g,) = group_states(rclient, "s")
    assert (g.lag, g.pending) == (0, 0)


def test_positions_users_type() -> None:
    assert to_stream_id("1700000000000-5") == "1700000000000-5"
    assert to_stream_id("1700000000000") == "1700000000000-0"
    assert to_stream_id("2023-11-14T22:13:20Z") == "1700000000000-0"
    assert to_stream_id("2023-11-14T22:13:20") == "1700000000000-0"  # UTC
    assert to_stream_id("2023-11-14T23:13:20+01:00") == "1700000000000-0"
    assert to_stream_id("1700000000000", end=True) == "1700000000000-18446744073709551615"
    assert to_stream_id("2h", now=1_700_007_200) == "1700000000000-0"
    for same in ("-", "+", "$", "0"):
        assert to_stream_id(same) == same
    for bad in ("yesterday", "1-2-3", "", "12x", "$(rm)"):
        with pytest.raises(ConfigurationError):
            to_stream_id(bad)


# -- the pipeline --------------------------------------------------------------------


def _stream_pipeline(crawler: Crawler) -> RedisStreamPipeline:
    p = RedisStreamPipeline.from_crawler(crawler)
    p.open_spider()
    return p


@pytest.mark.redis_server
def test_the_pipeline_adds_entries_and_maxlen_trims(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    p = _stream_pipeline(
        make_crawler({"REDIS_ITEMS_STREAM_MAXLEN": 50, "REDIS_ITEMS_FLUSH_INTERVAL": 0.05})
    )
    assert p.key == f"{name}:items:stream"
    for i in range(1000):
        p.process_item({"i": i, "text": "é"})
    p.close_spider()
    length = client.xlen(p.key)
    assert 50 <= length < 250  # MAXLEN ~: trimmed by whole nodes (100 entries each)
    last = list(read_range(client, p.key))[-1][1]
    assert json.loads(last["item"]) == {"i": 999, "text": "é"}
    assert last["spider"] == name
    assert last["worker"].endswith(f":{os.getpid()}")
    assert p.writer.sent == 1000
    assert not client.exists(f"{name}:items")  # the list pipeline's key untouched


@pytest.mark.redis_server
def test_an_uncapped_stream_is_warned_about_and_a_wrong_type_refused(
    make_crawler: Callable[..., Crawler],
    client: redis.Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.pipelines"):
        p = _stream_pipeline(make_crawler())
        p.close_spider()
    assert "has no cap (REDIS_ITEMS_STREAM_MAXLEN = 0)" in caplog.text
    client.rpush(f"{name}:items:stream", "x")
    with pytest.raises(ConfigurationError, match="RedisStreamPipeline adds items to a stream"):
        _stream_pipeline(make_crawler())
    with pytest.raises(ConfigurationError, match="REDIS_ITEMS_STREAM_MAXLEN"):
        Config.from_settings(make_crawler({"REDIS_ITEMS_STREAM_MAXLEN": -1}).settings).validate()


@pytest.mark.redis_server
@pytest.mark.parametrize(
    ("fault", "code"),
    [(refuse_oom, "OOM"), (refuse_noreplicas, "NOREPLICAS"), (refuse_readonly, "READONLY")],
    ids=["oom", "noreplicas", "readonly"],
)
def test_stream_items_refused_for_now_stay_buffered_in_order(
    server: RedisServer,
    tmp_path: Path,
    fault: Callable[[redis.Redis], Callable[[], object]],
    code: str,
) -> None:
    admin = server.client()
    crawler = get_crawler(settings_dict={"LOG_LEVEL": "CRITICAL"})
    writer = StreamWriter(
        server.client(),
        "x:items:stream",
        batch_size=10,
        flush_interval=0.05,
        rejected_file=str(tmp_path / "%(key)s.rejected.jl"),
        stats=crawler.stats,
    )
    writer.start()
    restore = fault(admin)
    try:
        for i in range(50):
            writer.put(str(i).encode())
        # refused at least once (waited for: a loaded machine may delay the writer's
        # first attempt), and nothing stored
        refused = f"items/redis/refused/{code}"
        deadline = time.monotonic() + 15
        while not crawler.stats.get_value(refused):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert writer.unsent == 50
    finally:
        restore()
    assert writer.close() == 0
    items = [int(f["item"]) for _, f in read_range(admin, "x:items:stream")]
    assert items == list(range(50))
    assert crawler.stats.get_value(f"items/redis/refused/{code}") >= 1


def test_the_list_pipeline_stays_the_list_pipeline(
    make_crawler: Callable[..., Crawler],
) -> None:
    p = RedisPipeline.from_crawler(make_crawler())
    assert not isinstance(p.writer, StreamWriter)
    assert p.key.endswith(":items")


class TaggedStream(RedisStreamPipeline):
    """A ``from_settings`` override keeping the stream's template."""

    tagged = False

    @classmethod
    def from_settings(cls, settings: Any) -> Any:
        pipeline = super().from_settings(settings)
        pipeline.tagged = True
        return pipeline


class NamedStream(RedisStreamPipeline):
    """A ``from_settings`` override naming its own stream, scrapy-redis's way."""

    @classmethod
    def from_settings(cls, settings: Any) -> Any:
        return cls(redis.Redis.from_url(settings["REDIS_URL"]), key=settings["OWN_STREAM"])


class OwnFactoryStream(RedisStreamPipeline):
    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls.from_settings(crawler.settings)


@pytest.mark.redis_server
def test_a_stream_pipeline_from_settings_override_builds_it(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    """A RedisStreamPipeline subclass's from_settings override was never called (its
    from_crawler built the plain pipeline), and the stream pipeline's own from_settings
    ignored the batch, buffer, rejected-file and close settings."""
    settings = {
        "SCHEDULER_JOB_ID": "j1",
        "REDIS_ITEMS_BATCH_SIZE": 7,
        "REDIS_ITEMS_BUFFER_MAX": 900,
        "REDIS_ITEMS_CLOSE_TIMEOUT": 3,
        "REDIS_ITEMS_STREAM_MAXLEN": 500,
        "OWN_STREAM": f"{name}:own",
    }
    crawler = make_crawler(settings)
    tagged = TaggedStream.from_crawler(crawler)
    assert tagged.tagged
    assert tagged.key == f"{name}:j1:items:stream"
    writer = tagged.writer
    assert isinstance(writer, StreamWriter)
    assert (writer.batch_size, writer.buffer_max, writer.stream_maxlen) == (7, 900, 500)
    assert (tagged.close_timeout, writer.stats, tagged.crawler) == (3, crawler.stats, crawler)
    named = NamedStream.from_crawler(crawler)
    assert named.key == f"{name}:own"
    for p in (tagged, named, OwnFactoryStream.from_crawler(crawler)):
        p.open_spider()
        p.process_item({"n": 1})  # Scrapy >= 2.19: no spider
        p.close_spider()
    for stream, count in ((f"{name}:j1:items:stream", 2), (f"{name}:own", 1)):
        entries = list(read_range(client, stream))
        assert len(entries) == count
        assert {fields["spider"] for _, fields in entries} == {name}
        assert all(fields["worker"].endswith(f":{os.getpid()}") for _, fields in entries)
    assert not client.exists("%(spider)s:items:stream", f"{name}:items:stream")


def test_a_bad_stream_template_kept_by_an_override_names_its_setting(
    make_crawler: Callable[..., Crawler],
) -> None:
    class BadTemplate(RedisStreamPipeline):
        @classmethod
        def from_settings(cls, settings: Any) -> Any:
            return cls(redis.Redis(), key="%(nope)s:stream")

    with pytest.raises(ConfigurationError, match="REDIS_ITEMS_STREAM_KEY"):
        BadTemplate.from_crawler(make_crawler())


# -- CLI, status, metrics ------------------------------------------------------------


@pytest.mark.redis_server
def test_cli_lag_tail_replay_groups_dead(
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = f"{name}:items:stream"
    ids = _fill(client, 6, stream)
    base = ["--redis-url", redis_url]

    def run(action: str, *args: str) -> tuple[int, str]:
        code = main(["items", action, name, *args, *base])
        return code, capsys.readouterr().out

    assert run("groups", "--create", "store")[0] == 0
    consumer = ItemConsumer(client, stream, "store", "c1")
    consumer.ack(*[e.id for e in consumer.read(count=2)])
    consumer.read(count=1)
    code, text = run("lag", "--json")
    assert code == 0
    (group,) = json.loads(text)["state"]["groups"]
    assert (group["name"], group["lag"], group["pending"]) == ("store", 3, 1)
    assert group["consumers"][0]["name"] == "c1"
    code, text = run("lag")
    assert "group store: lag 3, pending 1" in text
    assert "consumer c1: pending 1" in text
    code, text = run("replay", "--since", ids[1], "--until", ids[3])
    assert [json.loads(line)["item"]["i"] for line in text.splitlines()] == [1, 2, 3]
    code, text = run("tail", "--from", "0", "--count", "2")
    assert [json.loads(line)["id"] for line in text.splitlines()] == ids[:2]
    code, text = run("tail", "--timeout", "0.3")  # only new ones: none come
    assert (code, text) == (0, "")
    assert run("replay", "--group", "store", "--since", ids[0], "--yes")[0] == 0
    (g,) = group_states(client, stream)
    assert g.lag == 6
    consumer.dead(consumer.read(count=1)[0].id, "operator says no")
    code, text = run("dead")
    assert "operator says no" in text
    code, text = run("dead", "--all", "--json")
    assert json.loads(text) == {"requeued": 1, "missing": 0}
    code, text = run("dead", "--requeue", "1-1")
    assert code == 1
    assert main(["items", "dead", name, "--requeue", "nope", *base]) == 2
    assert main(["items", "replay", name, "--since", "tomorrow", *base]) == 2
    client.delete(stream)
    client.set(stream, "x")
    assert main(["items", "lag", name, *base]) == 2  # a key of the wrong type


@pytest.mark.redis_server
def test_status_and_metrics_show_each_groups_lag(
    redis_url: str, client: redis.Redis, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = f"{name}:items:stream"
    _fill(client, 9, stream)
    create_group(client, stream, "store")
    create_group(client, stream, "index")
    ItemConsumer(client, stream, "store", "c").read(count=4)
    assert main(["status", name, "--redis-url", redis_url]) == 0
    text = capsys.readouterr().out
    assert "group store: lag 5, pending 4" in text
    assert "group index: lag 9, pending 0" in text
    assert main(["status", name, "--json", "--redis-url", redis_url]) == 0
    data = json.loads(capsys.readouterr().out)
    lags = {g["name"]: g["lag"] for g in data["item_stream"]["groups"]}
    assert lags == {"store": 5, "index": 9}
    config = Config.from_settings(get_crawler(settings_dict={"REDIS_URL": redis_url}).settings)
    layout = CrawlLayout.from_config(config, name)
    metrics = CrawlMetrics(name, lambda: read_status(client, layout, config), max_age=0)
    rendered = metrics.render()
    assert f'scrapy_dist_items_stream_lag{{crawl="{name}",group="store"}} 5' in rendered
    assert f'scrapy_dist_items_stream_pending{{crawl="{name}",group="store"}} 4' in rendered
    state = stream_state(client, stream)
    assert state is not None
    assert state.length == 9


@pytest.mark.redis_server
def test_a_consumer_recreates_a_deleted_stream_and_group(rclient: redis.Redis) -> None:
    _fill(rclient, 2)
    consumer = ItemConsumer(rclient, "s", "g", "c", start="-")
    assert len(consumer.read(count=10)) == 2
    rclient.delete("s")
    assert consumer.read(count=10) == []  # NOGROUP: created again, from the start
    _fill(rclient, 3)
    assert [e.item["i"] for e in consumer.read(count=10)] == [0, 1, 2]


@pytest.mark.redis_server
@pytest.mark.parametrize("fault", [refuse_readonly, refuse_noreplicas], ids=["ro", "norepl"])
def test_a_consumer_through_refusals_keeps_its_acks_and_loses_nothing(
    module_server: RedisServer,
    rclient: redis.Redis,
    fault: Callable[[redis.Redis], Callable[[], object]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fill(rclient, 30)
    consumer = ItemConsumer(rclient, "s", "g", "c")
    first = consumer.read(count=10)
    restore = fault(rclient)
    try:
        with pytest.raises(redis.ResponseError):
            consumer.ack(*[e.id for e in first])
        assert consumer.unacked == 10
        with pytest.raises(redis.ResponseError):
            consumer.read(count=10)
    finally:
        restore()
    seen: list[int] = [e.item["i"] for e in first]
    monkeypatch.setattr("scrapy_dist.streams.BACKOFF_MIN", 0.01)
    consumer.run(lambda e: seen.append(e.item["i"]), count=7, block=0.05,
                 stop=lambda: consumer.state().pending == 0 and len(set(seen)) == 30)  # type: ignore[union-attr]  # fmt: skip
    assert set(seen) == set(range(30))
    (g,) = group_states(rclient, "s")
    assert (g.lag, g.pending) == (0, 0)


@pytest.mark.redis_server
def test_one_read_never_returns_an_item_twice(rclient: redis.Redis) -> None:
    _fill(rclient, 5)
    ItemConsumer(rclient, "s", "g", "c").read(count=3)
    again = ItemConsumer(rclient, "s", "g", "c", min_idle=0)  # restarted, reclaims at once
    entries = again.read(count=10)
    assert sorted(e.item["i"] for e in entries) == [0, 1, 2, 3, 4]


@pytest.mark.redis_server
def test_a_crawl_with_only_its_stream_is_found_shown_and_reset(
    redis_url: str, client: redis.Redis, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = f"{name}:items:stream"
    _fill(client, 2, stream)
    ItemConsumer(client, stream, "g", "c").dead(
        ItemConsumer(client, stream, "g", "c").read(count=1)[0].id, "x"
    )
    assert main(["jobs", "--json", "--redis-url", redis_url]) == 0
    crawls = [row["crawl"] for row in json.loads(capsys.readouterr().out)]
    assert name in crawls
    assert f"{stream}" not in crawls  # the dead stream names no crawl
    assert main(["status", name, "--json", "--redis-url", redis_url]) == 0
    assert json.loads(capsys.readouterr().out)["state"] != "absent"
    assert main(["reset", name, "--yes", "--redis-url", redis_url]) == 0
    assert not client.exists(stream, f"{stream}:dead-letters")


@pytest.mark.redis_server
def test_an_entry_with_thousands_of_fields_is_dead_lettered_not_stuck(
    rclient: redis.Redis,
) -> None:
    fields: dict[Any, Any] = {f"f{i}": "x" for i in range(5000)}
    fields["item"] = "{not json"
    rclient.xadd("s", fields)
    _fill(rclient, 1)
    consumer = ItemConsumer(rclient, "s", "g", "c")
    (good,) = consumer.read(count=10)
    assert good.item == {"i": 0}
    ((_, dead),) = list(read_range(rclient, "s:dead-letters"))
    assert dead["item"] == "{not json"
    assert dead["dead_fields_dropped"] == "5000"


@pytest.mark.redis_server
def test_tail_follows_new_items(
    redis_url: str, client: redis.Redis, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading

    stream = f"{name}:items:stream"
    _fill(client, 3, stream)  # the backlog: not shown from "$"
    later = threading.Timer(0.3, lambda: _fill(client, 2, stream))
    later.start()
    try:
        code = main(["items", "tail", name, "-n", "2", "--timeout", "10", "--redis-url", redis_url])
    finally:
        later.join()
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["item"]["i"] for line in lines] == [0, 1]  # the two added later
    assert all(line["spider"] == "x" for line in lines)
