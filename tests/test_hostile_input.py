"""Abuse: seeds and queue entries are input, not code.

Whoever can write to the crawl's Redis keys (a careless producer, an attacker) must
not make a worker import a module, read a local file, call a framework method, change
where it connects or take its other work down with it. Each hostile seed or queue
entry is dead-lettered once, alone, with a clear reason, its raw bytes kept readable
and requeueable byte for byte; the crawl still fetches every good page exactly once.

The crawls run real ``scrapy crawl`` worker processes against a private redis-server
and a local :class:`~scrapy_dist.testing.TestSite`.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import scrapy
from scrapy import Request
from scrapy.http import FormRequest, JsonRequest
from scrapy.spiders import CrawlSpider

from scrapy_dist import callbacks, deadletter
from scrapy_dist.exceptions import ConfigurationError, InvalidSeed, SerializationError
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.scripts import scripts_for
from scrapy_dist.seeds import check_callbacks, parse_seed, request_from_seed
from scrapy_dist.serializers import PRIORITY_MAX, JsonSerializer, RequestCodec, RequestPolicy
from scrapy_dist.spiders import RedisSpider
from scrapy_dist.testing import TestSite
from scrapy_dist.testing.crawl import WorkerCrawl, worker_logs
from scrapy_dist.testing.leases import leased_count
from scrapy_dist.testing.queues import push_raw, queued_count, queued_entries
from scrapy_dist.testing.workers import run_cli
from scrapy_dist.worker import engine as _engine
from scrapy_dist.worker.startup import start_failure

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy.crawler import Crawler

    from scrapy_dist.testing import RedisServer, Worker

#: Skipped without a redis-server binary, a failure under CI (see conftest.py).
pytestmark_redis = pytest.mark.redis_server

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_DIR = ROOT / "example"
TEST_PROJECT = ROOT / "tests" / "project"
PAGES = 200
CRAWL_TIMEOUT = 90.0

#: A module that proves it was imported by writing a marker file.
MARKER_MODULE = """
import os
from pathlib import Path

from scrapy import Request

Path(os.environ["HOSTILE_MARKER"]).write_text("imported")


class Evil(Request):
    pass
"""


class UserSpider(RedisSpider):
    name = "user"

    def parse(self, response: Any) -> Any:
        return None

    def parse_item(self, response: Any) -> Any:
        return None

    def _parse_detail(self, response: Any) -> Any:
        return None

    def start(self) -> Any:  # overrides the framework's API: never a callback
        return super().start()


# -- callbacks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "__init__",
        "_parse_detail",
        "_set_crawler",
        "start",
        "closed",
        "make_request_from_data",
        "schedule_next_requests",
        "update_settings",
        "from_crawler",
        "logger",
        "name",
        "missing",
        "log",
        "parse_item()",
        "",
    ],
)
def test_seed_callbacks_name_only_public_methods_of_the_users_spider(name: str) -> None:
    assert callbacks.refusal(UserSpider, name, public_only=True) is not None
    for field in ("callback", "errback"):
        raw = json.dumps({"url": "https://a.example/", field: name})
        with pytest.raises(InvalidSeed):
            check_callbacks(parse_seed(raw), UserSpider)
        with pytest.raises(InvalidSeed):
            request_from_seed(parse_seed(raw), UserSpider())


def test_queue_entry_callbacks_allow_private_user_methods_and_rule_callbacks() -> None:
    assert callbacks.refusal(UserSpider, "_parse_detail", public_only=False) is None
    assert callbacks.refusal(UserSpider, "__init__", public_only=False) is not None
    assert callbacks.refusal(UserSpider, "start", public_only=False) is not None

    class Rules(CrawlSpider):
        name = "rules"

    assert callbacks.refusal(Rules, "_callback", public_only=False) is None
    assert callbacks.refusal(Rules, "_errback", public_only=False) is None
    assert callbacks.refusal(Rules, "_callback", public_only=True) is not None
    spider = UserSpider()
    for name in ("parse", "parse_item"):  # what a seed may name
        seed = parse_seed(json.dumps({"url": "https://a.example/", "callback": name}))
        assert request_from_seed(seed, spider).callback == getattr(spider, name)


# -- seeds ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta",
    [
        {"proxy": "http://attacker.example:8080"},
        {"bindaddress": ["10.0.0.1", 0]},
        {"download_slot": "x"},
        {"dont_proxy": True},
        {"_auth_proxy": "x"},
        {"download_timeout": 99999},
    ],
)
def test_seed_meta_cannot_change_where_a_worker_connects(meta: dict[str, Any]) -> None:
    raw = json.dumps({"url": "https://a.example/", "meta": meta})
    with pytest.raises(InvalidSeed, match="SEED_ALLOWED_META"):
        parse_seed(raw)
    assert parse_seed(raw, allowed_meta=list(meta)).meta == meta
    harmless = {"page": 3, "cookiejar": 1, **meta}
    assert (
        parse_seed(
            json.dumps({"url": "https://a.example/", "meta": harmless}), allowed_meta=list(meta)
        ).meta
        == harmless
    )


@pytest.mark.parametrize("priority", [10**400, PRIORITY_MAX + 1, -(PRIORITY_MAX + 1)])
def test_seed_priority_is_bounded_to_what_a_queue_score_stores(priority: int) -> None:
    with pytest.raises(InvalidSeed, match="priority"):
        parse_seed(f'{{"url": "https://a.example/", "priority": {priority}}}')
    assert parse_seed(f'{{"url": "https://a.example/", "priority": {PRIORITY_MAX}}}')


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 10_000 + "]" * 10_000,
        '{"url": "https://a.example/", "meta": {"a": ' + "[" * 10_000 + "]" * 10_000 + "}}",
    ],
)
def test_deeply_nested_seed_is_a_clean_rejection(raw: str) -> None:
    with pytest.raises(InvalidSeed):
        parse_seed(raw)


@pytestmark_redis
def test_push_rejects_bad_lines_and_pushes_the_valid_ones(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """``scrapy-dist push`` in a project, as a user runs it: every bad line (deep
    nesting included) is reported and the valid lines are pushed."""
    lines = [
        b"https://a.example/1",
        b"[" * 10_000 + b"]" * 10_000,
        b'{"url": "https://a.example/2", "meta": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_001,
        b'{"url": "https://a.example/3", "priority": 1' + b"0" * 400 + b"}",
        b'{"url": "https://a.example/4", "callback": "__init__"}',
        b'{"url": "https://a.example/5", "meta": {"proxy": "http://attacker.example:8080"}}',
        b'{"url": "https://a.example/6", "callback": "parse", "priority": 3}',
    ]
    seeds = tmp_path / "seeds.txt"
    seeds.write_bytes(b"\n".join(lines) + b"\n")
    done = run_cli(
        "push",
        "pages",
        "--file",
        str(seeds),
        "--job",
        name,
        "--redis-url",
        redis_url,
        cwd=TEST_PROJECT,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    for number in (2, 3, 4, 5, 6):
        assert f":{number}:" in done.stderr or f"line {number}" in done.stderr, done.stderr
    assert "SEED_ALLOWED_META" in done.stderr
    pushed = client.lrange(f"pages:{name}:start_urls", 0, -1)
    assert pushed == [lines[0], lines[6]]


# -- queue entries --------------------------------------------------------------------


@pytestmark_redis
def test_a_malformed_entry_does_not_take_its_batch_down(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """A non-UTF-8 entry without an entry id, leased with good requests: it alone is
    dead-lettered (raw bytes kept), the good ones are leased and delivered."""
    from scrapy_dist.frontier.choice import frontier_for

    frontier = frontier_for(make_crawler())
    keys = frontier.keys
    good = [b"%016d" % i + b'{"url": "https://a.example/%d"}' % i for i in (1, 2, 3)]
    bad = b"\xff\xfe\x00 pushed by hand"
    push_raw(client, keys.requests, {good[0]: 0, bad: 0, good[1]: 1, good[2]: 1})
    leases = frontier.reserve(10)
    assert sorted(lease.data for lease in leases) == sorted(entry[16:] for entry in good)
    records = [deadletter.parse(raw) for raw in _raw(client.lrange(keys.dead, 0, -1))]
    assert [deadletter.data_of(r) for r in records] == [bad]
    assert "malformed queue entry" in records[0]["reason"]
    assert queued_count(client, keys.requests) == 0


def _codec(policy: RequestPolicy | None = None) -> RequestCodec:
    return RequestCodec(JsonSerializer(), UserSpider(), policy)


def _raw(replies: list[bytes | str]) -> list[bytes]:
    """Replies of a client without ``decode_responses``, typed as what they are."""
    return cast("list[bytes]", replies)


def test_queue_entry_class_is_looked_up_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "hostile_marker_unit.py").write_text(MARKER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HOSTILE_MARKER", str(tmp_path / "marker"))
    entry = b'{"url": "https://a.example/", "_class": "hostile_marker_unit.Evil"}'
    with pytest.raises(SerializationError, match="not allowed"):
        _codec().decode(entry)
    assert "hostile_marker_unit" not in sys.modules
    assert not (tmp_path / "marker").exists()


def test_scrapy_request_classes_round_trip() -> None:
    codec = _codec()
    spider = codec.spider
    assert isinstance(spider, UserSpider)
    for request in (
        Request("https://a.example/", callback=spider.parse_item, priority=5),
        FormRequest("https://a.example/f", formdata={"a": "1"}, callback=spider._parse_detail),
        JsonRequest("https://a.example/j", data={"a": 1}),
    ):
        back = codec.decode(codec.encode(request))
        assert type(back) is type(request)
        assert (back.url, back.body, back.priority) == (request.url, request.body, request.priority)
        assert back.callback == request.callback


def test_extra_request_classes_come_from_settings_only() -> None:
    class MyRequest(Request):
        pass

    request = MyRequest("https://a.example/")
    with pytest.raises(SerializationError, match="SCHEDULER_REQUEST_CLASSES"):
        _codec().encode(request)
    codec = _codec(RequestPolicy.build([MyRequest]))
    assert type(codec.decode(codec.encode(request))) is MyRequest
    with pytest.raises(ConfigurationError):
        RequestPolicy.build(["builtins.dict"])


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "data:text/plain,hello", "s3://bucket/key", "ftp://a/b"]
)
def test_queue_entry_url_schemes_are_http_unless_widened(url: str) -> None:
    entry = json.dumps({"url": url}).encode()
    with pytest.raises(SerializationError, match="SCHEDULER_URL_SCHEMES"):
        _codec().decode(entry)
    with pytest.raises(SerializationError, match="SCHEDULER_URL_SCHEMES"):
        _codec().encode(Request(url))
    scheme = url.split(":", 1)[0]
    widened = _codec(RequestPolicy.build(schemes=["http", "https", scheme]))
    assert widened.decode(entry).url.startswith(scheme)


@pytest.mark.parametrize(
    "entry",
    [
        b'{"url": "https://a.example/", "callback": "__init__"}',
        b'{"url": "https://a.example/", "errback": "_set_crawler"}',
        b'{"url": "https://a.example/", "callback": "start"}',
        b'{"url": "https://a.example/", "cb": "__init__"}',
        b'{"url": "https://a.example/", "eb": "_set_crawler"}',
        b'{"url": "https://a.example/", "cl": "hostile_marker_unit.Evil"}',
        b'{"url": "https://a.example/", "cb": "parse", "callback": "parse"}',
        b'{"url": "https://a.example/", "p": 1' + b"0" * 400 + b"}",
        b'{"url": "https://a.example/", "priority": 1' + b"0" * 400 + b"}",
        b'{"url": "https://a.example/\xff\xfe"}',
        b'{"url": "https://a.example/", "meta": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b"\xff\xfe\x00garbage",
    ],
)
def test_bad_queue_entries_are_a_serialization_error(entry: bytes) -> None:
    with pytest.raises(SerializationError):
        _codec().decode(entry)


# -- engine internals -----------------------------------------------------------------


class _Slot:
    def __init__(self) -> None:
        self.inprogress: set[Request] = set()
        self.nextcall = self

    def schedule(self) -> None:
        pass


class _RenamedEngine:
    """An engine as a future Scrapy might have it: the slot under another name."""

    def __init__(self) -> None:
        self.slot_v3 = _Slot()


class _Engine:
    def __init__(self) -> None:
        self._slot = _Slot()


def test_engine_check_refuses_an_engine_without_its_slot() -> None:
    with pytest.raises(ConfigurationError, match=r"Scrapy \d.*engine\._slot"):
        _engine.check(_RenamedEngine())

    class NoInProgress(_Engine):
        def __init__(self) -> None:
            super().__init__()
            del self._slot.inprogress

    with pytest.raises(ConfigurationError, match=r"_slot\.inprogress"):
        _engine.check(NoInProgress())
    _engine.check(_Engine())


@pytestmark_redis
def test_scheduler_refuses_to_open_on_an_engine_without_its_slot(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    crawler = make_crawler()
    crawler.engine = _RenamedEngine()  # type: ignore[assignment]
    scheduler = Scheduler.from_crawler(crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)  # a failed start: reported, not raised
    failure = start_failure(crawler)
    assert failure is not None
    assert failure.reason == "configuration_error"
    assert f"Scrapy {scrapy.__version__} has no engine._slot" in failure.message
    assert not client.exists(scheduler.frontier.keys.workers)  # never joined the crawl


# -- dead letters: one format, written by Python and Lua alike -----------------------

#: A seed in latin-1 (``REDIS_ENCODING = "latin-1"``): not UTF-8.
NON_UTF8_SEED = "https://a.example/caf\u00e9?q=\u00ff".encode("latin-1")
#: A request as the pickle serializer stores it: not UTF-8.
NON_UTF8_PAYLOAD = pickle.dumps(
    {"url": "https://a.example/\u00e9t\u00e9", "callback": "parse", "priority": 3}, protocol=4
)


@pytest.mark.parametrize(
    "data",
    [
        b"plain",
        "caf\u00e9 \u2028 \U0001f600".encode(),
        b"\xff",
        b"\xc0\x80",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82",
        b'a\x00b"\\/\n\x7f',
        bytes(range(256)),
    ],
)
@pytestmark_redis
def test_lua_writes_the_python_record_format(client: redis.Redis, data: bytes) -> None:
    lua = scripts_for(client)
    from scrapy_dist.lua_source import source

    script = client.register_script(
        source("reserve").split("-- Lease up to COUNT", 1)[0]
        + "\nreturn dead_json(ARGV[1], ARGV[2], ARGV[3], 12.5, ARGV[4], 3)"
    )
    raw = script(args=["seed", data, "why \xe9", "w1"])
    assert lua is not None
    record = deadletter.parse(raw)
    python = deadletter.parse(
        deadletter.DeadLetters(client, "unused", "w1").record("seed", "why \xe9", data, 3)
    )
    assert record["kind"] == "seed"
    assert deadletter.data_of(record) == data
    assert {k: v for k, v in record.items() if k != "time"} == {
        k: v for k, v in python.items() if k != "time"
    }


# -- worker processes -------------------------------------------------------------------


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(PAGES) as test_site:
        yield test_site


class _Listener:
    """A TCP port that counts the connections made to it (an attacker's proxy)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@dataclass
class HostileCrawl:
    """What a crawl with hostile seeds and queue entries left behind."""

    statuses: list[int]
    workers: list[Worker]
    hits: dict[str, int]
    marker: Path
    proxy: _Listener
    secret: Path
    logs: str
    records: list[dict[str, Any]]
    hostile_seeds: list[bytes]
    hostile_entries: list[bytes]
    malformed: list[bytes]


@pytest.fixture(scope="module")
def hostile_crawl(
    module_server: RedisServer, site: TestSite, tmp_path_factory: pytest.TempPathFactory
) -> HostileCrawl:
    """Two workers crawl the site; hostile seeds and queue entries arrive meanwhile."""
    tmp_path = tmp_path_factory.mktemp("hostile")
    marker = tmp_path / "imported"
    modules = tmp_path / "modules"
    crawl = WorkerCrawl(
        module_server,
        site,
        tmp_path,
        project_dir=EXAMPLE_DIR,
        settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "SCHEDULER_PREFETCH": 8},
        stats_setting="DEMO_STATS_FILE",
        env={
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(modules)]),
            "HOSTILE_MARKER": str(marker),
        },
    )
    client = crawl.client
    client.flushdb()
    site.reset_hits()
    site.delay = 0.02
    modules.mkdir()
    (modules / "hostile_marker.py").write_text(MARKER_MODULE)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    proxy = _Listener()
    off_site = [site.page_url(PAGES + k) for k in range(20)]  # never to be fetched
    hostile_seeds = [
        json.dumps({"url": off_site[0], "callback": "__init__"}).encode(),
        json.dumps({"url": off_site[1], "callback": "_set_crawler"}).encode(),
        json.dumps(
            {"url": off_site[2], "meta": {"proxy": f"http://127.0.0.1:{proxy.port}"}}
        ).encode(),
        f'{{"url": "{off_site[3]}", "priority": 1{"0" * 400}}}'.encode(),
        b'{"url": "' + off_site[4].encode() + b'", "meta": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b"[" * 10_000,
        off_site[5].encode() + b"/\xff\xfe",
    ]
    deep = b"[" * 10_000 + b"]" * 10_000
    hostile_entries = [
        json.dumps({"url": off_site[6], "_class": "hostile_marker.Evil"}).encode(),
        json.dumps({"url": secret.as_uri(), "callback": "parse"}).encode(),
        json.dumps({"url": off_site[7], "callback": "__init__"}).encode(),
        json.dumps({"url": off_site[8], "errback": "close"}).encode(),
        b'{"url": "' + off_site[9].encode() + b'\xff"}',
        b'{"url": "' + off_site[10].encode() + b'", "meta": ' + deep + b"}",
    ]
    # an entry without the 16-digit id enqueue.lua writes, and not UTF-8 either
    malformed = [b"\xff\xfe not an entry", b'{"url": "' + off_site[11].encode() + b'"}']
    try:
        crawl.start(2)
        crawl.seed()
        crawl.wait_ready(timeout=CRAWL_TIMEOUT)
        deadline = time.monotonic() + 20
        while queued_count(client, "pages:requests") < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        # during the crawl: hostile seeds, and entries among the good ones in the queue
        client.rpush("pages:start_urls", *hostile_seeds)
        for n, payload in enumerate(hostile_entries):
            push_raw(client, "pages:requests", {b"%016d" % (10**12 + n) + payload: 0})
        push_raw(client, "pages:requests", dict.fromkeys(malformed, 0))
        statuses = crawl.wait(timeout=CRAWL_TIMEOUT)
    finally:
        crawl.stop(timeout=5.0)
        proxy.close()
    workers = crawl.workers
    logs = "".join(w.log_file.read_text(errors="replace") for w in workers)
    records = [deadletter.parse(raw) for raw in _raw(client.lrange("pages:dead", 0, -1))]
    return HostileCrawl(
        statuses=statuses,
        workers=workers,
        hits=site.hits(),
        marker=marker,
        proxy=proxy,
        secret=secret,
        logs=logs,
        records=records,
        hostile_seeds=hostile_seeds,
        hostile_entries=hostile_entries,
        malformed=malformed,
    )


def test_hostile_crawl_finishes_with_every_good_page_once(
    hostile_crawl: HostileCrawl, site: TestSite
) -> None:
    assert hostile_crawl.statuses == [0, 0], worker_logs(hostile_crawl.workers, 25)
    hits = hostile_crawl.hits
    assert set(hits) == site.expected_paths(), sorted(set(hits) ^ site.expected_paths())[:10]
    assert set(hits.values()) == {1}, {p: n for p, n in hits.items() if n > 1}


def test_queue_entry_class_never_imports_a_module(hostile_crawl: HostileCrawl) -> None:
    assert not hostile_crawl.marker.exists(), "a queue entry made a worker import a module"
    reasons = _reasons(hostile_crawl)
    assert "not allowed" in reasons[hostile_crawl.hostile_entries[0]]


def test_queue_entry_never_reads_a_local_file(hostile_crawl: HostileCrawl) -> None:
    assert f"<GET {hostile_crawl.secret.as_uri()}>" not in hostile_crawl.logs
    reasons = _reasons(hostile_crawl)
    assert "SCHEDULER_URL_SCHEMES" in reasons[hostile_crawl.hostile_entries[1]]


def test_seed_never_changes_where_a_worker_connects(hostile_crawl: HostileCrawl) -> None:
    assert hostile_crawl.proxy.connections == 0, "a seed made a worker use its proxy"
    assert "SEED_ALLOWED_META" in _reasons(hostile_crawl)[hostile_crawl.hostile_seeds[2]]


def test_each_hostile_input_is_dead_lettered_once_with_its_reason(
    hostile_crawl: HostileCrawl,
) -> None:
    records = hostile_crawl.records
    datas = [deadletter.data_of(r) for r in records]
    expected = hostile_crawl.hostile_seeds + hostile_crawl.hostile_entries + hostile_crawl.malformed
    for raw in expected:
        assert datas.count(raw) == 1, (raw[:80], [r.get("reason") for r in records])
    assert len(records) == len(expected), [r.get("reason") for r in records]
    reasons = _reasons(hostile_crawl)
    assert "priority" in reasons[hostile_crawl.hostile_seeds[3]]
    assert "__init__" in reasons[hostile_crawl.hostile_seeds[0]]
    assert "__init__" in reasons[hostile_crawl.hostile_entries[2]]
    assert "malformed queue entry" in reasons[hostile_crawl.malformed[0]]


def _reasons(crawl: HostileCrawl) -> dict[bytes | None, str]:
    return {deadletter.data_of(r): str(r.get("reason")) for r in crawl.records}


@pytestmark_redis
def test_dead_letters_from_lua_and_python_are_listed_and_requeued_byte_exact(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    make_crawler: Callable[..., Crawler],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A non-UTF-8 seed and request dead-lettered by Lua (max deliveries) and by Python
    are listed and come back from ``scrapy-dist dead requeue`` byte for byte."""
    from scrapy_dist.cli import main
    from scrapy_dist.frontier.choice import frontier_for

    settings = {"SCHEDULER_MAX_DELIVERIES": 1, "SCHEDULER_LEASE_TIMEOUT": 0.2}
    crawler = make_crawler(settings)
    assert b"\x80" in NON_UTF8_PAYLOAD
    with pytest.raises(UnicodeDecodeError):
        NON_UTF8_SEED.decode()
    frontier = frontier_for(crawler)
    keys = frontier.keys
    client.rpush(keys.start_urls, NON_UTF8_SEED)
    push_raw(client, keys.requests, {b"%016d" % 7 + NON_UTF8_PAYLOAD: 0})
    assert [lease.data for lease in frontier.reserve(5, seeds=True)] == [NON_UTF8_SEED]
    assert [lease.data for lease in frontier.reserve(5)] == [NON_UTF8_PAYLOAD]
    time.sleep(0.3)
    # another worker reclaims both past SCHEDULER_MAX_DELIVERIES (Lua)
    heir = frontier_for(make_crawler(settings))
    assert heir.reserve(5) == []
    assert client.llen(keys.dead) == 2
    assert leased_count(client, keys.crawl) == 0
    dead = deadletter.DeadLetters(client, keys.dead, "python-worker")
    dead.add(deadletter.SEED, "bad seed", NON_UTF8_SEED)
    dead.add(deadletter.REQUEST, "bad request", NON_UTF8_PAYLOAD)
    assert client.llen(keys.dead) == 4

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    options = [
        "--redis-url",
        redis_url,
        "-s",
        "SCHEDULER_SERIALIZER=pickle",
        "-s",
        "REDIS_ENCODING=latin-1",
    ]
    assert main(["dead", "list", name, "--json", *options]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # Lua's two come in the order of the worker's holding (a hash): either way round
    pairs = [(r["kind"], deadletter.data_of(r)) for r in listed]
    assert sorted(pairs[:2]) == [("request", NON_UTF8_PAYLOAD), ("seed", NON_UTF8_SEED)]
    assert pairs[2:] == [("seed", NON_UTF8_SEED), ("request", NON_UTF8_PAYLOAD)]
    assert all(r["reason"] for r in listed)

    assert main(["dead", "requeue", name, "--all", *options]) == 0, capsys.readouterr()
    assert client.llen(keys.dead) == 0
    assert client.lrange(keys.start_urls, 0, -1) == [NON_UTF8_SEED, NON_UTF8_SEED]
    payloads = [entry[16:] for entry in queued_entries(client, keys.requests)]
    assert payloads == [NON_UTF8_PAYLOAD, NON_UTF8_PAYLOAD]


def test_a_pickled_entry_with_a_huge_priority_is_a_serialization_error() -> None:
    from scrapy_dist.serializers import PickleSerializer

    codec = RequestCodec(PickleSerializer(), UserSpider())
    entry = pickle.dumps({"url": "https://a.example/", "priority": 10**5000}, protocol=4)
    with pytest.raises(SerializationError, match="priority"):
        codec.decode(entry)


@pytestmark_redis
def test_requeue_leaves_a_request_a_worker_would_refuse_again(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from scrapy_dist.cli import main

    dead = deadletter.DeadLetters(client, f"{name}:dead", "w")
    hostile = json.dumps({"url": "https://a.example/", "_class": "os.system"})
    local = json.dumps({"url": "file:///etc/passwd"})
    fine = json.dumps({"url": "https://a.example/ok"})
    for data in (hostile, local, fine):
        dead.add(deadletter.REQUEST, "refused", data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    assert main(["dead", "requeue", name, "--all", "--redis-url", redis_url]) == 1
    err = capsys.readouterr().err
    assert "#0: not requeued: request is still invalid: request class 'os.system'" in err
    assert "#1: not requeued: request is still invalid: URL scheme 'file'" in err
    dead_list = _raw(client.lrange(f"{name}:dead", 0, -1))
    left = [deadletter.data_of(deadletter.parse(r)) for r in dead_list]
    assert left == [hostile.encode(), local.encode()]
    assert [e[16:] for e in queued_entries(client, f"{name}:requests")] == [fine.encode()]


@pytestmark_redis
def test_lua_utf8_check_agrees_with_python(client: redis.Redis) -> None:
    """Lua escapes exactly the data Python's strict UTF-8 decoder refuses."""
    import random

    from scrapy_dist.lua_source import source

    rng = random.Random(11)
    pieces = [
        b"\xc2\x80",
        b"\xdf\xbf",
        b"\xe0\xa0\x80",
        b"\xed\x9f\xbf",
        b"\xf0\x90\x80\x80",
        b"\xf4\x8f\xbf\xbf",
        b"\x80",
        b"\xbf",
        b"\xc0",
        b"\xc1",
        b"\xe0",
        b"\xed",
        b"\xf4",
        b"\xf5",
        b"\xff",
        b"a",
        b"\x00",
    ]
    samples = [b"".join(rng.choices(pieces, k=rng.randint(1, 6))) for _ in range(3000)]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    script = client.register_script(
        source("reserve").split("-- Lease up to COUNT", 1)[0]
        + "\nlocal out = {}\nfor i, s in ipairs(ARGV) do out[i] = is_utf8(s) and 1 or 0 end"
        + "\nreturn out"
    )
    verdicts = script(args=samples)

    def python(data: bytes) -> int:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return 0
        return 1

    wrong = [s for s, v in zip(samples, verdicts, strict=True) if v != python(s)]
    assert not wrong, wrong[:10]


@pytestmark_redis
def test_a_worker_refuses_to_start_on_an_engine_without_what_it_reads(
    server: RedisServer, tmp_path: Path
) -> None:
    """``scrapy crawl`` on a Scrapy whose engine lacks an attribute scrapy_dist reads
    (simulated by requiring one more) exits 1 with the error naming the version."""
    (tmp_path / "sitecustomize.py").write_text(
        "import scrapy_dist.worker.engine as engine\n"
        "engine.REQUIRED += (('_slot.renamed_attribute', 'a renamed attribute'),)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    for name in ("SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT"):
        env.pop(name, None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scrapy",
            "crawl",
            "pages",
            "-s",
            f"REDIS_URL={server.url}",
            "-s",
            "MAX_IDLE_TIME_BEFORE_CLOSE=2",
        ],
        cwd=TEST_PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"Scrapy {scrapy.__version__} has no engine._slot.renamed_attribute" in done.stderr
