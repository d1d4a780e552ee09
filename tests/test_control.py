"""Crawl control (pause, resume, drain): from the user's side first, then the parts.

The crawl test makes a throwaway Scrapy project, runs two ``scrapy crawl`` workers of it
against a local site that logs the time of every request and a real redis-server, and
steers it with ``python -m scrapy_dist pause|resume|drain`` as an operator would.
"""

from __future__ import annotations

import json
import logging
import textwrap
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

import fakeredis
import pytest
import redis
from scrapy.exceptions import DontCloseSpider
from scrapy.settings import Settings

from scrapy_dist.cli import main
from scrapy_dist.control import (
    DRAINING,
    PAUSED,
    RUNNING,
    ControlState,
    CrawlControl,
    Settled,
    parse_state,
    read_state,
    set_state,
)
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import RedisKeys, shard_keys
from scrapy_dist.metrics import control_gauges
from scrapy_dist.queue import Base
from scrapy_dist.settings import Config
from scrapy_dist.testing.crawl import WorkerCrawl, duplicates
from scrapy_dist.testing.leases import holdings, leased_count
from scrapy_dist.testing.queues import queued_count
from scrapy_dist.testing.site import TestSite
from scrapy_dist.testing.workers import run_cli
from scrapy_dist.worker.control import POLL_INTERVAL, ControlWatcher

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy.crawler import Crawler

    from scrapy_dist.testing.redis_server import RedisServer

SETTINGS = """
BOT_NAME = "ctl"
SPIDER_MODULES = ["ctl.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
COOKIES_ENABLED = False
SCHEDULER = "scrapy_dist.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"
"""

SPIDER = """
from scrapy_dist.spiders import RedisSpider


class PagesSpider(RedisSpider):
    name = "pages"

    def parse(self, response):
        yield {"url": response.url}
        yield from response.follow_all(css="a", callback=self.parse)
"""

#: Every worker: 4 requests at once, 4 buffered (so a pause has a buffer to hand back),
#: fast leases and heartbeats, exit once the crawl is done.
WORKER_SETTINGS = {
    "CONCURRENT_REQUESTS": 4,
    "SCHEDULER_PREFETCH": 4,
    "SCHEDULER_LEASE_TIMEOUT": 5,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
    "SCHEDULER_WORKER_TIMEOUT": 2,
    "CLOSE_WHEN_CRAWL_DONE": True,
    "CRAWL_DONE_GRACE": 1,
    "SCHEDULER_PERSIST": False,
}


class LoggedSite(TestSite):
    """A test site that also logs ``(time.time(), path)`` of every page request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access: list[tuple[float, str]] = []

    def _count(self, target: str) -> None:
        super()._count(target)
        self.access.append((time.time(), self._path(target)))

    def after(self, moment: float) -> list[tuple[float, str]]:
        """Requests logged after ``moment``."""
        return [(t, path) for t, path in list(self.access) if t > moment]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A throwaway Scrapy project with the README's settings block and one spider."""
    root = tmp_path / "project"
    (root / "ctl" / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = ctl.settings\n")
    (root / "ctl" / "__init__.py").write_text("")
    (root / "ctl" / "spiders" / "__init__.py").write_text("")
    (root / "ctl" / "settings.py").write_text(SETTINGS)
    (root / "ctl" / "spiders" / "pages.py").write_text(textwrap.dedent(SPIDER))
    return root


def cli(project: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m scrapy_dist ARGS --redis-url URL`` in the project, as an operator runs it."""
    return run_cli(*args, "--redis-url", redis_url, cwd=project, timeout=90)


@pytest.mark.e2e
def test_pause_resume_drain_a_running_crawl(
    server: RedisServer, project: Path, tmp_path: Path
) -> None:
    # slow pages while the crawl is steered: 600 pages last over 30 s at 16 a second, so
    # the drain comes long before the end even when a loaded machine starts each CLI
    # slowly; the site speeds up for the completion at the end
    site = LoggedSite(pages=600, delay=0.5).start()
    logs = tmp_path / "logs"
    logs.mkdir()
    crawl = WorkerCrawl(server, site, logs, project_dir=project, settings=WORKER_SETTINGS)
    client = crawl.client
    try:
        crawl.start(2)
        crawl.wait_ready()
        crawl.seed()
        crawl.hit_when(30)

        # pause: no request later than 1 s after it; what was in flight is acknowledged
        paused = cli(project, server.url, "pause", "pages", "--reason", "deploy", "--wait")
        assert paused.returncode == 0, paused.stderr
        assert "running -> paused" in paused.stdout
        assert "in-flight work finished, nothing leased" in paused.stdout
        since = float(cast("bytes", client.hget("pages:control", "since")))
        time.sleep(1.5)
        late = site.after(since + 1.0)
        assert not late, f"{len(late)} request(s) more than 1 s after the pause: {late[:5]}"
        hits = site.hits()
        assert all(n == 1 for n in hits.values())
        assert leased_count(client, "pages") == 0
        done = int(cast("bytes", client.hget("pages:progress", "done")))
        assert done == len(hits) + 1  # every page fetched (and the seed) acknowledged
        assert queued_count(client, "pages:requests") > 0
        assert all(w.returncode is None for w in crawl.workers), crawl.logs()

        status = json.loads(cli(project, server.url, "status", "pages", "--json").stdout)
        assert (status["control"]["state"], status["control"]["reason"]) == (PAUSED, "deploy")

        # resume: work goes on within about a second
        resumed = cli(project, server.url, "resume", "pages")
        assert resumed.returncode == 0, resumed.stderr
        resumed_at = float(cast("bytes", client.hget("pages:control", "since")))
        crawl.hit_when(len(hits) + 20, timeout=20)
        first = min(t for t, _ in site.after(resumed_at))
        assert first - resumed_at < 1.5, first - resumed_at

        # drain: both workers exit 0 with the reason "drained"; nothing leased
        drained = cli(project, server.url, "drain", "pages", "--wait", "--timeout", "30")
        registry = f"registry {client.hgetall('pages:workers')} at {client.time()}\n"
        assert drained.returncode == 0, drained.stderr + registry + crawl.full_logs()
        assert crawl.wait(timeout=30) == [0, 0], crawl.logs()
        for worker in crawl.workers:
            assert "Closing spider (drained)" in worker.log_file.read_text(), crawl.logs()
        assert leased_count(client, "pages") == 0
        assert queued_count(client, "pages:requests") > 0, (
            f"the crawl finished before the drain: {site.hits().__len__()} pages fetched, "
            f"{client.hgetall('pages:progress')}\n" + crawl.full_logs()
        )
        fetched = sum(site.hits().values())

        # a worker started while the crawl drains exits at once, naming the way out
        [late_worker] = crawl.start(1)
        assert crawl.wait(timeout=60) == [0, 0, 0], crawl.logs()
        assert "scrapy-dist resume pages" in late_worker.log_file.read_text()
        assert sum(site.hits().values()) == fetched

        # resume, one new worker: the crawl completes, every page exactly once
        site.delay = 0.02
        assert cli(project, server.url, "resume", "pages").returncode == 0
        crawl.start(1, CONCURRENT_REQUESTS=16, SCHEDULER_PREFETCH=8)
        assert crawl.wait(timeout=90) == [0, 0, 0, 0], crawl.logs()
        assert not crawl.missing()
        assert duplicates(site.hits()) == 0, duplicates(site.hits())
    finally:
        crawl.close()
        site.stop()


# -- the stored state and the Python API ---------------------------------------------


def test_no_key_reads_as_running(client: redis.Redis, name: str) -> None:
    keys = RedisKeys.build(name)
    assert read_state(client, keys) == ControlState()
    assert read_state(client, keys).running


def test_api_pauses_resumes_and_drains(client: redis.Redis, name: str) -> None:
    control = CrawlControl(client, RedisKeys.build(name))
    state = control.pause("site asked", by="ops")
    assert (state.state, state.by, state.reason) == (PAUSED, "ops", "site asked")
    assert state.since is not None
    assert abs(state.since - time.time()) < 5
    assert control.state == state
    again = control.pause("other reason")
    assert again == state  # no change: the first pause's who, when and why stay
    assert control.drain().state == DRAINING
    resumed = control.resume()
    assert resumed.running
    assert "@" in resumed.by
    assert control.settled().leased == 0


def test_api_from_settings_names_the_jobs_key(
    redis_url: str, client: redis.Redis, name: str
) -> None:
    from scrapy.settings import Settings

    control = CrawlControl.from_settings(Settings({"REDIS_URL": redis_url}), name, job="j1")
    assert control.keys.control == f"{name}:j1:control"
    control.pause()
    assert client.hget(f"{name}:j1:control", "state") == b"paused"


def test_garbage_state_reads_as_paused_with_the_problem(client: redis.Redis, name: str) -> None:
    keys = RedisKeys.build(name)
    client.hset(keys.control, mapping={"state": "go-go-go", "since": "soon"})
    state = read_state(client, keys)
    assert state.state == PAUSED
    assert "go-go-go" in state.problem
    assert state.since is None
    client.delete(keys.control)
    client.set(keys.control, "paused")
    state = read_state(client, keys)
    assert state.state == PAUSED
    assert "not a hash" in state.problem
    with pytest.raises(ConfigurationError, match="not a hash"):
        set_state(client, keys, RUNNING)
    assert client.get(keys.control) == b"paused"  # left alone


def test_parse_bounds_what_it_keeps() -> None:
    state = parse_state({b"state": b"paused", b"by": b"x" * 1000, b"reason": "é" * 2000})
    assert state.state == PAUSED
    assert len(state.by) == 100
    assert len(state.reason) == 500
    assert parse_state({}) == ControlState()
    assert parse_state({b"by": b"someone"}).state == PAUSED  # no state field


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reason": "two\nlines"}, "printable"),
        ({"reason": "x" * 501}, "at most 500"),
        ({"by": "\x1b[31mred"}, "printable"),
    ],
)
def test_set_state_refuses_hostile_text(
    client: redis.Redis, name: str, kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        set_state(client, RedisKeys.build(name), PAUSED, **kwargs)
    assert not client.exists(RedisKeys.build(name).control)


def test_set_state_refuses_an_unknown_state(client: redis.Redis, name: str) -> None:
    with pytest.raises(ConfigurationError, match="unknown crawl state"):
        set_state(client, RedisKeys.build(name), "stopped")


# -- the command ---------------------------------------------------------------------


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_pause_resume_drain(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    url = ["--redis-url", redis_url]
    code, out, err = run(["pause", name, "--reason", "deploy", "--by", "ci", *url], capsys)
    assert code == 0
    assert "running -> paused" in out
    assert "deploy" in out
    assert "has no keys" in err  # said, but a crawl may be paused before it starts
    code, out, _ = run(["pause", name, *url], capsys)
    assert code == 0
    assert "already paused" in out
    code, out, _ = run(["status", name, *url], capsys)
    assert code == 0
    assert "paused" in out
    assert "by ci: deploy" in out
    code, out, _ = run(["drain", name, "--json", "--wait", "--timeout", "1", *url], capsys)
    result = json.loads(out)
    assert code == 0
    assert result["changed"]
    assert result["state"]["state"] == DRAINING
    assert result["before"]["state"] == PAUSED
    assert result["settled"]
    code, out, _ = run(["resume", name, *url], capsys)
    assert code == 0
    assert "draining -> running" in out
    assert client.hget(f"{name}:control", "state") == b"running"


def test_cli_refuses_the_stamp_of_now_while_the_spider_runs_under_an_older_one(
    redis_url: str, client: redis.Redis, name: str, project: Path
) -> None:
    """With SCHEDULER_JOB_TIMESTAMP the crawl's name is the stamp of the moment the
    command runs. Once the stamp rolled over since the workers started, `drain --wait`
    drained the new stamp's crawl (no keys, no workers: "every worker exited", exit 0)
    while the workers ran on, and left a drain for the next crawl of that stamp."""
    older = f"pages:{name}"  # the running crawl, named by an older stamp (any job)
    client.rpush(f"{older}:dead", "{}")
    seconds, _ = client.time()
    now = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y%m%d%H%M%S")
    stamp = ["-s", "SCHEDULER_JOB_TIMESTAMP=%Y%m%d%H%M%S"]
    try:
        done = cli(project, redis_url, "drain", "pages", *stamp, "--wait", "--timeout", "1")
        assert done.returncode == 1, done.stderr
        assert "SCHEDULER_JOB_TIMESTAMP names it from the clock now" in done.stderr
        assert older in done.stderr
        assert "pass --job with the one to steer (nothing was changed)" in done.stderr
        written = [k.decode() for k in client.scan_iter(match="pages:*:control")]
        stamped = [k for k in written if k.split(":")[1].isdigit()]
        assert not [k for k in stamped if k.split(":")[1] >= now], written

        chosen = cli(project, redis_url, "drain", "pages", "--job", name)
        assert chosen.returncode == 0, chosen.stderr
        assert client.hget(f"{older}:control", "state") == b"draining"
    finally:
        client.delete(f"{older}:dead", f"{older}:control")


def test_cli_wait_times_out_while_a_live_worker_holds_leases(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    now = time.time()
    # w1's lease lasts 60 s more; w2's expired (a worker's leases share one deadline)
    client.zadd(f"{name}:holders", {"w1": now + 60, "w2": now - 60})
    client.hset(f"{name}:holders:w1", "a", "q|0|{}")
    client.hset(f"{name}:holders:w2", "expired", "q|0|{}")
    client.hset(f"{name}:workers", mapping={"w1": str(now), "w2": str(now)})
    code, _out, err = run(
        ["drain", name, "--wait", "--timeout", "0.3", "--redis-url", redis_url], capsys
    )
    assert code == 1
    assert "1 lease(s) still held and 2 worker(s) live" in err  # the expired one not counted


@pytest.mark.parametrize(
    "args",
    [
        ["pause", "X", "--reason", "a\nb"],
        ["pause", "X", "--reason", "r" * 501],
        ["drain", "X", "--by", "\x00"],
        ["drain", "X", "--timeout", "-1"],
        ["drain", "X", "--timeout", "nan"],
        ["resume", "X", "--wait"],
        ["pause"],
    ],
)
def test_cli_refuses_bad_arguments(  # noqa: PLR0917
    args: list[str],
    capsys: pytest.CaptureFixture[str],
    redis_url: str,
    client: redis.Redis,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [name if a == "X" else a for a in args]
    code, _, err = run([*args, "--redis-url", redis_url], capsys)
    assert code == 2, err
    assert not client.exists(f"{name}:control")


def test_cli_refuses_a_control_key_of_another_type(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    client.rpush(f"{name}:control", "x")
    code, _, err = run(["resume", name, "--redis-url", redis_url], capsys)
    assert code == 2
    assert "holds a list, not a hash" in err
    assert "redis-cli del" in err
    code, out, _ = run(["status", name, "--redis-url", redis_url], capsys)
    assert code == 0
    assert "invalid control key" in out


def test_cli_unreachable_redis_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from scrapy_dist.testing.redis_server import free_port

    monkeypatch.chdir(tmp_path)
    code, _, err = run(["pause", "x", "--redis-url", f"redis://127.0.0.1:{free_port()}"], capsys)
    assert code == 1
    assert err


def test_metrics_export_the_state() -> None:
    class Status:
        control: ControlState | None = ControlState(DRAINING, since=123.5)

    assert control_gauges(cast("Any", Status())) == {
        "scrapy_dist_control_state": 2,
        "scrapy_dist_control_since_seconds": 123.5,
    }
    Status.control = ControlState(PAUSED, problem="garbage")
    assert control_gauges(cast("Any", Status()))["scrapy_dist_control_state"] == 1
    Status.control = None
    assert control_gauges(cast("Any", Status())) == {}


# -- a worker's reads: failures keep the state, garbage pauses --------------------------


class FlakyClient:
    """A client whose ``HMGET`` raises ``error`` while it is set."""

    def __init__(self, real: redis.Redis) -> None:
        self.real = real
        self.error: Exception | None = None
        self.reads = 0

    def hmget(self, key: str, fields: Any) -> Any:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return self.real.hmget(key, fields)


@pytest.fixture
def fake() -> redis.Redis:
    return cast("redis.Redis", fakeredis.FakeRedis())


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.ResponseError("LOADING Redis is loading the dataset in memory"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
        redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
        redis.exceptions.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
        redis.exceptions.NoPermissionError("NOPERM this user has no permissions"),
    ],
)
def test_a_failing_read_keeps_the_last_state(
    fake: redis.Redis, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    keys = RedisKeys.build("books")
    flaky = FlakyClient(fake)
    watcher = ControlWatcher(cast("redis.Redis", flaky), keys, interval=0.01)
    set_state(fake, keys, PAUSED)
    assert watcher.holds()
    flaky.error = error
    set_state(fake, keys, RUNNING)  # written, but this worker cannot read it
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.worker.control"):
        for _ in range(5):
            time.sleep(0.011)
            assert watcher.holds()  # still paused: a failed read resumes nothing
    warnings = [r for r in caplog.records if "Cannot read the crawl control" in r.message]
    assert len(warnings) == 1  # logged once
    assert flaky.reads < 6  # backing off
    flaky.error = None
    time.sleep(0.2)
    assert not watcher.holds()  # readable again: the new state applies

    flaky.error = error  # and a failure does not pause a running crawl
    time.sleep(0.2)
    assert not watcher.holds()


def test_garbage_pauses_a_worker_and_says_so_loudly(
    fake: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = RedisKeys.build("books")
    watcher = ControlWatcher(fake, keys, interval=0.01)
    assert not watcher.holds()
    fake.hset(keys.control, "state", "banana")
    time.sleep(0.011)
    with caplog.at_level(logging.ERROR, logger="scrapy_dist.worker.control"):
        assert watcher.holds()
        time.sleep(0.011)
        assert watcher.holds()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "banana" in errors[0].getMessage()
    fake.delete(keys.control)
    fake.set(keys.control, "x")
    time.sleep(0.011)
    assert watcher.holds()
    assert "not a hash" in watcher.state.problem
    fake.delete(keys.control)
    time.sleep(0.011)
    assert not watcher.holds()


def test_a_worker_reads_at_most_twice_a_second(fake: redis.Redis) -> None:
    flaky = FlakyClient(fake)
    watcher = ControlWatcher(cast("redis.Redis", flaky), RedisKeys.build("books"))
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        watcher.holds()
        time.sleep(0.01)
    assert flaky.reads <= 1 / POLL_INTERVAL + 1


# -- the scheduler: nothing handed out, buffer handed back, no completion ------------


@pytest.fixture
def crawler_of(make_crawler: Callable[..., Crawler]) -> Iterator[Callable[..., Any]]:
    schedulers: list[Any] = []

    def make(**settings: Any) -> Any:
        from scrapy_dist.scheduler import Scheduler

        crawler = make_crawler({"SCHEDULER_PREFETCH": 3, **settings})
        scheduler = Scheduler.from_crawler(crawler)
        assert crawler.spider is not None
        scheduler.open(crawler.spider)
        schedulers.append(scheduler)
        return scheduler

    yield make
    for scheduler in schedulers:
        scheduler.close("finished")


def test_a_paused_scheduler_hands_out_nothing_and_hands_back_its_buffer(
    crawler_of: Callable[..., Any], client: redis.Redis, name: str
) -> None:
    from scrapy import Request

    scheduler = crawler_of()
    keys = scheduler.frontier.keys
    for i in range(6):
        scheduler.enqueue_request(Request(f"https://example.com/{i}"))
    first = scheduler.next_request()
    assert first is not None
    assert len(scheduler.deliveries.buffer) == 2
    scheduler.deliveries.in_flight = lambda: {first}
    set_state(client, keys, PAUSED)
    scheduler.control.watcher._next_read = 0  # as if the poll interval had passed
    assert scheduler.next_request() is None
    assert not scheduler.deliveries.buffer
    scheduler.frontier.flush()
    in_flight = scheduler.deliveries.out[first]
    held = holdings(client, keys.crawl)  # only the one in flight, still this worker's
    assert {w: set(leases) for w, leases in held.items()} == {
        scheduler.frontier.worker_id: {in_flight}
    }
    assert queued_count(client, keys.requests) == 5
    with pytest.raises(DontCloseSpider):
        scheduler.close_if_failed()
    scheduler.deliveries.in_flight = set
    scheduler.heartbeat.tick()  # settles the one in flight: acknowledged while paused
    scheduler.frontier.flush()
    assert leased_count(client, keys.crawl) == 0
    set_state(client, keys, RUNNING)
    scheduler.control.watcher._next_read = 0
    assert scheduler.next_request() is not None


@pytest.mark.parametrize("since", ["nan", "inf", "-inf", "1e300", "-5", "99999999999999"])
def test_a_control_key_written_by_hand_with_garbage_neither_breaks_a_worker_nor_a_reader(  # noqa: PLR0917
    crawler_of: Callable[..., Any],
    client: redis.Redis,
    name: str,
    since: str,
    capsys: pytest.CaptureFixture[str],
    redis_url: str,
) -> None:
    """``HSET <crawl>:control state paused since nan`` (or a time no clock has): the
    scheduler's next_request raised (the state's description formats ``since``), and so
    did ``scrapy-dist status``. ``since`` then reads as unknown; control characters in
    ``by`` and ``reason`` reach logs and terminals escaped."""
    from scrapy import Request

    scheduler = crawler_of()
    keys = scheduler.frontier.keys
    scheduler.enqueue_request(Request("https://example.com/1"))
    client.hset(
        keys.control,
        mapping={"state": "paused", "since": since, "by": "x\n\x1b[31m", "reason": "a\r\nb"},
    )
    client.hset(keys.control, mapping={f"junk{i}": "x" * 100 for i in range(2000)})
    scheduler.control.watcher._next_read = 0
    assert scheduler.next_request() is None  # paused, and no exception
    state = scheduler.control.watcher.state
    assert (state.state, state.since) == (PAUSED, None)
    assert state.by == "x\\n\\x1b[31m"
    assert "\n" not in state.describe()
    assert "\x1b" not in state.describe()
    json.dumps(state.as_dict(), allow_nan=False)
    assert main(["status", keys.crawl, "--redis-url", redis_url]) == 0
    assert main(["status", keys.crawl, "--redis-url", redis_url, "--json"]) == 0
    out = capsys.readouterr().out
    json.loads(out.splitlines()[-1], parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    set_state(client, keys, RUNNING)
    scheduler.control.watcher._next_read = 0
    assert scheduler.next_request() is not None


def test_a_paused_crawl_is_never_marked_finished(
    crawler_of: Callable[..., Any], client: redis.Redis, name: str
) -> None:
    from scrapy import Request

    scheduler = crawler_of()
    keys = scheduler.frontier.keys
    scheduler.enqueue_request(Request("https://example.com/a"))
    request = scheduler.next_request()
    scheduler.deliveries.in_flight = set
    assert request is not None
    scheduler.heartbeat.tick()
    set_state(client, keys, PAUSED)
    scheduler.close("shutdown")  # the crawl is empty, but paused: not finished
    assert not client.hget(keys.progress, "finished_at")
    assert client.exists(keys.epoch)


def test_a_draining_worker_closes_once_it_holds_nothing(
    crawler_of: Callable[..., Any], client: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scrapy import Request

    from scrapy_dist.worker import engine

    closed: list[str] = []
    monkeypatch.setattr(engine, "close_spider", lambda crawler, reason: closed.append(reason))
    scheduler = crawler_of()
    keys = scheduler.frontier.keys
    scheduler.enqueue_request(Request("https://example.com/a"))
    request = scheduler.next_request()
    scheduler.deliveries.in_flight = lambda: {request}
    set_state(client, keys, DRAINING)
    scheduler.control.watcher._next_read = 0
    scheduler.heartbeat.tick()
    assert closed == []  # one request still in flight
    scheduler.deliveries.in_flight = set
    scheduler.heartbeat.tick()
    assert closed == ["drained"]
    scheduler.heartbeat.tick()
    assert closed == ["drained"]  # once


def test_a_drain_that_closes_the_scheduler_within_the_tick_leaves_the_registry(
    crawler_of: Callable[..., Any], client: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scrapy's engine may close the spider at once, inside the timer's tick: the tick
    then neither heartbeats nor renews (a heartbeat would register the worker again,
    and ``drain --wait`` would see it live until SCHEDULER_WORKER_TIMEOUT)."""
    from scrapy_dist.worker import engine

    scheduler = crawler_of()
    keys = scheduler.frontier.keys
    monkeypatch.setattr(engine, "close_spider", lambda crawler, reason: scheduler.close(reason))
    assert client.hexists(keys.workers, scheduler.frontier.worker_id)
    set_state(client, keys, DRAINING)
    scheduler.control.watcher._next_read = 0
    scheduler.heartbeat._next_beat = 0  # a heartbeat is due in this tick
    scheduler.heartbeat.tick()
    assert scheduler.control.closing
    assert not client.hexists(keys.workers, scheduler.frontier.worker_id)


def test_a_worker_opened_while_the_crawl_drains_closes_at_once(
    crawler_of: Callable[..., Any],
    client: redis.Redis,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from scrapy_dist.worker import engine

    closed: list[str] = []
    monkeypatch.setattr(engine, "close_spider", lambda crawler, reason: closed.append(reason))
    set_state(client, RedisKeys.build(name), DRAINING)
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.worker.control"):
        scheduler = crawler_of()
    assert f"scrapy-dist resume {name}" in caplog.text
    assert scheduler.next_request() is None
    scheduler.heartbeat.tick()
    assert closed == ["drained"]


class ListQueue(Base):
    """A scrapy-redis style queue: pops without a lease."""

    def push(self, request: Any, dupefilter: Any = None) -> None:
        self.server.lpush(self.key, self._encode_request(request))

    def pop(self, timeout: int = 0) -> Any:
        data = self.server.rpop(self.key)
        return self._decode_request(cast("bytes", data)) if data else None

    def __len__(self) -> int:
        return self.server.llen(self.key)


def test_an_unleased_queue_pops_nothing_while_paused(
    crawler_of: Callable[..., Any], client: redis.Redis, name: str
) -> None:
    from scrapy import Request

    scheduler = crawler_of(SCHEDULER_QUEUE_CLASS=f"{__name__}.ListQueue")
    assert not scheduler.leased
    scheduler.enqueue_request(Request("https://example.com/a"))
    set_state(client, scheduler.frontier.keys, PAUSED)
    scheduler.control.watcher._next_read = 0
    assert scheduler.next_request() is None
    assert len(scheduler) == 1
    set_state(client, scheduler.frontier.keys, RUNNING)
    scheduler.control.watcher._next_read = 0
    assert scheduler.next_request() is not None


# -- a sharded crawl (SCHEDULER_SHARDS): every shard paused, drained, waited for ----------

#: Names of 127.0.0.1 whose requests go to shards 0, 1 and 2 of 3.
HOSTS = ["127.0.0.1", "127.0.1", "0x7f000001"]


def leases_per_shard(crawl: WorkerCrawl, count: int = 3) -> list[int]:
    every = shard_keys(RedisKeys.build("pages"), Config.from_settings(Settings()).keys, count)
    return [leased_count(crawl.client, k.crawl) for k in every]


# -- what --wait counts ----------------------------------------------------------------


def test_settled_counts_the_leases_of_every_shard(client: redis.Redis, name: str) -> None:
    keys = RedisKeys.build(name)
    control = CrawlControl(client, keys)
    client.set(keys.shards, 3)
    now = time.time()
    client.hset(keys.workers, mapping={"w1": now, "w2": now})
    # in shard 2, w1's lease lasts 60 s more; w2's expired
    client.zadd(f"{name}#shard2:holders", {"w1": now + 60, "w2": now - 60})
    client.hset(f"{name}#shard2:holders:w1", "lease-1", "q|0|{}")
    client.hset(f"{name}#shard2:holders:w2", "expired", "q|0|{}")
    found = control.settled()
    assert (found.leased, found.workers) == (1, 2)  # the expired one is not waited for
    assert control.wait_settled(timeout=0.3).leased == 1
    client.hdel(f"{name}#shard2:holders:w1", "lease-1")  # w1 settles it
    assert control.settled().leased == 0


def test_settled_does_not_wait_for_the_leases_of_a_dead_worker(
    client: redis.Redis, name: str
) -> None:
    keys = RedisKeys.build(name)
    control = CrawlControl(client, keys, worker_timeout=2)
    now = time.time()
    client.hset(keys.workers, mapping={"dead": now - 60, "live": now})
    client.zadd(keys.holders, {"dead": now + 120, "live": now + 120})
    client.hset(keys.holding("dead"), "a", "q|0|{}")  # killed -9: its lease lasts 120 s more
    client.hset(keys.holding("live"), "b", "q|0|{}")
    assert control.settled() == Settled(1, 1)
    client.hdel(keys.holding("live"), "b")  # the live worker settles it
    assert control.wait_settled(timeout=5) == Settled(0, 1)


def test_settled_waits_for_the_unexpired_leases_of_a_previous_version(
    client: redis.Redis, name: str
) -> None:
    keys = RedisKeys.build(name)
    control = CrawlControl(client, keys, worker_timeout=2)
    now = time.time()
    client.hset(keys.workers, "old", now)  # a worker of the previous version, running
    client.zadd(keys.leases, {"1": now + 120, "2": now - 1})  # one live, one expired
    assert control.settled() == Settled(1, 1)
    client.zrem(keys.leases, "1")  # it settles it
    assert control.wait_settled(timeout=5) == Settled(0, 1)


@pytest.mark.e2e
def test_drain_while_redis_refuses_writes_loses_nothing(
    server: RedisServer, project: Path, tmp_path: Path
) -> None:
    from scrapy_dist.testing.refusals import refuse_oom

    site = LoggedSite(pages=300, delay=0.15)
    site.hosts = HOSTS
    site.start()
    logs = tmp_path / "logs"
    logs.mkdir()
    settings = {**WORKER_SETTINGS, "SCHEDULER_SHARDS": 3, "SCHEDULER_LEASE_TIMEOUT": 20}
    crawl = WorkerCrawl(server, site, logs, project_dir=project, settings=settings)
    try:
        crawl.start(2)
        crawl.wait_ready()
        crawl.seed()
        crawl.hit_when(30)
        set_state(crawl.client, RedisKeys.build("pages"), DRAINING)
        lift = refuse_oom(crawl.client)  # before the workers act on the drain
        # refused until a worker finished its work and said it waits for Redis (a
        # loaded machine may take more than a few seconds to get there), and for 3 s
        # at least; it then waits up to the 20 s lease timeout
        waiting = "waiting for it up to SCHEDULER_LEASE_TIMEOUT"
        refused_at = time.monotonic()
        while waiting not in crawl.full_logs():
            assert time.monotonic() - refused_at < 15, crawl.logs()
            time.sleep(0.1)
        time.sleep(max(0.0, refused_at + 3 - time.monotonic()))
        # they finished their work but Redis has not taken their acknowledgements: wait
        assert [w.returncode for w in crawl.workers] == [None, None], crawl.logs()
        lift()
        assert crawl.wait(timeout=40) == [0, 0], crawl.logs()
        assert leases_per_shard(crawl) == [0, 0, 0]  # every acknowledgement went through
        fetched = site.hits()
        assert cli(project, server.url, "resume", "pages").returncode == 0
        crawl.start(1, CONCURRENT_REQUESTS=16, SCHEDULER_PREFETCH=8)
        assert crawl.wait(timeout=90) == [0, 0, 0], crawl.logs()
        assert not crawl.missing()
        assert duplicates(site.hits()) == 0, (duplicates(site.hits()), len(fetched))
    finally:
        crawl.close()
        site.stop()
