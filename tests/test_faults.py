"""Faults operators meet: Redis refusing writes, a frontier that vanishes, a worker
paused past its lease, a reply lost across a restart, a large crawl's cleanup.

Crawls run ``scrapy crawl`` worker processes of ``tests/project`` against their own
redis-server (which the test drives with CONFIG SET, FLUSHDB, RENAME...) and a local
site. Each asserts that no page is lost, that workers neither exit early nor hang, that
duplicates stay within the bound of docs/guarantees.md (``CONCURRENT_REQUESTS + 2 *
SCHEDULER_PREFETCH_MAX`` per worker that failed), and that one log line names the fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.exceptions import redis_error_text
from scrapy_dist.frontier.outbox import refusal
from scrapy_dist.frontier.wire import DONE
from scrapy_dist.parents import ParentLinks
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.testing import leases
from scrapy_dist.testing.crawl import WorkerCrawl, duplicates
from scrapy_dist.testing.engine import one_shard
from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.refusals import refuse_noreplicas, refuse_oom, refuse_readonly
from scrapy_dist.testing.site import TestSite
from scrapy_dist.testing.workers import run_cli
from scrapy_dist.worker.startup import start_failure

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy.crawler import Crawler

    from scrapy_dist.testing.workers import Worker

PROJECT = Path(__file__).parent / "project"
CONCURRENCY = 4
PREFETCH = 1
#: docs/guarantees.md's bound on pages crawled twice per worker that died or was paused.
BOUND = CONCURRENCY + 2 * PREFETCH
FAST = {
    "CONCURRENT_REQUESTS": CONCURRENCY,
    "SCHEDULER_PREFETCH": PREFETCH,
    "SCHEDULER_LEASE_TIMEOUT": 5,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
    "SCHEDULER_WORKER_TIMEOUT": 2,
    "SCHEDULER_MAX_DELIVERIES": 3,
    "CLOSE_WHEN_CRAWL_DONE": True,
    "CRAWL_DONE_GRACE": 1,
    "SCHEDULER_PERSIST": False,
    # which request produced each request: a callback's requests are fenced by its lease
    "SPIDER_MIDDLEWARES": '{"scrapy_dist.parents.ParentLinks": 0}',
}


class Crawl(WorkerCrawl):
    """Workers of one crawl of ``site`` (``tests/project``, FAST settings); all stopped
    at teardown."""

    def __init__(self, server: RedisServer, site: TestSite, log_dir: Path) -> None:
        super().__init__(server, site, log_dir, project_dir=PROJECT, settings=FAST)


@contextlib.contextmanager
def make_crawl(server: RedisServer, tmp_path: Path, pages: int, delay: float) -> Iterator[Crawl]:
    with TestSite(pages=pages, delay=delay) as site:
        crawl = Crawl(server, site, tmp_path)
        try:
            yield crawl
        finally:
            crawl.close()


@pytest.fixture
def crawl(server: RedisServer, tmp_path: Path) -> Iterator[Crawl]:
    with make_crawl(server, tmp_path, pages=600, delay=0.01) as c:
        yield c


def held_by(crawl: Crawl, worker: Worker) -> int:
    """How many requests and seeds ``worker`` holds leased (worker ids embed the pid)."""
    return leases.held_by(crawl.client, "pages", worker.pid)


def assert_all_once(crawl: Crawl, allowed: int = 0) -> None:
    missing = crawl.missing()
    assert not missing, f"{len(missing)} pages lost, e.g. {sorted(missing)[:5]}\n{crawl.logs()}"
    assert duplicates(crawl.site.hits()) <= allowed, (duplicates(crawl.site.hits()), allowed)


# -- 1. refusals are outages --------------------------------------------------------


# What Redis 6.2.14 and 7.0.15 answered to a script whose redis.call() was refused (6.2
# wraps the error, 7.0 passes it through with its origin appended).
_SHA = "f_5f476d281e0d797ce25446422245d7b731bc2cf8"
SCRIPT_REFUSALS = [
    (
        f"Error running script (call to {_SHA}): @user_script:1176: @user_script: 1176: "
        "-OOM command not allowed when used memory > 'maxmemory'.",
        "OOM",
    ),
    (
        f"Error running script (call to {_SHA}): @user_script:88: @user_script: 88: "
        "-READONLY You can't write against a read only replica.",
        "READONLY",
    ),
    (
        f"Error running script (call to {_SHA}): @user_script:88: @user_script: 88: "
        "-NOREPLICAS Not enough good replicas to write.",
        "NOREPLICAS",
    ),
    (
        f"Error running script (call to {_SHA}): @user_script:919: WRONGTYPE Operation "
        "against a key holding the wrong kind of value",
        "WRONGTYPE",
    ),
    (
        "OOM command not allowed when used memory > 'maxmemory'. script: 5f476d281e0d797c"
        "e25446422245d7b731bc2cf8, on @user_script:1176.",
        "OOM",
    ),
    (
        "READONLY You can't write against a read only replica. script: ab, on @user_script:1.",
        "READONLY",
    ),
    ("ERR value is not an integer or out of range script: ab, on @user_script:1.", None),
]


@pytest.mark.parametrize(("message", "code"), SCRIPT_REFUSALS)
def test_a_refusal_inside_a_script_is_read_the_same_on_redis_6_2_and_7(
    message: str, code: str | None
) -> None:
    """Redis 6.2 wraps an error raised by a script's call ("Error running script ..."):
    a READONLY or NOREPLICAS refusal was read as a permanent error, not an outage to
    wait out (on Redis 6.2.14 the refusal crawls above fetched 3 and 1 pages twice, and
    the shared stats did not count the refusals)."""
    error = redis.exceptions.ResponseError(message)
    assert refusal(error) == code
    if code is not None:
        assert redis_error_text(error).startswith(code)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (
            redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
            "TRYAGAIN",
        ),
        (redis.exceptions.ClusterDownError("The cluster is down"), "CLUSTERDOWN"),
        (redis.exceptions.MasterDownError("Link with MASTER is down"), "MASTERDOWN"),
        (
            redis.exceptions.ResponseError(
                "Script attempted to access a non local key in a cluster node script: "
                "7f23a6a235dfd9fce4a968a326ae66220ae8e0ca, on @user_script:29."
            ),
            "TRYAGAIN",
        ),
    ],
)
def test_a_cluster_in_transition_is_a_refusal_to_wait_out(
    error: redis.exceptions.ResponseError, code: str
) -> None:
    """A cluster connection's parser turns TRYAGAIN, CLUSTERDOWN and MASTERDOWN into
    classes and strips the code from the text: a reshard's TRYAGAIN was read as a
    permanent refusal and the flush's requests were sent to the dead-letter list
    (tests/test_cluster.py::test_a_crawl_survives_a_reshard_of_its_slot)."""
    assert refusal(error) == code


def _busy_script(client: redis.Redis) -> Callable[[], object]:
    # another client's script runs too long: every other call gets BUSY
    try:
        client.config_set("busy-reply-threshold", 100)
    except redis.ResponseError:  # Redis 6.2's name of it
        client.config_set("lua-time-limit", 100)
    hog = redis.Redis(connection_pool=client.connection_pool)

    def run() -> None:
        with contextlib.suppress(redis.RedisError):
            hog.eval("while true do end", 0)

    thread = threading.Thread(target=run)
    thread.start()

    def restore() -> None:
        client.script_kill()
        thread.join()

    return restore


def _queue_of_wrong_type(client: redis.Redis) -> Callable[[], object]:
    # an operator's mistake: the queue key briefly holds a string
    pipe = client.pipeline(transaction=True)
    pipe.rename("pages:requests", "pages:requests:saved")
    pipe.set("pages:requests", "oops")
    pipe.execute()

    def restore() -> None:
        pipe = client.pipeline(transaction=True)
        pipe.delete("pages:requests")
        pipe.rename("pages:requests:saved", "pages:requests")
        pipe.execute()

    return restore


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("fault", "logged"),
    [
        (refuse_oom, "refuses writes (OOM"),
        (refuse_noreplicas, "refuses writes (NOREPLICAS"),
        (refuse_readonly, "refuses writes (READONLY"),
        (_busy_script, "refuses writes (BUSY"),
        (_queue_of_wrong_type, "refuses writes (WRONGTYPE"),
    ],
    ids=["oom", "noreplicas", "readonly", "busy", "wrongtype"],
)
def test_a_refusing_redis_is_an_outage_not_a_verdict(
    crawl: Crawl, fault: Callable[[redis.Redis], Callable[[], object]], logged: str
) -> None:
    crawl.start(2, SCHEDULER_LEASE_TIMEOUT=30)  # renewals are refused too
    crawl.seed()
    crawl.hit_when(150)
    restore = fault(crawl.client)
    try:
        time.sleep(5)
        assert all(w.returncode is None for w in crawl.workers), crawl.logs()
    finally:
        restore()
    # the timers survived the errors: both workers send heartbeats again (after their
    # backoff pause, at most 4 s after an outage of 5 s); each worker's beat is seen on
    # its own, since one may finish the crawl and leave the registry before the other
    # beat again on a loaded machine
    seconds, micros = crawl.client.time()
    restored = seconds + micros / 1e6
    deadline = time.monotonic() + 10
    fresh: set[bytes | str] = set()
    while True:
        beats = {k: float(v) for k, v in crawl.client.hgetall("pages:workers").items()}
        fresh |= {worker for worker, beat in beats.items() if beat > restored}
        if len(fresh) == 2:
            break
        assert time.monotonic() < deadline, f"stale heartbeats {beats} after {restored}\n" + (
            crawl.logs()
        )
        time.sleep(0.2)
    assert crawl.wait() == [0, 0], crawl.logs()
    # the outage outlives no lease: nothing is crawled twice
    assert_all_once(crawl)
    logs = crawl.full_logs()
    assert logged in logs, crawl.logs()
    assert "accepts writes again" in logs
    assert "crawl_finished" in logs


# -- 2. a frontier that can vanish is watched ---------------------------------------


@pytest.mark.e2e
@pytest.mark.redis_server
def test_an_evicting_redis_is_refused_at_start(tmp_path: Path) -> None:
    with (
        RedisServer(
            directory=tmp_path / "redis", extra_args=["--maxmemory-policy", "allkeys-lru"]
        ) as server,
        TestSite(pages=20) as site,
    ):
        crawl = Crawl(server, site, tmp_path)
        try:
            crawl.start(1)
            crawl.seed()
            [code] = crawl.wait(60)
            assert code != 0
            assert "maxmemory-policy allkeys-lru" in crawl.full_logs()
            assert not site.hits()
            # an operator who knows better says so
            crawl.start(1, REDIS_EVICTION_POLICY_CHECK="warn")
            crawl.seed()
            assert crawl.wait(60)[1] == 0, crawl.logs()
            assert not crawl.missing()
        finally:
            crawl.close()


@pytest.mark.e2e
def test_a_flushed_frontier_stops_the_workers_rather_than_finish(crawl: Crawl) -> None:
    crawl.start(2)
    crawl.seed()
    crawl.hit_when(150)
    crawl.client.flushdb()
    codes = crawl.wait()
    assert codes == [3, 3], crawl.logs()
    logs = crawl.full_logs()
    assert "The frontier of crawl pages vanished" in logs
    assert "frontier_lost" in logs
    assert "crawl_finished" not in logs
    # what the flush lost is recovered by crawling again: nothing is lost for good
    crawl.site.reset_hits()
    crawl.start(2)
    crawl.seed()
    assert crawl.wait()[2:] == [0, 0], crawl.logs()
    assert_all_once(crawl)


# -- 3 and 6. fenced writes; the duplicate bound --------------------------------------


@pytest.mark.e2e
def test_a_worker_paused_past_the_end_of_the_crawl_writes_nothing_into_it(
    server: RedisServer, tmp_path: Path
) -> None:
    with make_crawl(server, tmp_path, pages=500, delay=0.005) as crawl:
        paused, other = crawl.start(2)
        crawl.seed()
        crawl.hit_when(60)
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            # the other worker takes the paused one's leases back and finishes alone
            assert other.process.wait(60) == 0, crawl.logs()
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        assert paused.process.wait(30) == 0, crawl.logs()
        assert_all_once(crawl, allowed=BOUND)
        # nothing was written into the finished crawl, which stays deleted
        assert crawl.client.exists("pages:requests", "pages:dupefilter", "pages:epoch") == 0
        logs = crawl.full_logs()
        assert (
            "finished without this worker" in logs
            or "by another worker" in logs
            or ("is finished" in paused.log_file.read_text())
        )


@pytest.mark.e2e
def test_a_worker_paused_past_its_lease_duplicates_within_the_bound(
    server: RedisServer, tmp_path: Path
) -> None:
    # a slow item pipeline keeps responses waiting in Scrapy's scraper: they are held
    # too, and count in the bound
    slow: dict[str, Any] = {"ITEM_PIPELINES": '{"testproject.pipelines.SlowPipeline": 100}'}
    with make_crawl(server, tmp_path, pages=800, delay=0.02) as crawl:
        paused, _ = crawl.start(2, **slow)
        crawl.seed()
        crawl.hit_when(150)
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            # past the 5 s lease, until the other worker took back every lease the paused
            # one held (a fixed 8 s may end before a loaded machine's other worker does
            # so, and then the paused one finds nothing taken back)
            stopped = time.monotonic()
            time.sleep(5)
            while held_by(crawl, paused):
                assert time.monotonic() - stopped < 60, crawl.logs()
                time.sleep(0.1)
            assert crawl.missing(), "the crawl ended while the worker was paused"
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        assert crawl.wait() == [0, 0], crawl.logs()
        assert_all_once(crawl, allowed=BOUND)
        log = paused.log_file.read_text()
        assert "were taken back" in log, crawl.logs()
        # what the pages it held produce is not queued: their new holders queue it
        assert (
            "the requests they produce are dropped" in log or "whose leases this worker" in log
        ), crawl.logs()


@pytest.mark.e2e
def test_a_malformed_lease_record_of_a_paused_worker_is_dead_lettered_not_a_stall(
    server: RedisServer, tmp_path: Path
) -> None:
    """An operator edits one lease record of a worker that is then paused past its
    lease: the other worker's reserves reclaim that holding, so one record they cannot
    read must not stop them. It is dead-lettered (at most its page is not crawled),
    and the crawl ends with both workers exiting 0."""
    with make_crawl(server, tmp_path, pages=500, delay=0.02) as crawl:
        paused, _ = crawl.start(2)
        crawl.seed()
        crawl.hit_when(100)
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            while not held_by(crawl, paused):
                assert time.monotonic() - stopped < 30, crawl.logs()
                time.sleep(0.05)
            [(worker, held)] = [
                (w, h)
                for w, h in leases.holdings(crawl.client, "pages").items()
                if str(paused.pid) in w
            ]
            crawl.client.hset(f"pages:holders:{worker}", next(iter(held)), b"edited by hand")
            time.sleep(5)
            while held_by(crawl, paused):
                assert time.monotonic() - stopped < 60, crawl.logs()
                time.sleep(0.1)
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        assert crawl.wait() == [0, 0], crawl.logs()
        [record] = [json.loads(r) for r in crawl.client.lrange("pages:dead", 0, -1)]
        assert "malformed lease record" in record["reason"], record
        assert record["data"] == "edited by hand"
        assert len(crawl.missing()) <= 1, crawl.logs()
        assert duplicates(crawl.site.hits()) <= BOUND


@pytest.mark.e2e
def test_a_sequence_counter_written_by_hand_mid_crawl_loses_no_page(
    server: RedisServer, tmp_path: Path
) -> None:
    """An operator writes the crawl's sequence counter by hand while two workers crawl:
    every enqueue failed on it, so each batch of new links was dead-lettered as refused
    and the crawl ended with most of the site missing. The counter is set aside and
    restarted; the crawl ends complete, with nothing dead-lettered."""
    with make_crawl(server, tmp_path, pages=500, delay=0.02) as crawl:
        crawl.start(2)
        crawl.seed()
        crawl.hit_when(50)
        crawl.client.set("pages:seq", b"edited by hand")
        assert crawl.wait() == [0, 0], crawl.logs()
        assert not crawl.missing(), crawl.logs()
        assert crawl.client.get("pages:seq:wrongtype") == b"edited by hand"
        assert crawl.client.llen("pages:dead") == 0
        assert duplicates(crawl.site.hits()) == 0
        # the operator learns of it from `status`, and `reset` takes it with the crawl
        status = _cli("status", "pages", "--json", "--redis-url", server.url)
        assert json.loads(status)["set_aside"]["keys"] == ["pages:seq:wrongtype"]
        _cli("reset", "pages", "--yes", "--redis-url", server.url)
        assert list(crawl.client.scan_iter(match="pages*")) == []


@pytest.mark.e2e
def test_a_sequence_counter_deleted_mid_crawl_gives_no_id_again(
    server: RedisServer, tmp_path: Path
) -> None:
    """An operator deletes the crawl's sequence counter while two workers crawl (or
    Redis evicts it): it restarted at 1, numbering new links with the ids of entries
    still queued or leased. It restarts above every id given; the crawl ends complete,
    nothing fetched twice."""
    with make_crawl(server, tmp_path, pages=500, delay=0.02) as crawl:
        crawl.start(2)
        crawl.seed()
        crawl.hit_when(100)
        before = int(crawl.client.get("pages:seq") or b"0")
        crawl.client.delete("pages:seq")
        time.sleep(1)
        assert int(crawl.client.get("pages:seq") or b"0") > before, crawl.logs()
        assert crawl.wait() == [0, 0], crawl.logs()
        assert not crawl.missing(), crawl.logs()
        assert crawl.client.llen("pages:dead") == 0
        assert duplicates(crawl.site.hits()) == 0


@pytest.mark.e2e
def test_a_worker_registry_written_by_hand_mid_crawl_is_set_aside_by_the_heartbeats(
    server: RedisServer, tmp_path: Path
) -> None:
    """An operator overwrites the worker registry while two workers crawl: their
    heartbeats failed on it (an error every heartbeat) until another worker joined, and
    `status` refused the crawl (exit 2: the workers key holds a string). The next
    heartbeat sets it aside; `status` lists both workers live and the key set aside,
    and the crawl ends complete. (Pages answer in 0.2 s: at 0.03 s a quiet machine's
    workers had finished the crawl before `status` looked.)"""
    with make_crawl(server, tmp_path, pages=600, delay=0.2) as crawl:
        crawl.start(2)
        crawl.seed()
        crawl.hit_when(30)
        crawl.client.delete("pages:workers")
        crawl.client.set("pages:workers", b"edited by hand")
        time.sleep(1.5)  # three heartbeat intervals
        status = json.loads(_cli("status", "pages", "--json", "--redis-url", server.url))
        assert status["state"] == "busy"
        assert status["workers"]["live"] == 2, crawl.logs()
        assert status["set_aside"]["keys"] == ["pages:workers:wrongtype"]
        assert crawl.wait() == [0, 0], crawl.logs()
        assert not crawl.missing(), crawl.logs()
        assert duplicates(crawl.site.hits()) == 0


def _cli(*args: str) -> str:
    """``scrapy-dist ARGS`` in the test project, as an operator runs it: its stdout."""
    done = run_cli(*args, cwd=PROJECT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("finished_at", [b"2026-11-23 18:00", b"nan"])
def test_a_completion_time_written_by_hand_does_not_end_the_next_run(
    server: RedisServer, tmp_path: Path, finished_at: bytes
) -> None:
    """A finished crawl whose completion time an operator rewrote by hand (a date, not
    server seconds): the next workers, started before their seeds are pushed, read the
    crawl as still finished, so they closed at once and crawled nothing. A completion
    time that is not a number starts the next run, as one that is does."""
    with make_crawl(server, tmp_path, pages=30, delay=0.01) as crawl:
        progress = {"done": 40, "finished_at": finished_at}
        crawl.client.hset("pages:progress", mapping=progress)  # type: ignore[arg-type]
        crawl.start(2)
        crawl.wait_ready()
        time.sleep(2)  # past CRAWL_DONE_GRACE: the workers wait for seeds
        assert all(w.returncode is None for w in crawl.workers), crawl.logs()
        crawl.seed()
        assert crawl.wait() == [0, 0], crawl.logs()
        assert not crawl.missing(), crawl.logs()
        assert crawl.client.hget("pages:progress", "finished_at:wrongtype") == finished_at


@pytest.mark.e2e
def test_an_outage_longer_than_the_lease_duplicates_within_the_bound(
    server: RedisServer, tmp_path: Path
) -> None:
    # a frozen server accepts connections and never answers: every worker stalls, and
    # when it answers again every lease has expired (a stall of each worker)
    with make_crawl(server, tmp_path, pages=600, delay=0.02) as crawl:
        crawl.start(2, REDIS_PARAMS='{"socket_timeout": 1}')
        crawl.seed()
        crawl.hit_when(120)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            time.sleep(8)  # past the 5 s lease
            assert all(w.returncode is None for w in crawl.workers), crawl.logs()
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert crawl.wait() == [0, 0], crawl.logs()
        assert not crawl.missing(), crawl.logs()
        # docs/guarantees.md's bound for an outage: twice the bound of each worker (a page its
        # worker held may be re-leased to it or another, and settled early by its stale
        # copy); the pages whose leases were taken over are logged
        assert duplicates(crawl.site.hits()) <= 2 * 2 * BOUND, crawl.logs()
        # (whether a worker finds leases taken over depends on who calls Redis first)
        assert "reachable again" in crawl.full_logs(), crawl.logs()


# -- 4 and 5. hand-back, the per-worker lease index, UNLINK ---------------------------


@pytest.mark.e2e
def test_a_clean_redis_restart_crawls_nothing_twice(crawl: Crawl, server: RedisServer) -> None:
    # leases outlive the restart (AOF, 60 s): acks waiting in the outbox stay this
    # worker's, and only leases granted by a call whose reply was lost are handed back;
    # down for 3 flush intervals, so both workers meet the outage (a quick restart can
    # fall between two calls and be reconnected over unseen)
    crawl.start(2, SCHEDULER_LEASE_TIMEOUT=60, SCHEDULER_FLUSH_INTERVAL=0.5)
    crawl.seed()
    for fetched in (150, 400):
        crawl.hit_when(fetched)
        server.restart(down=1.5)
    assert crawl.wait() == [0, 0], crawl.logs()
    assert_all_once(crawl)
    assert "unreachable" in crawl.full_logs()


UNIT = {
    "SCHEDULER_LEASE_TIMEOUT": 60,
    "SCHEDULER_HEARTBEAT_INTERVAL": 5,
    "SCHEDULER_WORKER_TIMEOUT": 30,
    "SCHEDULER_FLUSH_INTERVAL": 0.1,
    "SCHEDULER_PREFETCH": 1,
}


def _scheduler(make_crawler: Callable[..., Crawler], **settings: Any) -> Scheduler:
    crawler = make_crawler({**UNIT, **settings})
    scheduler: Scheduler = build_from_crawler(Scheduler, crawler)
    held: set[Request] = set()
    scheduler.deliveries.in_flight = lambda: held
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    if scheduler.heartbeat.ticker is not None:
        scheduler.heartbeat.ticker.stop()
    return scheduler


def test_a_lost_reply_hands_back_only_leases_the_worker_does_not_hold(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    scheduler = _scheduler(make_crawler)
    frontier = one_shard(scheduler.frontier)
    frontier.eager = False
    for i in range(3):
        scheduler.enqueue_request(Request(f"https://example.com/{i}"))
    frontier.flush()
    done, second = frontier.reserve(2)  # the second one: its reply is lost below
    frontier.settle([(done.id, DONE)])  # crawled: its ack waits in the outbox
    frontier.leases.reply_lost = True  # the reply bringing the second one was lost:
    frontier.leases.forget([second.id])  # the worker never knew it
    frontier.flush()
    # the waiting ack was sent, not handed back: that page is not crawled twice
    assert frontier.totals() == {"done": 1}
    assert leases.leased_count(client, frontier.keys.crawl) == 0
    assert len(scheduler.queue) == 2  # the third request, and the second one handed back
    assert frontier.stats.get_value("scheduler/leases/released_unknown") == 1


def test_a_lease_taken_over_and_granted_back_to_its_worker_is_settled(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    paused = _scheduler(make_crawler)
    frontier = paused.frontier
    paused.enqueue_request(Request("https://example.com/parent"))
    frontier.flush()
    parent = paused.next_request()
    assert parent is not None
    assert paused.crawler is not None
    links = ParentLinks.from_crawler(paused.crawler)
    for child in links.process_spider_output(
        Response(parent.url, request=parent), [Request("https://example.com/child")]
    ):
        paused.enqueue_request(child)
    paused.deliveries.settle()  # the parent is done: its ack waits behind its child
    # the worker is paused past its lease: another worker's reserve takes it back
    client.zadd(frontier.keys.holders, {frontier.worker_id: 0})
    other = _scheduler(make_crawler)
    one_shard(other.frontier).leases.reserve_call(0, other.frontier.epoch).run()  # only reclaims
    assert leases.holdings(client, frontier.keys.crawl) == {}
    frontier.flush()  # the child is refused: the parent's lease was taken over
    assert frontier.stats.get_value("scheduler/leases/taken_over") == 1
    again = paused.next_request()  # the parent, granted back to the same worker
    assert again is not None
    assert again.url == parent.url
    paused.deliveries.settle()
    frontier.flush()
    assert leases.leased_count(client, frontier.keys.crawl) == 0  # settled, not kept for good
    assert frontier.totals() == {"done": 1}


def test_release_reads_only_this_workers_leases(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    busy = _scheduler(make_crawler, SCHEDULER_PREFETCH=5000, CONCURRENT_REQUESTS=10000)
    queue = busy.queue
    queue.push([(b'{"url": "https://example.com/%d"}' % i, 0.0, b"") for i in range(20000)])
    for _ in range(4):
        assert len(busy.frontier.reserve(5000)) == 5000
    idle = _scheduler(make_crawler)
    one_shard(idle.frontier).leases.reply_lost = True
    client.config_set("slowlog-log-slower-than", 10000)  # 10 ms
    client.slowlog_reset()
    try:
        idle.frontier.flush(reserve=1)
        slow = [e for e in client.slowlog_get(10) if b"EVALSHA" in e["command"]]
    finally:
        client.config_set("slowlog-log-slower-than", 10000)
    assert not slow, slow
    holding = busy.frontier.keys.holding(busy.frontier.worker_id)
    assert client.hlen(holding) == 20000  # none of the busy one's
    assert leases.leased_count(client, busy.frontier.keys.crawl) == 20000


def test_a_finished_crawl_unlinks_its_keys(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    scheduler = _scheduler(make_crawler)
    scheduler.enqueue_request(Request("https://example.com/"))
    scheduler.frontier.flush()
    request = scheduler.next_request()
    assert request is not None
    scheduler.deliveries.settle()
    scheduler.frontier.flush()
    before = client.info("commandstats")
    progress = scheduler.frontier.progress(grace=0, clear=True)
    assert progress is not None
    assert progress.state == "finished"
    after = client.info("commandstats")
    assert after.get("cmdstat_unlink", {}).get("calls", 0) > before.get("cmdstat_unlink", {}).get(
        "calls", 0
    )
    assert after.get("cmdstat_del", {}).get("calls", 0) == before.get("cmdstat_del", {}).get(
        "calls", 0
    )
    assert isinstance(scheduler.df, RFPDupeFilter)
    assert client.exists(*scheduler.df.backend.keys()) == 0


def test_the_timer_survives_any_redis_error(make_crawler: Callable[..., Crawler]) -> None:
    scheduler = _scheduler(make_crawler)

    def broken(*_: Any, **__: Any) -> None:
        raise redis.ResponseError("ERR something unexpected")

    scheduler.frontier.flush = broken  # type: ignore[method-assign]
    scheduler.heartbeat.tick()  # logged and counted, not raised (a LoopingCall would stop)
    assert scheduler.stats.get_value("scheduler/timer/errors") == 1


def test_a_volatile_policy_is_refused_only_when_frontier_keys_expire(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    client.config_set("maxmemory-policy", "volatile-lru")
    try:
        # no frontier key has an expiry: nothing to evict
        assert start_failure(_scheduler(make_crawler).crawler) is None
        failure = start_failure(_scheduler(make_crawler, DUPEFILTER_TTL=3600).crawler)
        assert failure is not None
        assert failure.reason == "configuration_error"
        assert "maxmemory-policy volatile-lru" in failure.message
        warned = _scheduler(make_crawler, DUPEFILTER_TTL=3600, REDIS_EVICTION_POLICY_CHECK="warn")
        assert start_failure(warned.crawler) is None
    finally:
        client.config_set("maxmemory-policy", "noeviction")


def test_a_full_bloom_filter_dead_letters_the_children_and_fails_the_parent(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    scheduler = _scheduler(
        make_crawler, DUPEFILTER_BACKEND="bitmap", BLOOM_CAPACITY=100, BLOOM_ON_FULL="refuse"
    )
    frontier = scheduler.frontier
    scheduler.enqueue_request(Request("https://example.com/parent"))
    frontier.flush()
    parent = scheduler.next_request()
    assert parent is not None
    assert scheduler.crawler is not None
    links = ParentLinks.from_crawler(scheduler.crawler)  # as Scrapy's scraper runs it
    assert scheduler.links is links.links
    response = Response(parent.url, request=parent)
    children = [Request(f"https://example.com/child/{i}") for i in range(150)]
    for child in links.process_spider_output(response, children):  # more than it takes
        scheduler.enqueue_request(child)
    scheduler.deliveries.settle()  # the parent is done: its ack waits behind its children
    frontier.flush()  # refused for good: the children are dead-lettered
    frontier.flush()  # and the parent settled as failed (returned for another try)
    records = client.lrange(frontier.keys.dead, 0, -1)
    assert len(records) == 150
    assert b"DUPEFILTER_FULL" in records[0] or b"refuse" in records[0]
    assert frontier.totals() == {"retried": 1}
    assert frontier.stats.get_value("scheduler/redis/refused_requests") == 150
