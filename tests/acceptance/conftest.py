"""The acceptance harness: a Scrapy project made the way a user makes one, and its workers.

Every scenario gets a fresh project in a temp dir, copied from one made by
``scrapy startproject books`` (run as a subprocess, once per session), with a spider
file and an edited ``settings.py``; a database of the session's redis-server of its own
(so the README's ``books`` keys of two scenarios never meet); and a small local site
that counts how often each page is fetched. Workers are real ``scrapy crawl``
processes (or the user's own scripts), seeded through Redis as a user seeds them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_dist.testing import TestSite, start_workers, stop_workers

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from scrapy_dist.testing import Worker

#: Pages of each scenario's site: small enough to be fast, big enough to be shared.
PAGES = 120
#: Seconds the site waits per page, so the crawl lasts long enough for both workers to work.
SITE_DELAY = 0.02
#: Seconds a scenario's workers may take to finish by themselves.
CRAWL_TIMEOUT = 90.0
#: The settings every scenario's user adds: fast (the template's politeness off), quiet,
#: and ending by itself soon after the last page.
FAST_SETTINGS = """
# --- edited for a local crawl ---
DOWNLOAD_DELAY = 0
CONCURRENT_REQUESTS_PER_DOMAIN = 16
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
"""
#: The crawl ends by itself soon after its last page.
DONE_SETTINGS = """
CLOSE_WHEN_CRAWL_DONE = True
CRAWL_DONE_GRACE = 1
"""
#: The README's two classes (its settings block without ``REDIS_URL``).
CLASSES_SETTINGS = """
SCHEDULER = "scrapy_dist.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"
"""
#: The README's spider, under the README's name.
BOOKS_SPIDER = """
from scrapy_dist.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "books"

    def parse(self, response):
        yield {"title": response.css("title::text").get()}
        yield from response.follow_all(css="a")
"""

_ERROR = re.compile(r"^\S+ \S+ \[[^\]]+\] ERROR: (.*)$", re.MULTILINE)
_TRACEBACK = "Traceback (most recent call last)"
_ITEMS = re.compile(r"'item_scraped_count': (\d+)")
_databases = itertools.count(1)
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this directory ``acceptance``."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.acceptance)


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a user's process: this interpreter's packages, no project override."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_PARENT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


@dataclass
class Run:
    """One process a scenario started: a worker or a user's script."""

    name: str
    process: subprocess.Popen[bytes]
    log_file: Path
    output_file: Path

    def text(self) -> str:
        """The Scrapy log and the process output, together."""
        parts = []
        for path in dict.fromkeys((self.log_file, self.output_file)):
            with contextlib.suppress(OSError):
                parts.append(path.read_text(encoding="utf-8", errors="replace"))
        return "\n".join(parts)

    def errors(self) -> list[str]:
        """Every ``ERROR`` line of the log, message only."""
        return _ERROR.findall(self.text())

    def first_error(self) -> str | None:
        """The first ``ERROR`` line's message, or None."""
        errors = self.errors()
        return errors[0] if errors else None

    def tracebacks(self) -> int:
        """How many tracebacks the log and output hold."""
        return self.text().count(_TRACEBACK)

    def items(self) -> int:
        """``item_scraped_count`` of the final stats (0 if none were dumped)."""
        found = _ITEMS.findall(self.text())
        return int(found[-1]) if found else 0

    def tail(self, lines: int = 25) -> str:
        """The end of the log, for assertion messages."""
        return f"--- {self.name} ---\n" + "\n".join(self.text().splitlines()[-lines:])


@dataclass
class Project:
    """A user's Scrapy project (module ``books``) and what was started in it."""

    root: Path
    redis_url: str
    site: TestSite
    runs: list[Run] = field(default_factory=list)
    _workers: list[Worker] = field(default_factory=list)

    @property
    def settings_file(self) -> Path:
        """``books/settings.py``."""
        return self.root / "books" / "settings.py"

    @property
    def logs(self) -> Path:
        """Where the processes' logs go."""
        path = self.root / "logs"
        path.mkdir(exist_ok=True)
        return path

    def client(self) -> redis.Redis:
        """A client of the scenario's database (str replies)."""
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def add_settings(self, text: str) -> None:
        """Append ``text`` to ``settings.py``, as a user edits it."""
        with self.settings_file.open("a", encoding="utf-8") as stream:
            stream.write("\n" + text + "\n")

    def use_scrapy_dist(self, *, done: bool = True) -> None:
        """Add the README's classes and ``REDIS_URL`` of the scenario's database to
        ``settings.py``, and (``done``) :data:`DONE_SETTINGS`."""
        self.add_settings(
            CLASSES_SETTINGS + f'REDIS_URL = "{self.redis_url}"\n' + (DONE_SETTINGS if done else "")
        )

    def seed(self, *urls: str, key: str = "books:start_urls") -> None:
        """``LPUSH`` seeds (default: the site's page 0) to ``key``, as ``redis-cli`` does."""
        with self.client() as client:
            client.lpush(key, *(urls or (self.page(0),)))

    def write(self, relative: str, text: str) -> Path:
        """Write a file of the project (a spider, a script) and return its path."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def page(self, i: int) -> str:
        """The site's URL of page ``i``."""
        return self.site.page_url(i)

    def crawl(
        self,
        count: int = 2,
        spider: str = "books",
        *,
        settings: Mapping[str, object] | None = None,
        spider_args: Mapping[str, object] | None = None,
        ready: bool = True,
    ) -> list[Run]:
        """Start ``count`` ``scrapy crawl`` workers and (by default) wait until each opened.

        Returns:
            The runs, logging to ``logs/worker-<n>.log``.
        """
        workers = start_workers(
            count,
            project_dir=self.root,
            spider=spider,
            log_dir=self.logs,
            settings=settings,
            spider_args=spider_args,
            stats_setting=None,
            first_index=len(self._workers),
        )
        self._workers += workers
        runs = [Run(f"worker {w.index}", w.process, w.log_file, w.output_file) for w in workers]
        self.runs += runs
        if ready:
            self.wait_ready(runs)
        return runs

    def script(self, path: Path, count: int = 2, *, ready: bool = True) -> list[Run]:
        """Run the user's script ``path`` (``python script.py``) ``count`` times."""
        runs = []
        for _ in range(count):
            output = self.logs / f"{path.stem}-{len(self.runs)}.out"
            with output.open("wb") as stream:
                process = subprocess.Popen(
                    [sys.executable, str(path)],
                    cwd=self.root,
                    env=environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            run = Run(f"{path.name} #{len(self.runs)}", process, output, output)
            self.runs.append(run)
            runs.append(run)
        if ready:
            self.wait_ready(runs)
        return runs

    def wait_ready(self, runs: Sequence[Run], timeout: float = 60.0) -> None:
        """Wait until every run logged ``Spider opened``.

        Raises:
            AssertionError: One exited first, or did not open in time (with its log).
        """
        deadline = time.monotonic() + timeout
        pending = list(runs)
        while pending:
            for run in list(pending):
                if "Spider opened" in run.text():
                    pending.remove(run)
                elif run.process.poll() is not None:
                    raise AssertionError(
                        f"{run.name} exited ({run.process.returncode}) before it opened\n"
                        f"{run.tail()}"
                    )
            if pending and time.monotonic() > deadline:
                raise AssertionError("not open in time:\n" + "\n".join(r.tail() for r in pending))
            time.sleep(0.05)

    def wait(self, runs: Sequence[Run] | None = None, timeout: float = CRAWL_TIMEOUT) -> list[int]:
        """Wait until the runs exit by themselves.

        Returns:
            Their exit statuses.

        Raises:
            AssertionError: Some still run after ``timeout`` (with their logs).
        """
        runs = list(self.runs if runs is None else runs)
        deadline = time.monotonic() + timeout
        for run in runs:
            try:
                run.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"still running after {timeout:g} s (not exiting by itself):\n"
                    + "\n".join(r.tail() for r in runs)
                ) from None
        return [run.process.returncode for run in runs]

    def cli(
        self, *args: str, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``scrapy-dist ARGS`` in the project directory (stdin not a terminal)."""
        return subprocess.run(
            [sys.executable, "-m", "scrapy_dist", *args],
            cwd=self.root,
            env=environment(),
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def hits(self) -> dict[str, int]:
        """Fetches per path of the site."""
        return self.site.hits()

    def assert_each_page_once(self, start: int = 0, seeds: Sequence[int] = ()) -> None:
        """Every page reachable from ``start`` was fetched exactly once, and no other;
        but ``seeds``, pages pushed as seeds that other pages link to, twice (a seed
        skips the dupefilter and is not recorded in it, as Scrapy records no
        ``dont_filter`` request: a link to it is crawled once more)."""
        expected = self.site.expected_paths(start)
        hits = self.hits()
        allowed = {f"/page/{i}": 2 for i in seeds}
        twice = {path: n for path, n in hits.items() if n > allowed.get(path, 1)}
        missing = expected - set(hits)
        message = (
            f"{len(expected)} pages: {len(twice)} fetched more than once (e.g. "
            f"{sorted(twice.items())[:5]}), {len(missing)} never fetched (e.g. "
            f"{sorted(missing)[:5]})\n" + "\n".join(r.tail() for r in self.runs)
        )
        assert not twice, message
        assert not missing, message
        assert set(hits) == expected, message

    def assert_clean_exit(self, runs: Sequence[Run] | None = None) -> None:
        """The runs exited by themselves with status 0, no ERROR line and no traceback."""
        runs = list(self.runs if runs is None else runs)
        codes = self.wait(runs)
        for run, code in zip(runs, codes, strict=True):
            assert code == 0, f"{run.name} exited {code}\n{run.tail()}"
            assert run.first_error() is None, f"{run.name}: {run.first_error()}\n{run.tail()}"
            assert run.tracebacks() == 0, f"{run.name} logged a traceback\n{run.tail(60)}"

    def dead(self, crawl: str = "books") -> list[str]:
        """The crawl's dead-letter records."""
        with self.client() as client:
            return list(client.lrange(f"{crawl}:dead", 0, -1))

    def items(self) -> int:
        """Items scraped by all runs, from their final stats."""
        return sum(run.items() for run in self.runs)

    def stop(self) -> None:
        """Stop whatever still runs (SIGTERM, then SIGKILL)."""
        stop_workers(self._workers, timeout=5.0)
        for run in self.runs:
            if run.process.poll() is None:
                run.process.kill()
                run.process.wait()


@pytest.fixture(scope="session")
def project_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project made by ``scrapy startproject books`` (run once per session)."""
    parent = tmp_path_factory.mktemp("template")
    subprocess.run(
        [sys.executable, "-m", "scrapy", "startproject", "books"],
        cwd=parent,
        env=environment(),
        check=True,
        capture_output=True,
    )
    return parent / "books"


@pytest.fixture
def site() -> Iterator[TestSite]:
    """The scenario's local site."""
    with TestSite(PAGES, delay=SITE_DELAY) as running:
        yield running


@pytest.fixture
def database(redis_url: str) -> Iterator[str]:
    """A database of the session's Redis for this scenario alone; its keys are deleted after."""
    base, _, _ = redis_url.rpartition("/")
    url = f"{base}/{1 + next(_databases) % 15}"  # 0 is the other tests'
    client = redis.Redis.from_url(url)
    leftovers = list(client.scan_iter(count=1000))
    if leftovers:  # a database used by an earlier scenario of this session
        client.unlink(*leftovers)
    yield url
    keys = list(client.scan_iter(count=1000))
    if keys:
        client.unlink(*keys)
    client.close()


@pytest.fixture
def project(
    project_template: Path, tmp_path: Path, database: str, site: TestSite
) -> Iterator[Project]:
    """A fresh copy of the user's project, the README's spider and a fast, self-ending crawl.

    ``settings.py`` gets the template's politeness turned off and ``REDIS_URL`` of the
    scenario's database; each scenario adds the rest of its set-up.
    """
    root = tmp_path / "books"
    shutil.copytree(project_template, root)
    made = Project(root, database, site)
    made.add_settings(FAST_SETTINGS)
    made.write("books/spiders/books.py", BOOKS_SPIDER)
    try:
        yield made
    finally:
        made.stop()
