"""RedisPipeline and ``scrapy-dist export``: every item stored and exported exactly once."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pytest
import scrapy
from scrapy.utils.serialize import ScrapyJSONEncoder

from scrapy_dist.cli import main
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.pipelines import ItemWriter, RedisPipeline
from scrapy_dist.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import redis
    from scrapy.crawler import Crawler


class Book(scrapy.Item):
    title = scrapy.Field()
    seen = scrapy.Field()


def upper_serializer(item: Any) -> str:
    return str(dict(item)["title"]).upper()


def pipeline(crawler: Crawler) -> RedisPipeline:
    p = RedisPipeline.from_crawler(crawler)
    p.open_spider()
    return p


def test_every_item_is_stored_once_in_order(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    p = pipeline(make_crawler({"REDIS_ITEMS_BATCH_SIZE": 7}))
    seen = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    items: list[Any] = [{"n": i, "title": "é"} for i in range(1000)]
    items.append(Book(title="Dune", seen=seen))
    for item in items:
        assert p.process_item(item) is item
    p.close_spider()
    stored = [json.loads(raw) for raw in client.lrange(f"{name}:items", 0, -1)]
    assert stored[:1000] == [{"n": i, "title": "é"} for i in range(1000)]
    # as Scrapy's JSON encoder writes a datetime (its format changed after Scrapy 2.13)
    assert stored[1000] == {"title": "Dune", "seen": json.loads(ScrapyJSONEncoder().encode(seen))}
    assert len(stored) == 1001
    assert p.writer.sent == 1001


def test_maxlen_key_template_and_serializer(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    p = pipeline(
        make_crawler(
            {
                "REDIS_ITEMS_MAXLEN": 5,
                "REDIS_ITEMS_KEY": "%(spider)s:books",
                "REDIS_ITEMS_SERIALIZER": f"{__name__}.upper_serializer",
                "REDIS_ITEMS_BATCH_SIZE": 3,
            }
        )
    )
    for i in range(20):
        p.process_item({"title": f"t{i}"})
    p.close_spider()
    assert client.lrange(f"{name}:books", 0, -1) == [f"T{i}".encode() for i in range(15, 20)]


def test_items_wait_for_redis_and_are_never_lost(tmp_path: Path) -> None:
    with RedisServer(directory=tmp_path / "redis", appendonly=True) as server:
        client = server.client(socket_timeout=1)
        writer = ItemWriter(client, "x:items", batch_size=10, flush_interval=0.05)
        writer.start()
        for i in range(25):
            writer.put(b"%d" % i)
        deadline = time.monotonic() + 10
        while client.llen("x:items") < 25:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.kill()
        started = time.monotonic()
        for i in range(25, 60):
            writer.put(b"%d" % i)  # never blocks, whatever Redis does
        assert time.monotonic() - started < 0.1
        time.sleep(0.3)
        assert writer.unsent == 35
        server.restart()
        assert writer.close() == 0
        client = server.client()
        assert client.lrange("x:items", 0, -1) == [b"%d" % i for i in range(60)]


def test_wrong_key_type_is_refused_at_open(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    client.set(f"{name}:items", "x")
    p = RedisPipeline.from_crawler(make_crawler())
    with pytest.raises(ConfigurationError, match="holds a string"):
        p.open_spider()


def test_export_copies_and_moves_items_exactly_once(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    key = f"{name}:items"
    client.rpush(key, *[json.dumps({"n": i}) for i in range(2500)])
    copy = tmp_path / "copy.jl"
    assert main(["export", name, "-o", str(copy), "--redis-url", redis_url]) == 0
    assert [json.loads(line)["n"] for line in copy.read_text().splitlines()] == list(range(2500))
    assert client.llen(key) == 2500

    # workers keep appending while the export moves items out: none lost, none twice
    stop = threading.Event()

    def produce() -> None:
        n = 2500
        while not stop.is_set():
            client.rpush(key, json.dumps({"n": n}))
            n += 1

    producer = threading.Thread(target=produce)
    producer.start()
    moved = tmp_path / "moved.jl"
    try:
        assert main(["export", name, "-o", str(moved), "--delete", "--redis-url", redis_url]) == 0
        assert main(["export", name, "-o", str(moved), "--delete", "--redis-url", redis_url]) == 2
        assert (
            main(
                ["export", name, "-o", str(moved), "--delete", "--append", "--redis-url", redis_url]
            )
            == 0
        )
    finally:
        stop.set()
        producer.join()
    exported = [json.loads(line)["n"] for line in moved.read_text().splitlines()]
    left = [json.loads(raw)["n"] for raw in client.lrange(key, 0, -1)]
    assert exported + left == list(range(len(exported) + len(left)))
    assert len(exported) >= 2500
