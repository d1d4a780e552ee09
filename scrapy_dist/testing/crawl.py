"""Worker processes of one crawl, for tests: start them, seed, wait, read what they left.

A :class:`WorkerCrawl` runs ``scrapy crawl`` workers of one Scrapy project against one
:class:`~scrapy_dist.testing.RedisServer` and one :class:`~scrapy_dist.testing.TestSite`.
A worker that exits before it opened, a crawl that hangs or stalls, and a page never
fetched all raise ``AssertionError`` with the workers' logs in the message, so a test
states only what it checks.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from scrapy_dist.testing.workers import start_workers, stop_workers, wait_ready, wait_workers

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    import redis

    from scrapy_dist.testing.redis_server import RedisServer
    from scrapy_dist.testing.site import TestSite
    from scrapy_dist.testing.workers import Worker


def duplicates(hits: Mapping[str, int]) -> int:
    """Fetches beyond the first, over all pages of a site's hit counts."""
    return sum(n - 1 for n in hits.values() if n > 1)


def worker_logs(workers: Iterable[Worker], lines: int = 40) -> str:
    """The first ERROR line of each worker with the 30 lines after it (its traceback),
    then the last ``lines`` lines of its log: what an assertion message needs."""
    parts = []
    for worker in workers:
        try:
            log = worker.log_file.read_text(errors="replace").splitlines()
        except OSError:
            log = []
        first = next((i for i, line in enumerate(log) if "ERROR" in line), None)
        error = "\n".join(log[first : first + 30]) if first is not None else "(no error)"
        parts.append(f"--- worker {worker.index}, first error:\n{error}\n{worker.log_tail(lines)}")
    return "\n".join(parts)


class WorkerCrawl:
    """The workers of one crawl of ``site``, each started with the same settings.

    Args:
        server: The crawl's Redis; every worker gets ``REDIS_URL`` of it.
        site: The site the crawl fetches; :meth:`seed` pushes its page 0.
        log_dir: Existing directory for the workers' logs (and stats files).
        project_dir: The Scrapy project the workers run (its ``scrapy.cfg`` directory).
        spider: The spider every worker runs; its seeds key is ``<spider>:start_urls``.
        settings: Settings of every worker, after ``REDIS_URL`` and before those given
            to :meth:`start`.
        stats_setting: The project setting that receives a stats file path (see
            :func:`~scrapy_dist.testing.start_workers`), or None.
        env: Extra environment variables of every worker.
        hit_timeout: Default seconds :meth:`hit_when` waits.

    :attr:`client` is a client of ``server`` (bytes replies); :meth:`close` stops every
    worker still running and closes it.
    """

    def __init__(
        self,
        server: RedisServer,
        site: TestSite,
        log_dir: Path,
        *,
        project_dir: str | os.PathLike[str],
        spider: str = "pages",
        settings: Mapping[str, object] | None = None,
        stats_setting: str | None = None,
        env: Mapping[str, str] | None = None,
        hit_timeout: float = 60.0,
    ) -> None:
        self.server = server
        self.site = site
        self.log_dir = log_dir
        self.project_dir = project_dir
        self.spider = spider
        self.settings = dict(settings or {})
        self.stats_setting = stats_setting
        self.env = env
        self.hit_timeout = hit_timeout
        self.workers: list[Worker] = []
        self.client: redis.Redis = server.client()

    def start(
        self, count: int, *, spider_args: Mapping[str, object] | None = None, **settings: object
    ) -> list[Worker]:
        """Start ``count`` more workers (numbered after those already started).

        Returns:
            The workers started by this call.
        """
        started = start_workers(
            count,
            project_dir=self.project_dir,
            spider=self.spider,
            log_dir=self.log_dir,
            settings={"REDIS_URL": self.server.url, **self.settings, **settings},
            spider_args=spider_args,
            stats_setting=self.stats_setting,
            env=self.env,
            first_index=len(self.workers),
        )
        self.workers += started
        return started

    def seed(self, url: str | None = None) -> None:
        """Push ``url`` (default: the site's page 0) to the spider's seeds key."""
        self.client.lpush(f"{self.spider}:start_urls", url or self.site.page_url(0))

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every worker started has opened its spider.

        Raises:
            AssertionError: One exited first or was not ready in time (with the logs).
        """
        try:
            wait_ready(self.workers, timeout=timeout)
        except (RuntimeError, TimeoutError) as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None

    def wait(self, timeout: float = 90.0) -> list[int]:
        """Wait until every worker exited by itself.

        Returns:
            Their exit statuses, in start order.

        Raises:
            AssertionError: Some still run after ``timeout`` seconds (with the logs).
        """
        try:
            return wait_workers(self.workers, timeout)
        except TimeoutError:
            raise AssertionError("workers did not finish:\n" + self.logs()) from None

    def logs(self, lines: int = 40) -> str:
        """Each worker's first error and the end of its log (:func:`worker_logs`)."""
        return worker_logs(self.workers, lines)

    def full_logs(self) -> str:
        """Every worker's whole log, one after the other."""
        return "\n".join(w.log_file.read_text(errors="replace") for w in self.workers)

    def hit_when(self, fetched: int, timeout: float | None = None) -> None:
        """Wait until the site served ``fetched`` pages in all (repeats included).

        Raises:
            AssertionError: Fewer in ``timeout`` seconds (default ``hit_timeout``).
        """
        timeout = self.hit_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while sum(self.site.hits().values()) < fetched:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"fewer than {fetched} pages fetched in {timeout}s:\n" + self.logs()
                )
            time.sleep(0.02)

    def missing(self) -> set[str]:
        """Pages reachable from page 0 that were never fetched."""
        return self.site.expected_paths() - set(self.site.hits())

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the workers still running (SIGTERM, then SIGKILL after ``timeout``)."""
        stop_workers(self.workers, timeout=timeout)

    def close(self) -> None:
        """Stop the workers still running and close :attr:`client`."""
        self.stop()
        self.client.close()
