"""``scrapy-dist web``: its JSON views agree with ``status``, stay bounded on a big crawl,
and its actions are refused unless enabled, authenticated and same-origin (a real
redis-server; the browser tests are in tests/acceptance/test_web_browser.py)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from scrapy import Request
from scrapy.settings import Settings

from scrapy_dist.cli import main
from scrapy_dist.cli.status import render_status
from scrapy_dist.config.core import Config
from scrapy_dist.control import PAUSED, read_log, set_state
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.registry import WorkerRegistry
from scrapy_dist.keys import level_key
from scrapy_dist.scripts import HistoryKeys
from scrapy_dist.slot_queue import SlotQueue
from scrapy_dist.stats import SharedStats
from scrapy_dist.status import CrawlLayout, read_status
from scrapy_dist.stream_admin import create_group
from scrapy_dist.web.server import TOKEN_HEADER, WebServer, check_bind
from scrapy_dist.web.views import GROUP_SAMPLE, Dashboard

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from scrapy_dist.testing import RedisServer

pytestmark = pytest.mark.redis_server

STATIC = Path(__file__).resolve().parents[1] / "scrapy_dist" / "web" / "static"
TOKEN = "t0ken-for-tests"


def _config(redis_url: str) -> Config:
    settings = Settings()
    settings.set("REDIS_URL", redis_url)
    return Config.from_settings(settings)


@pytest.fixture
def dashboard(client: redis.Redis, redis_url: str, name: str) -> Dashboard:
    config = _config(redis_url)
    return Dashboard(client, CrawlLayout.from_config(config, name), config)


def _dead(client: redis.Redis, dashboard: Dashboard, count: int, reason: str = "bad seed") -> None:
    letters = DeadLetters(client, dashboard.layout.keys.dead, "w1")
    with client.pipeline(transaction=False) as pipe:
        for i in range(count):
            letters.add("seed", f"{reason}: #{i} " + "x" * 60, f"https://example.com/{i}", pipe)
        pipe.execute()


def test_summary_agrees_with_status(client: redis.Redis, dashboard: Dashboard) -> None:
    layout = dashboard.layout
    client.lpush(layout.seeds, "https://example.com/a", "https://example.com/b")
    _dead(client, dashboard, 3)
    summary = dashboard.summary()
    status = read_status(client, layout, dashboard.config).as_dict()
    for name in ("seeds", "queue", "leased", "dead", "progress", "items"):
        assert summary[name] == status[name]
    assert summary["answer"]["state"] == "lost"  # work waits, no worker alive
    assert summary["answer"]["lost"] == "3 dead letter(s): not crawled, kept to requeue."
    client.delete(layout.keys.dead)
    assert dashboard.status(fresh=True).dead == 0
    assert dashboard.summary()["answer"]["lost"] == "Nothing lost."


def test_answer_absent_waiting_and_paused(client: redis.Redis, dashboard: Dashboard) -> None:
    assert dashboard.summary()["answer"]["state"] == "absent"
    client.hset(dashboard.layout.keys.workers, "w1", str(time.time()))
    dashboard.status(fresh=True)
    summary = dashboard.summary()
    assert summary["answer"]["state"] == "idle"
    assert "Waiting for seeds" in summary["answer"]["words"]
    assert any("No seeds" in hint for hint in summary["hints"])
    set_state(client, dashboard.layout.keys, PAUSED, by="me", reason="maintenance")
    dashboard.status(fresh=True)
    assert dashboard.summary()["answer"]["state"] == "paused"


def test_workers_page_of_a_thousand_with_a_silent_one(
    client: redis.Redis, dashboard: Dashboard
) -> None:
    keys = dashboard.layout.keys
    now = float(client.time()[0])
    with client.pipeline(transaction=False) as pipe:
        for i in range(1000):
            pipe.hset(keys.workers, f"w{i:04d}", now)
            pipe.hset(keys.worker_figures, f"w{i:04d}", f"{int(now)} {i} {2 * i} 1")
        pipe.hset(keys.workers, "w0000", now - 20)  # silent: no heartbeat for 20 s
        pipe.hset(keys.holding("w0000"), mapping={"l1": "x", "l2": "y"})
        pipe.zadd(keys.holders, {"w0000": now + 100})
        pipe.execute()
    started = time.monotonic()
    page = dashboard.workers(0, 100)
    assert time.monotonic() - started < 1.0
    assert page["total"] == 1000
    assert len(page["workers"]) == 100
    first = page["workers"][0]
    assert first["id"] == "w0000"
    assert first["silent"]
    assert first["leases"] == 2
    assert 95 <= first["leases_return_in"] <= 100
    second = page["workers"][1]
    assert (second["pages"], second["items"], second["buffered"]) == (1, 2, 1)
    assert not second["silent"]
    assert second["leases_return_in"] is None
    assert dashboard.workers(900, 500)["workers"][-1]["id"] == "w0999"


def test_dead_letters_paged_and_grouped_among_100000(
    client: redis.Redis, dashboard: Dashboard
) -> None:
    _dead(client, dashboard, 100_000)
    started = time.monotonic()
    page = dashboard.dead(99_990, 50)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"{elapsed:.2f} s for a page of dead letters"
    assert page["total"] == 100_000
    assert [r["index"] for r in page["records"]] == list(range(99_990, 100_000))
    assert page["records"][0]["url"] == "https://example.com/99990"
    assert page["groups"] == [{"reason": "bad seed: ## " + "x" * 60, "count": GROUP_SAMPLE}]
    assert page["sampled"] == GROUP_SAMPLE


def test_history_written_by_heartbeats(client: redis.Redis, dashboard: Dashboard) -> None:
    keys = dashboard.layout.keys
    history = HistoryKeys.of(keys, dashboard.layout.queue_kind)
    registry = WorkerRegistry(
        client,
        keys.workers,
        "w1",
        timeout=30,
        frontier=[],
        progress=keys.progress,
        starts=keys.starts,
        history=history,
    )
    client.hset(keys.stats, mapping={"response_received_count": 10, "item_scraped_count": 4})
    _dead(client, dashboard, 2)
    registry.heartbeat((7, 3, 1))
    registry.heartbeat((8, 3, 1))  # within the step: no second sample
    assert client.llen(keys.history) == 1
    figures = client.hget(keys.worker_figures, "w1")
    assert isinstance(figures, bytes)
    assert figures.split()[1:] == [b"8", b"3", b"1"]
    # an older sample, 10 s before: rates come from the two
    (sample,) = client.lrange(keys.history, 0, 0)
    second, *rest = sample.split()
    client.rpush(keys.history, b" ".join([str(int(second) - 10).encode(), b"0", b"0", *rest[2:]]))
    samples = dashboard.history()["samples"]
    assert [s["pages"] for s in samples] == [0, 10]
    assert samples[-1]["pages_per_second"] == 1.0
    assert samples[-1]["items_per_second"] == 0.4
    assert samples[-1]["dead"] == 2


def test_history_is_capped_and_skips_a_key_of_another_type(
    client: redis.Redis, dashboard: Dashboard
) -> None:
    keys = dashboard.layout.keys
    small = HistoryKeys.of(keys, dashboard.layout.queue_kind)
    small = HistoryKeys(**{**small.__dict__, "step": 0, "size": 3})
    registry = WorkerRegistry(
        client, keys.workers, "w1", timeout=30, frontier=[], progress=keys.progress,
        starts=keys.starts, history=small,
    )  # fmt: skip
    for _ in range(5):
        registry.heartbeat()
    assert client.llen(keys.history) == 3
    client.delete(keys.history)
    client.set(keys.history, "garbage")
    registry.heartbeat()  # the heartbeat itself is written whatever the history holds
    assert client.hexists(keys.workers, "w1")
    assert client.get(keys.history) == b"garbage"


def test_control_audit_trail(client: redis.Redis, dashboard: Dashboard) -> None:
    dashboard.set_control("paused", "deploy", "me")
    dashboard.set_control("running", "", "me")
    log = read_log(client, dashboard.layout.keys)
    assert [(e["from"], e["state"]) for e in log] == [("paused", "running"), ("running", "paused")]
    assert log[1]["reason"] == "deploy"
    assert dashboard.control()["state"]["state"] == "running"


def test_frontier_by_priority(client: redis.Redis, dashboard: Dashboard) -> None:
    layout = dashboard.layout
    keys = layout.keys
    queue = layout.queue_cls(client, keys.requests, keys.seq)
    queue.open(list)
    queue.push([(f"r{i}".encode(), -float(priority), b"") for i, priority in enumerate((0, 5, 5))])
    frontier = dashboard.frontier()
    assert frontier["queue"]["queued"] == 3
    assert frontier["levels"] == [{"priority": 5, "queued": 2}, {"priority": 0, "queued": 1}]


def test_frontier_shows_the_oldest_entry_of_the_most_and_least_urgent_levels(
    client: redis.Redis, dashboard: Dashboard
) -> None:
    layout = dashboard.layout
    keys = layout.keys
    queue = layout.queue_cls(client, keys.requests, keys.seq)
    queue.open(list)
    assert dashboard.frontier()["oldest"] == []
    for url, priority in (("low-1", 0), ("top-1", 5), ("low-2", 0), ("mid", 3), ("top-2", 5)):
        payload = json.dumps({"url": f"https://example.com/{url}"}).encode()
        queue.push([(payload, -float(priority), b"")])
    queue.push([(b"\x80not json", -1.0, b"")])
    oldest = dashboard.frontier()["oldest"]
    assert [(o["priority"], o["url"]) for o in oldest] == [
        (5, "https://example.com/top-1"),  # the next one a reserve takes
        (0, "https://example.com/low-1"),  # the one waiting longest
    ]
    assert all(len(o["id"]) == 16 and o["raw"] is None for o in oldest)
    # a level deleted behind the index's back (by hand): shown without it
    [least] = cast("list[bytes]", client.zrange(keys.request_levels, -1, -1))
    client.delete(level_key(keys.requests, least.decode()))
    oldest = dashboard.frontier()["oldest"]
    assert [o["url"] for o in oldest] == ["https://example.com/top-1"]


def test_frontier_oldest_is_bounded_on_a_big_queue(
    client: redis.Redis, dashboard: Dashboard
) -> None:
    layout = dashboard.layout
    keys = layout.keys
    queue = layout.queue_cls(client, keys.requests, keys.seq)
    queue.open(list)
    for start in range(0, 100_000, 10_000):
        queue.push([(b"x" * 20, 0.0, b"") for _ in range(start, start + 10_000)])
    started = time.monotonic()
    oldest = dashboard.frontier()["oldest"]
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"{elapsed:.2f} s for the frontier of 100,000 queued"
    assert [o["raw"] for o in oldest] == ["x" * 20]


def test_redis_view_memory_refusals_and_stream_lag(
    client: redis.Redis, dashboard: Dashboard
) -> None:
    layout = dashboard.layout
    view = dashboard.server()
    memory = view["memory"]
    assert memory["error"] is None
    assert memory["used"] > 0
    assert memory["policy"] == "noeviction"
    assert memory["warning"] is None
    assert (view["stats_shared"], view["refusals"], view["item_stream"]) == (False, {}, None)

    SharedStats(client, layout.keys.stats, layout.keys.timeline).apply(
        [
            ("inc", "response_received_count", "10", "0"),
            ("inc", "scheduler/redis/refused/OOM", "3", "0"),
            ("inc", "scheduler/leases/children_refused", "2", "0"),
        ]
    )
    stream = layout.items_stream
    for i in range(5):
        client.xadd(stream, {"item": f"{i}"})
    assert create_group(client, stream, "export", "0")
    client.xreadgroup("export", "c1", {stream: ">"}, count=2)
    dashboard.status(fresh=True)
    view = dashboard.server()
    assert view["stats_shared"] is True
    assert view["refusals"] == {
        "scheduler/leases/children_refused": 2,
        "scheduler/redis/refused/OOM": 3,
    }
    [group] = view["item_stream"]["groups"]
    assert (group["name"], group["lag"], group["pending"]) == ("export", 3, 2)


def test_redis_view_warns_of_a_policy_that_evicts_the_crawls_keys(server: RedisServer) -> None:
    config = _config(server.url)
    with server.client() as own:
        dashboard = Dashboard(own, CrawlLayout.from_config(config, "evicted"), config)
        own.config_set("maxmemory", "1gb")
        own.config_set("maxmemory-policy", "allkeys-lru")
        memory = dashboard.server()["memory"]
        assert memory["max"] == 1 << 30
        assert 0 < memory["fill"] < 1
        assert memory["warning"] == (
            "maxmemory-policy allkeys-lru: at maxmemory it evicts frontier keys (queue, "
            "leases, dupefilter) and requests are lost or crawled again"
        )
        own.config_set("maxmemory-policy", "volatile-lru")  # no key of the crawl expires
        assert dashboard.server()["memory"]["warning"] is None


# -- the server --------------------------------------------------------------------------


@pytest.fixture
def served(dashboard: Dashboard) -> Iterator[WebServer]:
    server = WebServer(dashboard, actions=True, token=TOKEN)
    server.start()
    yield server
    server.stop()


def _call(
    server: WebServer,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url.rstrip("/") + path, data=data)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()) if "json" in answer.headers[
                "Content-Type"
            ] else answer.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_every_view_has_a_json_twin(served: WebServer, dashboard: Dashboard) -> None:
    views = ("summary", "workers", "frontier", "redis", "dead", "history", "control", "config")
    for view in views:
        code, value = _call(served, f"/api/{view}")
        assert code == 200, (view, value)
    code, page = _call(served, "/")
    assert code == 200
    assert b"/static/app.js" in page
    assert _call(served, "/static/../setup.cfg")[0] == 404
    assert _call(served, "/api/nothing")[0] == 404


def test_actions_need_the_token_json_and_the_same_origin(
    served: WebServer, client: redis.Redis, dashboard: Dashboard
) -> None:
    _dead(client, dashboard, 4)
    token = {TOKEN_HEADER: TOKEN}
    assert _call(served, "/api/dead/requeue", {"all": True})[0] == 403  # no token
    assert _call(served, "/api/dead/requeue", {"all": True}, {TOKEN_HEADER: "nope"})[0] == 403
    evil = {**token, "Origin": "http://evil.example"}
    assert _call(served, "/api/dead/requeue", {"all": True}, evil)[0] == 403
    rebinding = {**token, "Host": "evil.example:80"}
    assert _call(served, "/api/dead/requeue", {"all": True}, rebinding)[0] == 421
    form = {**token, "Content-Type": "text/plain"}
    request = urllib.request.Request(
        served.url + "api/dead/requeue", data=b'{"all": true}', headers=form
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 415
    assert client.llen(dashboard.layout.keys.dead) == 4
    same = {**token, "Origin": served.url.rstrip("/")}
    code, done = _call(served, "/api/dead/requeue", {"indexes": [0]}, same)
    assert (code, done["seeds"], done["left"]) == (200, 1, 3)
    code, purge = _call(served, "/api/dead/purge", {"count": 99}, token)
    assert code == 200
    assert purge["refused"]
    assert client.llen(dashboard.layout.keys.dead) == 3
    code, done = _call(served, "/api/dead/requeue", {"all": True}, token)
    assert (code, done["seeds"], done["left"]) == (200, 3, 0)
    assert client.llen(dashboard.layout.seeds) == 4
    code, changed = _call(served, "/api/control", {"state": "paused", "reason": "<b>x</b>"}, token)
    assert (code, changed["state"]["state"], changed["state"]["reason"]) == (
        200,
        PAUSED,
        "<b>x</b>",
    )
    assert _call(served, "/api/control", {"state": "stopped"}, token)[0] == 400


def test_read_only_refuses_every_action(dashboard: Dashboard) -> None:
    server = WebServer(dashboard)
    server.start()
    try:
        code, answer = _call(server, "/api/control", {"state": "paused"}, {TOKEN_HEADER: ""})
        assert code == 403
        assert "read-only" in answer["error"]
        assert _call(server, "/api/summary")[0] == 200
    finally:
        server.stop()


def test_basic_auth_guards_every_request(dashboard: Dashboard) -> None:
    server = WebServer(dashboard, actions=True, token=TOKEN, auth="ann:secret")
    server.start()
    try:
        assert _call(server, "/api/summary")[0] == 401
        good = "Basic " + base64.b64encode(b"ann:secret").decode()
        assert _call(server, "/api/summary", headers={"Authorization": good})[0] == 200
        headers = {"Authorization": good, TOKEN_HEADER: TOKEN}
        assert _call(server, "/api/control", {"state": "paused"}, headers)[0] == 200
    finally:
        server.stop()


def test_actions_on_a_public_address_need_auth() -> None:
    with pytest.raises(ConfigurationError, match="--auth"):
        check_bind("0.0.0.0", actions=True, auth=None)
    check_bind("0.0.0.0", actions=False, auth=None)  # read-only: allowed
    check_bind("0.0.0.0", actions=True, auth="a:b")
    check_bind("::1", actions=True, auth=None)


def test_the_page_never_writes_data_as_html() -> None:
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    assert "innerHTML" not in script
    assert "insertAdjacentHTML" not in script
    assert "document.write" not in script
    assert "http://" not in script.replace("http://www.w3.org/2000/svg", "")  # no CDN
    assert "https://" not in script + (STATIC / "index.html").read_text(encoding="utf-8")


def test_cli_once_prints_the_summary(
    redis_url: str, name: str, client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    client.lpush(f"{name}:start_urls", "https://example.com/")
    assert main(["web", name, "--redis-url", redis_url, "--once"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seeds"]["waiting"] == 1
    assert summary["answer"]["state"] == "lost"


def test_cli_refuses_actions_on_a_public_address(
    redis_url: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["web", name, "--redis-url", redis_url, "--host", "0.0.0.0", "--actions"])
    assert code == 2
    assert "--auth" in capsys.readouterr().err


def test_frontier_shows_the_busiest_download_slots_and_their_pauses(
    client: redis.Redis, dashboard: Dashboard
) -> None:
    keys = dashboard.layout.keys
    client.zadd(keys.slot_sent, {"a.example": 7, "b.example": 2})
    client.hset(keys.slot_counts, mapping={"pages:a.example": 6, "5xx:a.example": 2})
    seconds, _ = client.time()
    client.zadd(keys.slot_pauses, {"a.example": (seconds + 30) * 1000})
    slots = dashboard.frontier()["slots"]
    assert slots["counted"] == 2
    assert slots["busiest"][0] == {
        "slot": "a.example",
        "sent": 7,
        "pages": 6,
        "4xx": 0,
        "5xx": 2,
        "failed": 0,
        "started": 0,
    }
    assert [s["slot"] for s in slots["busiest"]] == ["a.example", "b.example"]
    assert 28 < slots["paused"]["a.example"] <= 30


@pytest.fixture
def slots_dashboard(client: redis.Redis, redis_url: str, name: str) -> Dashboard:
    """The dashboard of a crawl whose settings name the queue per slot."""
    settings = Settings()
    settings.set("REDIS_URL", redis_url)
    settings.set("SCHEDULER_QUEUE_CLASS", "scrapy_dist.slot_queue.SlotQueue")
    config = Config.from_settings(settings)
    return Dashboard(client, CrawlLayout.from_config(config, name), config)


def test_frontier_of_a_queue_per_slot_shows_its_slots_and_the_next_entry(
    client: redis.Redis, slots_dashboard: Dashboard
) -> None:
    dashboard = slots_dashboard
    keys = dashboard.layout.keys
    queue = SlotQueue(client, keys.requests, keys.seq)
    queue.open()
    for url, priority in (("a.com/1", 0), ("b.com/1", 4), ("a.com/2", 0)):
        payload = json.dumps({"url": f"https://{url}"}).encode()
        request = Request(f"https://{url}", priority=priority)
        queue.push([(payload, queue.score(request), b"")])
    frontier = dashboard.frontier()
    assert frontier["queue"]["queued"] == 3
    assert frontier["queue_slots"] == {
        "ready": 2,
        "waiting": 0,
        "listed": [
            {"slot": "b.com", "queued": 1, "ready_in": 0.0},
            {"slot": "a.com", "queued": 2, "ready_in": 0.0},
        ],
    }
    assert [(o["priority"], o["url"]) for o in frontier["oldest"]] == [(4, "https://b.com/1")]
    text = render_status(dashboard.status())
    assert "queue slots: 2 ready, 0 waiting" in text
    assert "    a.com: 2 queued, ready" in text


def test_status_counts_the_queue_redis_holds_when_the_settings_changed_class(
    client: redis.Redis, slots_dashboard: Dashboard
) -> None:
    """The settings name SlotQueue, the crawl's queue is still a priority queue (no
    worker has opened it since): status counts it as the priority queue it is."""
    from scrapy_dist.queue import PriorityQueue

    keys = slots_dashboard.layout.keys
    queue = PriorityQueue(client, keys.requests, keys.seq)
    queue.push([(b"r1", 0.0, b""), (b"r2", -3.0, b"")])
    status = slots_dashboard.status(fresh=True)
    assert (status.queue_kind, status.queued, status.queue_slots) == ("levels", 2, None)


def test_status_names_a_slot_without_host_and_a_paused_one(
    client: redis.Redis, slots_dashboard: Dashboard
) -> None:
    dashboard = slots_dashboard
    keys = dashboard.layout.keys
    queue = SlotQueue(client, keys.requests, keys.seq)
    for url, slot in (("https://a.com/1", "a|b"), ("https://x/1", "")):
        request = Request(url, meta={"download_slot": slot})
        queue.push([(b"{}", queue.score(request), b"")])
    seconds, micros = client.time()
    client.zadd(keys.slot_pauses, {"a|b": (seconds + micros / 1e6 + 60) * 1000})
    text = render_status(dashboard.status())
    assert "    (no host): 1 queued, ready" in text
    assert "    a|b: 1 queued, paused, ready" in text
