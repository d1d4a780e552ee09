"""Crawls on a Redis Cluster or behind Sentinel, for tests: a throwaway Scrapy project
(a copy of the repository's example project whose ``settings.py`` a user edited: its
``REDIS_URL`` line replaced by the topology's settings), crawled by ``scrapy crawl``
worker processes until they exit, with a failover or a crash of a server mid-crawl.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_dist.testing.crawl import duplicates, worker_logs
from scrapy_dist.testing.workers import start_workers, stop_workers, wait_ready, wait_workers

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from scrapy_dist.testing import TestSite, Worker

#: The example project of a source checkout (not shipped in the wheel).
EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "example"
SPIDER = "pages"
TIMEOUT = 120.0


def make_project(root: Path, settings: str) -> Path:
    """Copy the example project under ``root`` with ``settings`` instead of its
    ``REDIS_URL`` line; return the directory of its ``scrapy.cfg``."""
    project = root / "project"
    shutil.copytree(EXAMPLE_DIR, project, ignore=shutil.ignore_patterns("__pycache__"))
    path = project / "demo_project" / "settings.py"
    lines = [
        settings if line.startswith("REDIS_URL") else line for line in path.read_text().splitlines()
    ]
    path.write_text("\n".join(lines) + "\n")
    return project


@dataclass
class Result:
    """What one crawl left: exit statuses, hit counts, pages never fetched."""

    statuses: list[int]
    hits: dict[str, int]
    missing: set[str]
    workers: list[Worker]

    @property
    def duplicates(self) -> int:
        return duplicates(self.hits)

    def figures(self) -> str:
        return (
            f"{len(self.hits)} pages fetched, {len(self.missing)} lost, "
            f"{self.duplicates} duplicate fetches, exit statuses {self.statuses}"
        )


def run_crawl(
    project: Path,
    site: TestSite,
    log_dir: Path,
    seed: Callable[[str], None],
    *,
    workers: int = 2,
    settings: Mapping[str, object] | None = None,
    during: Callable[[], None] | None = None,
    during_after: int = 0,
) -> Result:
    """Run ``workers`` workers of the project's ``pages`` spider until they exit.

    Args:
        seed: pushes the first page's URL to the crawl's seeds key.
        during: called once the site served ``during_after`` pages (a failover...).
    """
    site.reset_hits()
    started = start_workers(
        workers,
        project_dir=project,
        spider=SPIDER,
        log_dir=log_dir,
        settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2, **(settings or {})},
        stats_setting="DEMO_STATS_FILE",
    )
    try:
        seed(site.page_url(0))
        try:
            wait_ready(started, timeout=TIMEOUT)
        except (RuntimeError, TimeoutError) as e:
            raise AssertionError(f"{e}\n{worker_logs(started)}") from None
        if during is not None:
            deadline = time.monotonic() + TIMEOUT
            while sum(site.hits().values()) < during_after:
                if time.monotonic() > deadline:
                    raise AssertionError("crawl stalled:\n" + worker_logs(started))
                time.sleep(0.02)
            during()
        try:
            statuses = wait_workers(started, TIMEOUT)
        except TimeoutError:
            raise AssertionError("workers did not finish:\n" + worker_logs(started)) from None
    finally:
        stop_workers(started, timeout=5.0)
    hits = site.hits()
    return Result(statuses, hits, site.expected_paths() - set(hits), started)


def stats(result: Result) -> list[dict[str, Any]]:
    return [w.stats() for w in result.workers]
