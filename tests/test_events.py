"""The frontier's events: listeners in subscription order, errors to the emitter, and a
sharded crawl's loss told once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from scrapy_dist.frontier.events import FrontierEvents, Read
from scrapy_dist.frontier.outbox import Command

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler


def test_listeners_hear_each_event_in_the_order_they_subscribed() -> None:
    events = FrontierEvents()
    heard: list[str] = []
    events.on_crawl_lost(lambda state: heard.append(f"a:{state}"))
    events.on_crawl_lost(lambda state: heard.append(f"b:{state}"))
    events.on_leases_taken(lambda ids: heard.append(f"taken:{sorted(ids)}"))
    events.on_master_changed(lambda: heard.append("changed"))
    events.on_flush_landed(lambda: heard.append("landed"))
    events.crawl_lost("vanished")
    events.leases_taken({"2", "1"})
    events.master_changed()
    events.flush_landed()
    assert heard == ["a:vanished", "b:vanished", "taken:['1', '2']", "changed", "landed"]


def test_a_listener_error_reaches_the_emitter() -> None:
    events = FrontierEvents()

    def boom(state: str) -> None:
        raise RuntimeError(state)

    events.on_crawl_lost(boom)
    with pytest.raises(RuntimeError, match="finished"):
        events.crawl_lost("finished")


def test_the_reads_carried_are_those_due() -> None:
    events = FrontierEvents()
    due = Read(Command(("GET", "k")), lambda reply: None)
    events.carry(lambda: None)
    events.carry(lambda: due)
    assert events.reads() == [due]
    assert FrontierEvents().reads() == []


@pytest.mark.redis_server
def test_a_sharded_crawl_lost_in_any_shard_is_told_once(
    make_crawler: Callable[..., Crawler],
) -> None:
    from scrapy_dist.frontier.choice import frontier_for
    from scrapy_dist.frontier.shards import ShardedFrontier

    frontier = frontier_for(make_crawler({"SCHEDULER_SHARDS": 3}))
    assert isinstance(frontier, ShardedFrontier)
    frontier.join_epoch()
    heard: list[str] = []
    frontier.events.on_crawl_lost(heard.append)
    frontier.others[1].events.crawl_lost("vanished")  # shard 2 finds it gone
    frontier.others[0].events.crawl_lost("vanished")  # then shard 1: nothing new
    assert frontier.lost == "vanished"
    assert all(shard.lost == "vanished" for shard in frontier.shards)
    assert heard == ["vanished"]
