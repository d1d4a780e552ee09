"""Redis behind Sentinel, from the user's side: ``scrapy crawl`` workers of a throwaway
project whose settings name the Sentinels (or a ``redis+sentinel://`` URL) crawl a
local site, each page once; the client follows a failover. (A failover mid-crawl, with
its WAIT confirmation, is tests/test_failover.py's.)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.settings import Settings

from scrapy_dist.connection import check, client_from_config, describe, topology
from scrapy_dist.settings import connection_config
from scrapy_dist.testing import TestSite
from scrapy_dist.testing.topology import make_project, run_crawl, stats

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from scrapy_dist.testing import SentinelServers

pytestmark = [pytest.mark.redis_server]

PAGES = 1500


def sentinel_url(sentinels: SentinelServers) -> str:
    hosts = ",".join(f"{host}:{port}" for host, port in sentinels.sentinel_addresses)
    return f"redis+sentinel://{hosts}/{sentinels.service_name}/0"


@pytest.fixture
def clean(redis_sentinel: SentinelServers) -> Iterator[SentinelServers]:
    redis_sentinel.wait_agreed()
    with redis_sentinel.master().client() as client:
        client.flushdb()
    yield redis_sentinel
    redis_sentinel.wait_agreed(60)
    with redis_sentinel.master().client() as client:
        client.flushdb()


def test_settings_and_url_reach_the_master(clean: SentinelServers) -> None:
    for settings in (
        {
            "REDIS_SENTINELS": clean.sentinel_addresses,
            "REDIS_SENTINEL_PARAMS": {"service_name": clean.service_name},
        },
        {"REDIS_URL": sentinel_url(clean)},
    ):
        client = client_from_config(connection_config(Settings(settings)))
        assert topology(client) == "sentinel"
        text = describe(client)
        assert text.startswith("redis+sentinel://127.0.0.1:")
        assert text.endswith(f"/{clean.service_name}/0")
        check(client)
        client.set("where", b"master")
        with clean.master().client() as master:
            assert master.get("where") == b"master"
        client.close()


def test_a_wrong_service_name_is_one_clear_error(clean: SentinelServers) -> None:
    client = client_from_config(
        connection_config(
            Settings(
                {
                    "REDIS_SENTINELS": clean.sentinel_addresses,
                    "REDIS_SENTINEL_PARAMS": {"service_name": "nosuch"},
                }
            )
        )
    )
    with pytest.raises(Exception, match=r"cannot reach Redis at redis\+sentinel://.*/nosuch/0"):
        check(client)


@pytest.mark.slow
def test_the_client_follows_a_sentinel_failover(clean: SentinelServers) -> None:
    client = client_from_config(connection_config(Settings({"REDIS_URL": sentinel_url(clean)})))
    client.set("k", b"1")
    old = clean.master()
    new = clean.failover()
    clean.wait_agreed(60)
    assert new is not old
    for _ in range(50):  # the first commands may meet the demoted master: an outage
        try:
            client.set("k", b"2")
            break
        except redis.RedisError:
            time.sleep(0.2)
    with new.client() as master:
        assert master.get("k") == b"2"
    client.close()


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(PAGES) as served:
        yield served


@pytest.mark.e2e
def test_two_workers_crawl_every_page_once_behind_sentinel(
    clean: SentinelServers, site: TestSite, tmp_path: Path
) -> None:
    settings = (
        f"REDIS_SENTINELS = {[f'{h}:{p}' for h, p in clean.sentinel_addresses]!r}\n"
        f"REDIS_SENTINEL_PARAMS = {{'service_name': {clean.service_name!r}}}"
    )
    project = make_project(tmp_path, settings)

    def seed(url: str) -> None:
        with clean.master().client() as client:
            client.lpush("pages:start_urls", url)  # no hash tag: not a cluster

    result = run_crawl(project, site, tmp_path, seed)
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    assert result.duplicates == 0, result.figures()
    assert sum(int(s.get("downloader/response_count", 0)) for s in stats(result)) == PAGES
    assert "redis+sentinel://" in result.workers[0].log_file.read_text()


def test_cli_push_status_and_jobs_behind_sentinel(
    clean: SentinelServers,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from scrapy_dist.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    url = sentinel_url(clean)
    assert main(["--redis-url", url, "push", "pages", "https://a.example/1"]) == 0
    with clean.master().client() as master:
        assert master.lrange("pages:start_urls", 0, -1) == [b"https://a.example/1"]
    capsys.readouterr()
    assert main(["--redis-url", url, "status", "pages"]) == 0
    out = capsys.readouterr().out
    assert f"redis+sentinel://127.0.0.1:{clean.sentinel_addresses[0][1]}" in out
    assert f"/{clean.service_name}/0" in out
    assert main(["--redis-url", url, "jobs"]) == 0
    assert "pages" in capsys.readouterr().out
    assert main(["--redis-url", url, "reset", "pages", "--yes"]) == 0
    with clean.master().client() as master:
        assert not master.exists("pages:start_urls")
