"""Idle workers start on shared work within about a second (issue 7), end to end."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_dist.testing.queues import queued_count
from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.site import TestSite
from scrapy_dist.testing.workers import start_workers, stop_workers, wait_ready

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy_dist.testing.workers import Worker

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).parent / "project"
#: Log lines start with the epoch time in milliseconds, comparable with time.time().
SETTINGS = {
    "LOG_LEVEL": "DEBUG",
    "LOG_FORMAT": "%(created).3f [%(name)s] %(levelname)s: %(message)s",
    "CONCURRENT_REQUESTS": 4,
    "SCHEDULER_PERSIST": True,
}
LATENCY = 1.5


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


@pytest.fixture
def site() -> Iterator[TestSite]:
    with TestSite(pages=300, delay=0.05) as s:
        yield s


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    stop_workers(started)


def first_fetch(worker: Worker, timeout: float = 15) -> float:
    """Epoch time of the worker's first downloaded page."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = worker.log_file.read_text() if worker.log_file.exists() else ""
        match = re.search(r"^(\d+\.\d+) .*Crawled \(200\)", text, re.M)
        if match:
            return float(match.group(1))
        time.sleep(0.05)
    raise AssertionError(f"worker {worker.index} fetched nothing:\n{worker.log_tail(40)}")


def opened(worker: Worker) -> float:
    match = re.search(r"^(\d+\.\d+) .*Spider opened", worker.log_file.read_text(), re.M)
    assert match, worker.log_tail(40)
    return float(match.group(1))


def test_seeds_pushed_to_idle_workers_start_within_a_second(
    server: RedisServer, site: TestSite, workers: list[Worker], tmp_path: Path
) -> None:
    workers += start_workers(
        2,
        project_dir=PROJECT,
        spider="pages",
        log_dir=tmp_path,
        stats_setting=None,
        settings={"REDIS_URL": server.url, **SETTINGS},
    )
    wait_ready(workers)
    time.sleep(3)  # both idle for a while, backed off
    client = redis.Redis.from_url(server.url)
    pushed = time.time()
    client.rpush("pages:start_urls", *[site.page_url(i) for i in range(40)])
    for worker in workers:
        latency = first_fetch(worker) - pushed
        print(f"worker {worker.index}: first fetch {latency:.2f}s after the push")
        assert latency < LATENCY, worker.log_tail(40)


def test_a_worker_joining_a_running_crawl_starts_at_once(
    server: RedisServer, site: TestSite, workers: list[Worker], tmp_path: Path
) -> None:
    settings = {"REDIS_URL": server.url, **SETTINGS}
    workers += start_workers(
        1,
        project_dir=PROJECT,
        spider="pages",
        log_dir=tmp_path,
        stats_setting=None,
        settings=settings,
    )
    wait_ready(workers)
    client = redis.Redis.from_url(server.url)
    client.lpush("pages:start_urls", site.page_url(0))
    deadline = time.monotonic() + 15
    while queued_count(client, "pages:requests") < 20:  # the shared queue fills up
        assert time.monotonic() < deadline, workers[0].log_tail(40)
        time.sleep(0.05)
    [late] = start_workers(
        1,
        project_dir=PROJECT,
        spider="pages",
        log_dir=tmp_path,
        stats_setting=None,
        settings=settings,
        first_index=1,
    )
    workers.append(late)
    latency = first_fetch(late) - opened(late)
    print(f"joining worker: first fetch {latency:.2f}s after it opened")
    assert latency < LATENCY, late.log_tail(40)
