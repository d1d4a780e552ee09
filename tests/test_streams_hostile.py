"""The items stream against hostile input, races and outages: a group deleted under a
running consumer, hostile positions typed at the CLI, a stream key outside the crawl's
hash slot under Cluster."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_dist.cli import main
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.pipelines import RedisStreamPipeline
from scrapy_dist.stream_admin import group_states, read_range, to_stream_id
from scrapy_dist.streams import ItemConsumer, StreamEntry

if TYPE_CHECKING:
    from scrapy_dist.testing import ClusterServers


@pytest.mark.redis_server
def test_run_goes_on_when_the_group_is_deleted_under_a_rejection(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    rclient = client
    stream = f"{name}:items:stream"
    for i in range(3):
        rclient.xadd(stream, {"item": json.dumps({"i": i})})
    consumer = ItemConsumer(rclient, stream, "g", "c1", min_idle=0.0)
    seen: list[int] = []
    rounds = iter(range(50))

    def handle(entry: StreamEntry) -> None:
        seen.append(entry.item["i"])
        if len(seen) == 1:  # e.g. `scrapy-dist items groups --delete g` meanwhile
            rclient.xgroup_destroy(stream, "g")
            raise ValueError("bad item")

    with caplog.at_level(logging.WARNING, logger="scrapy_dist.streams"):
        consumer.run(handle, count=10, block=0.01, stop=lambda: next(rounds) >= 5)
    assert set(seen) == {0, 1, 2}  # recreated from the start: every item processed


@pytest.mark.redis_server
def test_tail_from_the_start_of_an_empty_stream(redis_url: str, name: str) -> None:
    args = ["items", "tail", name, "--redis-url", redis_url, "--timeout", "0.2"]
    assert main([*args, "--from", "-"]) == 0
    assert main([*args, "--from", "0"]) == 0


def test_positions_beyond_a_stream_id_are_refused() -> None:
    for bad in ("99999999999999999999-0", "1-99999999999999999999", "99999999999999999999"):
        with pytest.raises(ConfigurationError):
            to_stream_id(bad)
    assert to_stream_id("18446744073709551615-18446744073709551615") != ""


def test_a_stream_key_outside_the_crawls_slot_is_refused_at_open(
    redis_cluster: ClusterServers, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [f"{host}:{port}" for host, port in redis_cluster.startup_nodes]
    spider = type("S", (Spider,), {"name": "pages"})
    settings: dict[str, Any] = {"REDIS_STARTUP_NODES": nodes, "LOG_LEVEL": "CRITICAL"}
    crawler = get_crawler(spider, {**settings, "REDIS_ITEMS_STREAM_KEY": "all-items-stream"})
    with pytest.raises(ConfigurationError, match="all-items-stream"):
        RedisStreamPipeline.from_crawler(crawler).open_spider()
    crawler = get_crawler(spider, {**settings, "SCHEDULER_SHARDS": 3})  # stream: shard 0
    p = RedisStreamPipeline.from_crawler(crawler)
    p.open_spider()
    p.process_item({"ü": "é" * 10})
    p.close_spider()
    with redis_cluster.client() as client:
        node = client.get_node_from_key(p.key)
        conn = client.get_redis_connection(node)
        entries = list(read_range(conn, p.key))
        ItemConsumer(conn, p.key, "store", "s1").read(count=10)
        try:
            cli = ["-s", f"REDIS_STARTUP_NODES={','.join(nodes)}"]
            capsys.readouterr()
            assert main(["items", "lag", "pages", "--json", *cli]) == 0
            state = json.loads(capsys.readouterr().out)["state"]
            assert [(g["name"], g["lag"], g["pending"]) for g in state["groups"]] == [
                ("store", 0, 1)
            ]
            assert main(["items", "tail", "pages", "--from", "-", "-n", "1", *cli]) == 0
            assert json.loads(capsys.readouterr().out)["item"] == {"ü": "é" * 10}
            assert main(["status", "pages", *cli]) == 0
            assert "group store: lag 0, pending 1" in capsys.readouterr().out
        finally:
            client.delete(p.key)
    assert [json.loads(f["item"]) for _, f in entries] == [{"ü": "é" * 10}]


@pytest.mark.redis_server
def test_lag_stays_exact_after_the_stream_is_trimmed_past_a_group(
    client: redis.Redis, name: str
) -> None:
    stream = f"{name}:items:stream"
    for i in range(10):
        client.xadd(stream, {"item": json.dumps({"i": i})})
    slow = ItemConsumer(client, stream, "g", "slow", min_idle=0.0)
    assert len(slow.read(count=5)) == 5
    client.xtrim(stream, maxlen=2, approximate=False)  # REDIS_ITEMS_STREAM_MAXLEN at work
    for i in range(3):
        client.xadd(stream, {"item": json.dumps({"i": 100 + i})})
    other = ItemConsumer(client, stream, "g", "other", min_idle=0.0)
    got = other.read(count=100)
    assert [e.item["i"] for e in got] == [8, 9, 100, 101, 102]
    assert other.counts["trimmed"] == 5
    (group,) = group_states(client, stream)
    assert (group.lag, group.pending) == (0, 5)  # Redis 7.0 says lag 3: the trimmed ones
    other.ack(*[e.id for e in got])
    client.xadd(stream, {"item": "{}"})
    (group,) = group_states(client, stream)
    assert (group.lag, group.pending) == (1, 0)


@pytest.mark.redis_server
def test_a_slow_consumer_cannot_reject_an_item_taken_over_by_another(
    client: redis.Redis, name: str
) -> None:
    stream = f"{name}:items:stream"
    client.xadd(stream, {"item": json.dumps({"i": 1})})
    slow = ItemConsumer(client, stream, "g", "slow", min_idle=0.0, max_deliveries=1)
    (entry,) = slow.read(count=1)
    fast = ItemConsumer(client, stream, "g", "fast", min_idle=0.0, max_deliveries=5)
    (taken,) = fast.read(count=1)  # slow presumed dead: taken over
    assert taken.id == entry.id
    assert not slow.reject(entry.id, "late")  # no longer its item: nothing done
    assert not slow.dead(entry.id, "late")
    assert client.xlen(f"{stream}:dead-letters") == 0
    rows: Any = client.xpending_range(stream, "g", "-", "+", 10)
    assert [r["consumer"] for r in rows] == [b"fast"]  # still fast's, not stolen back
    assert fast.ack(taken.id) == 1


@pytest.mark.redis_server
def test_the_documented_consumer_survives_an_item_that_is_not_an_object(
    client: redis.Redis, redis_url: str, name: str, tmp_path: Path
) -> None:
    doc = (Path(__file__).parent.parent / "docs" / "items-and-stats.md").read_text()
    code = re.search(r'```python\n("""store_items\.py.*?)```', doc, re.S)
    assert code is not None
    stream = f"{name}:items:stream"
    script = code[1].replace("redis://localhost:6379/0", redis_url)
    script = script.replace('"books:items:stream"', repr(stream))
    assert repr(stream) in script  # the example as written
    assert redis_url in script
    client.xadd(stream, {"item": json.dumps({"url": "https://a.example/1", "title": "A"})})
    client.xadd(stream, {"item": "[1, 2]"})  # valid JSON, but no object: hostile or a bug
    client.xadd(stream, {"item": json.dumps({"url": {"$ne": 1}, "title": [1]})})
    client.xadd(stream, {"item": json.dumps({"url": "https://a.example/2", "title": "B"})})
    (tmp_path / "store_items.py").write_text(script)
    process = subprocess.Popen(
        [sys.executable, "store_items.py"], cwd=tmp_path, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 20
        while client.xlen(f"{stream}:dead-letters") < 2 or _rows(tmp_path) < 2:
            assert process.poll() is None, process.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        process.kill()
        process.communicate()
    (state,) = group_states(client, stream)
    assert (state.lag, state.pending) == (0, 0)


def _rows(directory: Path) -> int:
    if not (directory / "books.db").exists():
        return 0
    with contextlib.closing(sqlite3.connect(directory / "books.db")) as db:
        try:
            return int(db.execute("SELECT count(*) FROM books").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


@pytest.mark.redis_server
def test_a_binary_item_reaches_the_decoder_byte_for_byte(client: redis.Redis, name: str) -> None:
    stream = f"{name}:items:stream"
    packed = b"\x82\xa3url\xa1u\xa5price\xcb\x40\x09\x21\xf9\xf0\x1b\x86\x6e"  # msgpack
    client.xadd(stream, {"item": packed, "spider": name})
    consumer = ItemConsumer(client, stream, "g", "c", decode=lambda raw: raw)
    (entry,) = consumer.read(count=10)
    assert entry.item == packed  # a REDIS_ITEMS_SERIALIZER's bytes, for its decoder
    assert entry.fields["spider"] == name


@pytest.mark.redis_server
def test_tail_takes_any_count_and_refuses_a_timeout_that_never_ends(
    client: redis.Redis, redis_url: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client.xadd(f"{name}:items:stream", {"item": "{}"})
    args = ["items", "tail", name, "--redis-url", redis_url]
    assert main([*args, "-n", "99999999999999999999", "--timeout", "0.2"]) == 0
    assert main([*args, "--from", "-", "-n", "99999999999999999999", "--timeout", "0.2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main([*args, "--timeout", "nan"]) == 2  # a usage error, not a wait forever


@pytest.mark.parametrize("min_idle", [float("nan"), float("inf"), 1e30, -1.0])
def test_a_min_idle_redis_cannot_take_is_refused_at_once(min_idle: float) -> None:
    with pytest.raises(ConfigurationError, match="min_idle"):
        ItemConsumer(redis.Redis(), "s", "g", "c", min_idle=min_idle)


@pytest.mark.redis_server
def test_replay_and_tail_print_every_good_item_around_a_hostile_entry(
    client: redis.Redis, redis_url: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An item of 200,000 nested ``[`` between good ones: both commands died on it
    (RecursionError, exit 1, the good items after it never printed). They report it on
    stderr with the reason ItemConsumer gives, print the others, and exit 0; an item
    with a line separator stays on its line."""
    stream = f"{name}:items:stream"
    client.xadd(stream, {"item": json.dumps({"i": 1})})
    bad = cast("bytes", client.xadd(stream, {"item": "[" * 200_000})).decode()
    client.xadd(stream, {"item": json.dumps({"t": "a\u2028b\x85c"})})
    client.xadd(stream, {"item": json.dumps({"i": 2})})
    good = [{"i": 1}, {"t": "a\u2028b\x85c"}, {"i": 2}]
    backlog = ["items", "tail", name, "--from", "-", "--timeout", "0.2"]
    for command in (["items", "replay", name], backlog):
        assert main([*command, "--redis-url", redis_url]) == 0
        out, err = capsys.readouterr()
        assert [json.loads(line)["item"] for line in out.split("\n") if line] == good
        assert f"entry {bad} of {stream!r} not printed: malformed item: RecursionError" in err
    (entry,) = ItemConsumer(client, stream, "g", "c").read(count=10)[1:2]
    assert entry.item == good[1]
    (dead,) = cast("list[Any]", client.xrange(f"{stream}:dead-letters"))
    assert dead[1][b"dead_reason"].startswith(b"malformed item: RecursionError")

    # new entries as they come (the XREAD path): added once the command blocks in XREAD
    # (a fixed pause lost the race on a loaded machine: added before the command read
    # the stream's end, they were not new to it)
    def add_later() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in client.client_list()
        ):
            time.sleep(0.01)
        client.xadd(stream, {"item": "[" * 200_000})
        client.xadd(stream, {"item": json.dumps({"i": 3})})

    adder = threading.Thread(target=add_later)
    adder.start()
    try:
        assert (
            main(["items", "tail", name, "--redis-url", redis_url, "--timeout", "2", "-n", "2"])
            == 0
        )
    finally:
        adder.join()
    out, err = capsys.readouterr()
    assert [json.loads(line)["item"] for line in out.split("\n") if line] == [{"i": 3}]
    assert "RecursionError" in err


@pytest.mark.redis_server
def test_a_dead_stream_of_another_type_is_set_aside_and_the_good_items_still_come(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``SET <stream>:dead-letters junk``, then a malformed item: the move to the dead
    stream failed (WRONGTYPE, naming no key), the read raised with the good item after
    it delivered and never returned, and every read of a restarted consumer failed the
    same way on the malformed item."""
    stream = f"{name}:items:stream"
    client.xadd(stream, {"item": "[" * 2000})
    client.xadd(stream, {"item": json.dumps({"i": 1})})
    client.set(f"{stream}:dead-letters", "junk")
    consumer = ItemConsumer(client, stream, "g", "c")
    with caplog.at_level(logging.ERROR, logger="scrapy_dist.streams"):
        assert [e.item for e in consumer.read(count=10)] == [{"i": 1}]
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"{stream}:dead-letters held a string" in error
    assert client.get(f"{stream}:dead-letters:wrongtype") == b"junk"
    assert client.xlen(f"{stream}:dead-letters") == 1


@pytest.mark.redis_server
def test_a_read_that_failed_gives_back_what_it_delivered_on_the_next(
    client: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = f"{name}:items:stream"
    client.xadd(stream, {"item": "not json"})
    client.xadd(stream, {"item": json.dumps({"i": 1})})
    consumer = ItemConsumer(client, stream, "g", "c")

    def fails(*args: Any) -> str:
        raise redis.ResponseError("ERR the dead stream could not be written")

    monkeypatch.setattr(consumer, "_move", fails)
    with pytest.raises(redis.ResponseError):
        consumer.read(count=10)  # both delivered: pending with this consumer
    monkeypatch.undo()
    assert [e.item for e in consumer.read(count=10)] == [{"i": 1}]


@pytest.mark.redis_server
def test_a_stream_key_of_another_type_is_an_error_naming_it(client: redis.Redis, name: str) -> None:
    stream = f"{name}:items:stream"
    client.set(stream, "junk")
    with pytest.raises(ConfigurationError, match=f"{stream}' \\(items stream\\) holds a string"):
        ItemConsumer(client, stream, "g", "c").read(count=10)
    assert client.get(stream) == b"junk"  # the user's key: left as it is


@pytest.mark.redis_server
def test_groups_and_consumers_named_in_bytes_that_are_not_utf8(
    client: redis.Redis, redis_url: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group named by another program in bytes that are not UTF-8: ``items lag``,
    ``items groups`` and ``status`` raised (NOGROUP for the name read back decoded, a
    UnicodeDecodeError for the list)."""
    stream = f"{name}:items:stream"
    client.xadd(stream, {"item": json.dumps({"i": 1})})
    client.xgroup_create(stream, b"\xff\xfe", id="0")
    client.xreadgroup(b"\xff\xfe", b"\xc3", {stream: ">"}, count=1)  # type: ignore[arg-type]
    (group,) = group_states(client, stream)
    assert (group.name, group.pending, [c.name for c in group.consumers]) == (
        "\ufffd\ufffd",
        1,
        ["\ufffd"],
    )
    for command in (["items", "lag", name], ["items", "groups", name], ["status", name]):
        assert main([*command, "--redis-url", redis_url]) == 0, command
    assert "\ufffd\ufffd" in capsys.readouterr().out
