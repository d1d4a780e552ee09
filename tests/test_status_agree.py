"""``status``, the page and the metrics give the same figures of one crawl: two real
``scrapy crawl`` workers on the session's redis-server, frozen (SIGSTOP) mid-crawl so
Redis holds still, read by the three commands as an operator runs them, and rendered
by the three renderers from one :func:`~scrapy_dist.status.read_status`."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.settings import Settings

from scrapy_dist.cli.status import render_status
from scrapy_dist.config.core import Config
from scrapy_dist.keys import RedisKeys
from scrapy_dist.metrics import CrawlMetrics
from scrapy_dist.status import CrawlLayout, CrawlStatus, read_status
from scrapy_dist.testing.site import TestSite
from scrapy_dist.testing.workers import run_cli, start_workers, stop_workers, wait_ready
from scrapy_dist.web.views import Dashboard

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from scrapy_dist.testing.workers import Worker

pytestmark = [pytest.mark.redis_server, pytest.mark.e2e]

PROJECT = Path(__file__).parent / "project"
HEARTBEAT = 0.5
SETTINGS = {
    "CONCURRENT_REQUESTS": 4,
    "SCHEDULER_HEARTBEAT_INTERVAL": HEARTBEAT,
    # frozen workers stay live (silent) through every read, however slow the machine
    "SCHEDULER_WORKER_TIMEOUT": 300,
    "SCHEDULER_PERSIST": True,
    "STATS_CLASS": "scrapy_dist.stats.RedisStatsCollector",
    "STATS_FLUSH_INTERVAL": 0.3,
}
#: The figures compared, as each reader names them.
FIGURES = ("seeds", "queued", "leased", "dead", "done", "workers", "silent", "registered")


@pytest.fixture
def site() -> Iterator[TestSite]:
    with TestSite(400, delay=0.05) as s:
        yield s


@pytest.fixture
def job_keys(client: redis.Redis, name: str) -> Iterator[RedisKeys]:
    yield RedisKeys.build("pages", job=name)
    for key in client.scan_iter(match=f"pages:{name}:*"):
        client.delete(key)


def from_json(data: dict[str, Any]) -> dict[str, float]:
    """The figures of ``status --json`` or the page's ``/api/summary``."""
    rates = data["rates"] or {}
    return {
        "seeds": data["seeds"]["waiting"],
        "queued": data["queue"]["queued"],
        "leased": data["leased"],
        "dead": data["dead"]["records"],
        "done": data["progress"]["done"],
        "workers": data["workers"]["live"],
        "silent": data["workers"]["silent"],
        "registered": data["workers"]["registered"],
        "rate": rates.get("pages_per_second", math.nan),
        "window": rates.get("window", math.nan),
    }


def from_text(text: str) -> dict[str, float]:
    """The figures of ``status``'s text (its rate rounded to 0.1 pages/s)."""
    rows = dict(re.findall(r"^  (\w+) +(\S+)  ", text, re.MULTILINE))
    registered = re.search(r"live(?:, (\d+) of them silent)? \(of (\d+) registered\)", text)
    window = re.search(r"over the last ([\d.]+) s", text)
    assert registered, text
    assert window, text
    return {
        **{name: float(rows[name]) for name in ("seeds", "queued", "leased", "dead", "done")},
        "workers": float(rows["workers"]),
        "silent": float(registered[1] or 0),
        "registered": float(registered[2]),
        "rate": float(rows["rate"]),
        "window": float(window[1]),
    }


def from_metrics(text: str) -> dict[str, float]:
    """The figures of the Prometheus text."""
    values = {
        name: float(value)
        for name, value in re.findall(r"^scrapy_dist_(\w+)\{[^}]*\} (\S+)$", text, re.MULTILINE)
    }
    return {
        "seeds": values["seeds"],
        "queued": values["queue_depth"],
        "leased": values["leased"],
        "dead": values["dead"],
        "done": values["requests_done"],
        "workers": values["workers"],
        "silent": values["workers_silent"],
        "registered": values["workers_registered"],
        "rate": values["pages_per_second"],
        "window": values["rate_window_seconds"],
    }


def pages_over_window(figures: dict[str, float]) -> float:
    """The pages the rate counts: the same while the workers are frozen (a read later
    divides them by a longer window: the rates differ, their pages do not)."""
    return figures["rate"] * figures["window"]


def test_status_the_page_and_the_metrics_agree_on_one_crawl(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    job_keys: RedisKeys,
    site: TestSite,
    tmp_path: Path,
) -> None:
    settings = {"REDIS_URL": redis_url, "SCHEDULER_JOB_ID": name, **SETTINGS}
    workers: list[Worker] = []
    try:
        workers = start_workers(
            2,
            project_dir=PROJECT,
            spider="pages",
            log_dir=tmp_path,
            settings=settings,
            stats_setting=None,
        )
        wait_ready(workers, 60, marker="joined crawl")
        client.lpush(job_keys.start_urls, site.page_url(0))
        deadline = time.monotonic() + 60
        # under way: pages done, more queued, and at least two stats samples (a rate)
        while not (
            sum(site.hits().values()) >= 40
            and client.zcard(job_keys.timeline) >= 2
            and client.hlen(job_keys.workers) == 2
        ):
            assert time.monotonic() < deadline, "\n".join(w.log_tail(20) for w in workers)
            time.sleep(0.05)
        for w in workers:  # Redis holds still while the three read it
            os.kill(w.pid, signal.SIGSTOP)
        try:
            # every worker silent (two heartbeats missed) before the first read, live
            # until SCHEDULER_WORKER_TIMEOUT (300 s here) after: the same for every read
            beats = [float(b) for b in client.hvals(job_keys.workers)]
            seconds, micros = client.time()
            time.sleep(max(0.0, max(beats) + 2 * HEARTBEAT + 0.5 - (seconds + micros / 1e6)))
            common = ("pages", "--job", name, "--redis-url", redis_url)
            beat = ("-s", f"SCHEDULER_HEARTBEAT_INTERVAL={HEARTBEAT}")
            timeout = ("-s", "SCHEDULER_WORKER_TIMEOUT=300")

            def cli(*args: str) -> str:
                done = run_cli(*beat, *timeout, *args, *common, cwd=PROJECT)
                assert done.returncode == 0, done.stderr
                return done.stdout

            readings = {
                "status --json": from_json(json.loads(cli("status", "--json"))),
                "status": from_text(cli("status")),
                "web --once": from_json(json.loads(cli("web", "--once"))),
                "metrics --once": from_metrics(cli("metrics", "--once")),
            }
            # and the three renderers fed by one read
            config = Config.from_settings(Settings({"REDIS_URL": redis_url, **settings}))
            layout = CrawlLayout.from_config(config, "pages")
            one = read_status(client, layout, config)
            rendered = rendered_from_one_read(client, layout, config, one)
        finally:
            for w in workers:
                os.kill(w.pid, signal.SIGCONT)
    finally:
        stop_workers(workers, timeout=5.0)

    truth = readings["status --json"]
    assert truth["done"] >= 1, readings
    assert truth["queued"] + truth["leased"] >= 1, readings
    assert (truth["workers"], truth["silent"], truth["registered"]) == (2, 2, 2), readings
    for source, figures in readings.items():
        assert {f: figures[f] for f in FIGURES} == {f: truth[f] for f in FIGURES}, source
    # the rates of reads seconds apart: the same pages over windows rounded to 0.1 s
    # (the text's rate also rounded to 0.1 pages/s)
    exact = pages_over_window(truth)
    assert exact > 0
    for source, figures in readings.items():
        slack = 0.05 * (figures["rate"] + truth["rate"]) + 0.05 * figures["window"] + 1e-6
        assert pages_over_window(figures) == pytest.approx(exact, abs=slack), source

    first = rendered["status --json"]
    for source, figures in rendered.items():
        assert figures == pytest.approx(first), source  # rates too: one read
    assert {f: first[f] for f in FIGURES} == {f: truth[f] for f in FIGURES}


def rendered_from_one_read(
    client: redis.Redis, layout: CrawlLayout, config: Config, one: CrawlStatus
) -> dict[str, dict[str, float]]:
    """``status``'s text and JSON, the page's summary and the metrics of one read."""
    dashboard = Dashboard(client, layout, config)
    dashboard._cached = (time.monotonic(), one)  # the page's next summary: this read
    text = from_text(render_status(one))
    rounded = round(json.loads(one.to_json())["rates"]["pages_per_second"], 1)
    assert text["rate"] == rounded
    text["rate"] = one.rates.pages_per_second if one.rates else math.nan
    text["window"] = one.rates.window if one.rates else math.nan
    metrics = CrawlMetrics(layout.keys.crawl, lambda: one)
    metrics.refresh()
    return {
        "status --json": from_json(json.loads(one.to_json())),
        "status": text,
        "web": from_json(json.loads(json.dumps(dashboard.summary(), default=str))),
        "metrics": from_metrics(metrics.render()),
    }
