"""Tests of the utilities in ``scrapy_dist.testing``: RedisServer, TestSite, workers."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_dist.testing import redis_server
from scrapy_dist.testing import site as site_module
from scrapy_dist.testing.queues import push_raw, queued_count, queued_entries
from scrapy_dist.testing.redis_server import RedisServer, free_port
from scrapy_dist.testing.server_kinds import RedisServerNotFound, find_redis_server
from scrapy_dist.testing.site import TestSite, bfs, links
from scrapy_dist.testing.workers import worker_command

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no init has reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _get(site: TestSite, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(200) as running:
        yield running


# RedisServer


def test_find_redis_server_prefers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_SERVER", "/opt/custom/redis-server")
    assert find_redis_server() == "/opt/custom/redis-server"


def test_find_redis_server_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RedisServerNotFound, match="apt-get install redis-server"):
        find_redis_server()
    assert issubclass(RedisServerNotFound, RuntimeError)


def test_refuses_port_6379() -> None:
    with pytest.raises(ValueError, match="6379"):
        RedisServer(binary="redis-server", port=6379)


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert port != 6379
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.redis_server
def test_redis_server_start_ping_stop() -> None:
    server = RedisServer()
    with pytest.raises(RuntimeError, match="start"):
        _ = server.url
    server.start()
    try:
        pid = server.pid
        assert pid is not None
        assert server.port != 6379
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        directory = server.directory
        assert directory.is_dir()
        with redis.Redis.from_url(server.url) as client:
            assert client.ping() is True
            assert client.info("server")["process_id"] == pid
        assert server.start() is server  # already running: no-op
        assert server.pid == pid
    finally:
        server.stop()
    assert server.pid is None
    assert not _alive(pid)
    assert not directory.exists()
    server.stop()  # idempotent


@pytest.mark.redis_server
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_redis_server_dies_with_a_session_killed_by_sigkill() -> None:
    # a test session killed with SIGKILL runs no cleanup: its servers must not outlive it
    session = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from scrapy_dist.testing.redis_server import RedisServer\n"
            "server = RedisServer().start()\n"
            "print(server.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert session.stdout is not None
        pid = int(session.stdout.readline())
        assert _alive(pid)
    finally:
        session.kill()
        session.wait()
    deadline = time.monotonic() + 30
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    running = _running(pid)
    if running:
        os.kill(pid, signal.SIGKILL)
    assert not running, f"redis-server {pid} outlived the session killed with SIGKILL"


@pytest.mark.redis_server
def test_redis_server_kill_and_restart_keeps_aof_data(tmp_path: Path) -> None:
    with RedisServer(appendonly=True, directory=tmp_path) as server:
        port = server.port
        with server.client() as client:
            client.set("survivor", "yes")
            client.rpush("queue", "a", "b")
        old_pid = server.pid
        assert old_pid is not None
        server.kill()
        assert server.pid is None
        assert not _alive(old_pid)
        server.restart()
        assert server.port == port
        assert server.pid not in (None, old_pid)
        with server.client(decode_responses=True) as client:
            assert client.get("survivor") == "yes"
            assert client.lrange("queue", 0, -1) == ["a", "b"]
    assert tmp_path.is_dir()  # a directory given by the caller is kept
    assert (tmp_path / "redis.log").exists()


@pytest.mark.redis_server
def test_redis_server_fixed_port_in_use_fails_with_log() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        server = RedisServer(port=blocker.getsockname()[1])
        with pytest.raises(RuntimeError, match="port in use"):
            server.start(timeout=5)
        server.stop()


@pytest.mark.redis_server
def test_redis_server_retries_another_port_when_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        ports = iter([taken, free_port()])
        monkeypatch.setattr(redis_server, "free_port", lambda: next(ports))
        with RedisServer() as server:
            assert server.port != taken
            with server.client() as client:
                assert client.ping() is True


@pytest.mark.redis_server
def test_redis_server_bad_argument_raises_with_log_tail() -> None:
    server = RedisServer(extra_args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError, match="exited"):
        server.start(timeout=5)
    server.stop()


# The link graph


@pytest.mark.parametrize("pages", [1, 2, 3, 10, 1000])
def test_links_stay_in_range_and_are_deterministic(pages: int) -> None:
    for i in range(pages):
        outgoing = links(i, pages)
        assert outgoing == links(i, pages)
        assert all(0 < j < pages for j in outgoing)  # none back to page 0, the seed
        if pages > 1:
            assert len(outgoing) > len(set(outgoing))  # one link at least is repeated


def test_links_shape() -> None:
    outgoing = links(10, 1000)
    assert outgoing[:4] == [1, 11, 21, 22]
    assert len(outgoing) == 10


def test_links_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="page"):
        links(5, 5)
    with pytest.raises(ValueError, match="at least one"):
        links(0, 0)


@pytest.mark.parametrize("pages", [1, 7, 1500])
def test_every_page_reachable_from_page_zero(pages: int) -> None:
    assert bfs(0, pages) == set(range(pages))
    assert TestSite(pages).expected_paths() == {f"/page/{i}" for i in range(pages)}


# TestSite


def test_site_serves_pages_with_their_links(fresh_site: TestSite) -> None:
    status, body = _get(fresh_site, "/page/7")
    assert status == 200
    html = body.decode()
    assert "<title>Page 7</title>" in html
    assert "<h1>Page 7</h1>" in html
    assert [int(j) for j in re.findall(r'href="/page/(\d+)"', html)] == links(7, 200)
    assert fresh_site.page_url(7) == f"{fresh_site.url}/page/7"
    assert fresh_site.url == f"http://127.0.0.1:{fresh_site.port}"


def test_site_counts_hits(fresh_site: TestSite) -> None:
    for path in ["/page/0", "/page/3", "/page/3", "/page/199", "/__hits", "/nope"]:
        _get(fresh_site, path)
    assert fresh_site.hits() == {"/page/0": 1, "/page/3": 2, "/page/199": 1}
    first, last = fresh_site.first_hit_time(), fresh_site.last_hit_time()
    assert first is not None
    assert last is not None
    assert first <= last <= time.time()
    fresh_site.reset_hits()
    assert fresh_site.hits() == {}
    assert fresh_site.first_hit_time() is None
    assert fresh_site.last_hit_time() is None


def test_site_hits_endpoints(fresh_site: TestSite) -> None:
    _get(fresh_site, "/page/5")
    _get(fresh_site, "/page/5?x=1")
    status, body = _get(fresh_site, "/__hits")
    assert status == 200
    assert json.loads(body) == {"/page/5": 2}
    status, _ = _get(fresh_site, "/__reset")
    assert status == 200
    assert json.loads(_get(fresh_site, "/__hits")[1]) == {}


@pytest.mark.parametrize("path", ["/page/200", "/page/9999", "/page/x", "/page/01", "/", "/a"])
def test_site_404(fresh_site: TestSite, path: str) -> None:
    status, _ = _get(fresh_site, path)
    assert status == 404


def test_site_keep_alive_and_pipelining(fresh_site: TestSite) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", fresh_site.port, timeout=5)
    for i in range(50):
        connection.request("GET", f"/page/{i}")
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Connection") == "keep-alive"
        response.read()
    connection.close()
    requests = b"".join(b"GET /page/%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(20))
    requests += b"GET /page/0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", fresh_site.port), timeout=5) as sock:
        sock.sendall(requests)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 21
    assert fresh_site.hits()["/page/0"] == 3


def test_site_is_fast(fresh_site: TestSite) -> None:
    count = 2000
    connection = http.client.HTTPConnection("127.0.0.1", fresh_site.port, timeout=5)
    started = time.perf_counter()
    for i in range(count):
        connection.request("GET", f"/page/{i % 200}")
        connection.getresponse().read()
    elapsed = time.perf_counter() - started
    connection.close()
    assert sum(fresh_site.hits().values()) == count
    assert count / elapsed > 1000, f"{count / elapsed:.0f} requests/s"


def test_site_delay_does_not_block_other_connections() -> None:
    with TestSite(10, delay=0.3) as slow:
        results: list[int] = []

        def fetch(i: int) -> None:
            results.append(_get(slow, f"/page/{i}")[0])

        started = time.perf_counter()
        threads = [threading.Thread(target=fetch, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        assert results == [200] * 8
        assert 0.3 <= elapsed < 1.5
        assert sum(slow.hits().values()) == 8


def test_site_stop_is_idempotent_and_frees_port() -> None:
    running = TestSite(5).start()
    port = running.port
    with pytest.raises(RuntimeError, match="already"):
        running.start()
    running.stop()
    running.stop()
    with pytest.raises(RuntimeError, match="not started"):
        _ = running.url
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_site_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        TestSite(0)
    with pytest.raises(ValueError, match="delay"):
        TestSite(5, delay=-1)


def test_site_subprocess_prints_listening_line() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", site_module.__name__, "--pages", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.fullmatch(r"listening on http://127\.0\.0\.1:(\d+)\n", line)
        assert match, line
        port = int(match.group(1))
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/page/29")
        assert connection.getresponse().read().count(b"<h1>Page 29</h1>") == 1
        connection.request("GET", "/__hits")
        assert json.loads(connection.getresponse().read()) == {"/page/29": 1}
        connection.close()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=10)
        assert process.returncode == 0
        assert stdout == ""
        assert "Traceback" not in stderr
        assert "RuntimeWarning" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


# Workers


def test_worker_command() -> None:
    command = worker_command(
        "pages",
        settings={"REDIS_URL": "redis://x", "SCHEDULER_PERSIST": True},
        spider_args={"a": 1},
    )
    assert command == [
        sys.executable,
        "-m",
        "scrapy",
        "crawl",
        "pages",
        "-s",
        "REDIS_URL=redis://x",
        "-s",
        "SCHEDULER_PERSIST=True",
        "-a",
        "a=1",
    ]


@pytest.mark.redis_server
def test_queued_count_counts_every_layout_without_reading_entries(client: redis.Redis) -> None:
    # what the demo prints as "requests queued": a priority queue's levels, a list, and
    # a previous version's zset still at the key, counted as queued_entries reads them
    push_raw(client, "q:requests", {b"a": -1.0, b"b": -1.0, b"c": 0.0, b"d": 5.0})
    assert queued_count(client, "q:requests") == len(queued_entries(client, "q:requests")) == 4
    client.rpush("l:requests", b"x", b"y")
    assert queued_count(client, "l:requests") == 2
    client.zadd("z:requests", {b"old1": 0.0, b"old2": 1.0})
    assert queued_count(client, "z:requests") == len(queued_entries(client, "z:requests")) == 2
    assert queued_count(client, "none:requests") == 0
