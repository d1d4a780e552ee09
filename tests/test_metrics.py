"""Prometheus metrics: the text format, the CLI exporter, and a worker serving /metrics."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_dist.cli import main
from scrapy_dist.keys import RedisKeys
from scrapy_dist.metrics import MetricsServer, gauges, prometheus_text
from scrapy_dist.stats import SharedStats
from scrapy_dist.testing.redis_server import free_port
from scrapy_dist.testing.workers import start_workers, stop_workers

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

PROJECT = Path(__file__).parent / "project"


def parse(text: str) -> dict[str, float]:
    """``metric name -> value`` of an exposition with one ``crawl`` label per sample."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = re.fullmatch(r'(\w+)\{crawl="(?:[^"\\]|\\.)*"\} (\S+)', line)
            assert match, line
            values[match[1]] = float(match[2])
    return values


@pytest.mark.parametrize(
    ("host", "port"), [("127.0.0.1", 65536), ("127.0.0.1", -1), ("bad\x00host", 0)]
)
def test_an_address_that_is_none_is_refused_as_oserror(host: str, port: int) -> None:
    """A port out of range raised OverflowError, a host with a NUL TypeError: neither the
    CLI nor the extension (which logs an OSError and goes on without metrics) expected
    them, so both ended in a traceback."""
    with pytest.raises(OSError, match="not an address to listen on"):
        MetricsServer(host, port, str)


def test_exposition_format() -> None:
    text = prometheus_text(
        'we"ird\\crawl',
        {"scrapy_dist_queue_depth": 3, "scrapy_dist_bloom_fill": 0.25},
        {"scrapy_dist_worker_pages_total": ("Pages.", 7.0)},
    )
    assert text.splitlines() == [
        "# HELP scrapy_dist_queue_depth Requests waiting in the crawl's shared queue.",
        "# TYPE scrapy_dist_queue_depth gauge",
        'scrapy_dist_queue_depth{crawl="we\\"ird\\\\crawl"} 3',
        "# HELP scrapy_dist_bloom_fill Bloom dupefilter fingerprints divided by its capacity.",
        "# TYPE scrapy_dist_bloom_fill gauge",
        'scrapy_dist_bloom_fill{crawl="we\\"ird\\\\crawl"} 0.25',
        "# HELP scrapy_dist_worker_pages_total Pages.",
        "# TYPE scrapy_dist_worker_pages_total counter",
        'scrapy_dist_worker_pages_total{crawl="we\\"ird\\\\crawl"} 7',
    ]
    assert gauges(None) == {"scrapy_dist_up": 0}


def fill(client: redis.Redis, keys: RedisKeys) -> None:
    client.zadd(keys.requests, {b"0000000000000001a": 0, b"0000000000000002b": 0})
    client.rpush(keys.start_urls, "https://a.example/")
    client.rpush(keys.dead, json.dumps({"kind": "seed", "data": "x"}), "{}")
    # two leases of a worker, and one of a previous version's layout: all counted
    client.zadd(keys.holders, {"w": time.time() + 60})
    client.hset(
        keys.holding("w"), mapping={"0000000000000003": "q|0|c", "0000000000000004": "q|0|d"}
    )
    client.zadd(keys.leases, {"0000000000000005": time.time() + 60})
    client.sadd(keys.dupefilter, b"f1", b"f2", b"f3")
    client.rpush(keys.items, "{}")
    SharedStats(client, keys.stats, keys.timeline).apply(
        [
            ("inc", "response_received_count", "120", "0"),
            ("inc", "item_scraped_count", "60", "0"),
        ]
    )


def test_cli_prints_the_crawls_metrics(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    fill(client, RedisKeys.build(name))
    assert main(["metrics", name, "--once", "--redis-url", redis_url]) == 0
    values = parse(capsys.readouterr().out)
    # one stats sample just written: 120 pages over the first flush interval and since
    pages, items = (
        values.pop("scrapy_dist_pages_per_second"),
        values.pop("scrapy_dist_items_per_second"),
    )
    assert 0 < pages <= 120
    assert items == pytest.approx(pages / 2)
    assert 0 < values.pop("scrapy_dist_rate_window_seconds") <= 60
    assert values == {
        "scrapy_dist_up": 1,
        "scrapy_dist_queue_depth": 2,
        "scrapy_dist_seeds": 1,
        "scrapy_dist_leased": 3,
        "scrapy_dist_dead": 2,
        "scrapy_dist_workers": 0,
        "scrapy_dist_workers_silent": 0,
        "scrapy_dist_workers_registered": 0,
        "scrapy_dist_requests_done": 0,
        "scrapy_dist_items_stored": 1,
        "scrapy_dist_slots_paused": 0,
        "scrapy_dist_slots_counted": 0,
        "scrapy_dist_queue_slots_ready": 0,
        "scrapy_dist_queue_slots_waiting": 0,
        "scrapy_dist_dupefilter_size": 3,
        "scrapy_dist_control_state": 0,
    }


@pytest.fixture
def job_keys(client: redis.Redis, name: str) -> Iterator[RedisKeys]:
    yield RedisKeys.build("pages", job=name)
    for key in client.scan_iter(match=f"pages:{name}:*"):
        client.delete(key)


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", ""


@pytest.mark.e2e
def test_a_worker_serves_metrics_over_http(
    redis_url: str, client: redis.Redis, name: str, job_keys: RedisKeys, tmp_path: Path
) -> None:
    port = free_port()
    client.rpush(job_keys.dead, "{}", "{}", "{}")
    client.sadd(job_keys.dupefilter, b"a", b"b")
    settings: dict[str, Any] = {
        "REDIS_URL": redis_url,
        "SCHEDULER_JOB_ID": name,
        "EXTENSIONS": json.dumps({"scrapy_dist.metrics.PrometheusMetrics": 500}),
        "METRICS_ENABLED": True,
        "METRICS_PORT": port,
        "METRICS_INTERVAL": 0.2,
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_WORKER_TIMEOUT": 5,
        "SCHEDULER_LEASE_TIMEOUT": 2,
    }
    workers = start_workers(
        1,
        project_dir=PROJECT,
        spider="pages",
        log_dir=tmp_path,
        settings=settings,
        stats_setting=None,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 60
        values: dict[str, float] = {}
        while values.get("scrapy_dist_workers") != 1:
            assert time.monotonic() < deadline, workers[0].log_tail()
            assert workers[0].returncode is None, workers[0].log_tail()
            time.sleep(0.2)
            try:
                status, content_type, text = fetch(url)
            except OSError:
                continue  # not listening yet
            assert status == 200
            assert content_type.startswith("text/plain; version=0.0.4")
            values = parse(text)
        assert values["scrapy_dist_up"] == 1
        assert values["scrapy_dist_dead"] == 3
        assert values["scrapy_dist_dupefilter_size"] == 2
        assert values["scrapy_dist_queue_depth"] == 0
        assert values["scrapy_dist_worker_pages_total"] == 0
        assert fetch(f"http://127.0.0.1:{port}/other")[0] == 404
        workers[0].process.send_signal(signal.SIGTERM)
        assert workers[0].process.wait(30) == 0
    finally:
        stop_workers(workers, timeout=5)
