"""``scrapy-dist web`` in a real browser (headless Chromium driven by Selenium) against
two ``scrapy crawl`` workers of a user's project and the session's redis-server.

One scenario, in the order a user meets it: the page follows the crawl within 2 s of a
change; pause from the page stops new requests within 1 s; "requeue all" puts the dead
letters back; a killed worker goes silent, counts down, and its leases come back.
A screenshot of each view is saved in the test's ``tmp_path`` (and in
``$SCRAPY_DIST_SCREENSHOTS`` when set). Chromium and chromedriver come from Debian's
``chromium`` and ``chromium-driver`` (``make install``); without them the test is
skipped, and fails under ``CI``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import CLASSES_SETTINGS, SITE_DELAY, Project, environment

from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.testing import TestSite

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from selenium.webdriver.remote.webdriver import WebDriver

#: The crawl's settings: slow enough to steer (each worker about 4 pages/s, one request
#: at a time in its downloader: a pause lets what Scrapy's engine holds finish, and with
#: more concurrency a download delay keeps several waiting there), heartbeats and leases
#: short enough for a silent worker's countdown to end within the test.
SETTINGS = """
DOWNLOAD_DELAY = 0.25
CONCURRENT_REQUESTS = 1
RANDOMIZE_DOWNLOAD_DELAY = False
STATS_CLASS = "scrapy_dist.stats.RedisStatsCollector"
STATS_FLUSH_INTERVAL = 1
SCHEDULER_HEARTBEAT_INTERVAL = 1
SCHEDULER_WORKER_TIMEOUT = 4
SCHEDULER_LEASE_TIMEOUT = 6
"""
TOKEN = "browser-test-token"
#: Pages of this scenario's site: at about 8 pages/s, a crawl of over a minute, so work
#: is still queued when the frontier view is checked after pause and resume (with the
#: other scenarios' 120 pages, 100 or more were done by then, and the rest could all be
#: crawled or leased before the view was drawn).
PAGES = 600


def _binary(name: str, *more: str) -> str | None:
    for candidate in (name, *more):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _need(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs {reason}")
    pytest.skip(reason)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless Chromium (Debian's ``chromium`` and ``chromium-driver``)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _need("selenium (pip install -e '.[acceptance]')")
    chromium = _binary("chromium", "chromium-browser", "google-chrome")
    driver_path = _binary("chromedriver")
    if chromium is None or driver_path is None:
        _need("chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(options=options, service=Service(str(driver_path)))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def site() -> Iterator[TestSite]:
    """The scenario's local site, of :data:`PAGES` pages."""
    with TestSite(PAGES, delay=SITE_DELAY) as running:
        yield running


@pytest.fixture
def crawl(project: Project) -> Project:
    """The project with scrapy_dist's classes, the scenario's Redis and :data:`SETTINGS`."""
    project.add_settings(CLASSES_SETTINGS + f'REDIS_URL = "{project.redis_url}"\n' + SETTINGS)
    return project


@pytest.fixture
def web(crawl: Project) -> Iterator[str]:
    """``scrapy-dist web books --actions --port 0`` in the project (once its settings
    name the scenario's Redis); its address."""
    project = crawl
    env = environment({"SCRAPY_DIST_WEB_TOKEN": TOKEN})
    process = subprocess.Popen(
        [sys.executable, "-m", "scrapy_dist", "web", "books", "--actions", "--port", "0"],
        cwd=project.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"(http://\S+/)#token=(\S+)", line)
        assert found, f"no address in {line!r}"
        assert found.group(2) == TOKEN
        yield found.group(1)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _shots(tmp_path: Path) -> list[Path]:
    folders = [tmp_path / "screenshots"]
    if os.environ.get("SCRAPY_DIST_SCREENSHOTS"):
        folders.append(Path(os.environ["SCRAPY_DIST_SCREENSHOTS"]))
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def _wait(what: str, check: Callable[[], Any], timeout: float, step: float = 0.05) -> float:
    """Seconds until ``check()`` is true; fails after ``timeout``."""
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except Exception:  # a page being redrawn: an element replaced under the read
            pass
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(step)


def test_the_page_follows_and_steers_a_crawl(
    crawl: Project, browser: WebDriver, web: str, tmp_path: Path
) -> None:
    project = crawl
    from selenium.webdriver.common.by import By

    folders = _shots(tmp_path)

    def shot(view: str) -> None:
        for folder in folders:
            browser.save_screenshot(str(folder / f"web-{view}.png"))

    def text(element_id: str) -> str:
        return str(browser.find_element(By.ID, element_id).get_attribute("textContent"))

    def show(view: str) -> None:
        browser.find_element(By.ID, f"nav-{view}").click()
        _wait(
            f"{view} shown", lambda: browser.find_element(By.ID, f"view-{view}").is_displayed(), 5
        )

    browser.get(web + f"#token={TOKEN}")
    _wait("the page answers", lambda: text("state") in ("absent", "idle"), 10)

    # -- the page follows the crawl within 2 s of a change
    workers = project.crawl(2)
    project.seed()
    try:
        seen = _wait("running shown", lambda: text("state") == "running", 2.0)
    except AssertionError:
        shot("failed")
        raise AssertionError(f"{text('state')}: {text('answer-words')} / {text('error')}") from None
    assert "Nothing lost." in text("answer-lost")
    with project.client() as client:
        _wait("pages crawled", lambda: int(client.hget("books:progress", "done") or 0) >= 10, 30)
        _wait("three history samples", lambda: client.llen("books:history") >= 3, 20)
    _wait("charts drawn", lambda: int(text("history-note").split()[0]) >= 3, 4)
    shot("overview")

    # -- pause from the page: no new request within 1 s
    show("control")
    browser.find_element(By.ID, "reason").send_keys("<b>maintenance</b> & checks")
    browser.find_element(By.ID, "btn-pause").click()
    clicked = time.monotonic()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - clicked)))
    hits = sum(project.hits().values())
    time.sleep(2.0)
    assert sum(project.hits().values()) == hits, "requests were sent more than 1 s after pause"
    _wait("paused shown", lambda: text("state") == "paused", 2)
    _wait("audit trail", lambda: "<b>maintenance</b> & checks" in text("log-table"), 3)
    assert not browser.find_elements(By.CSS_SELECTOR, "#log-table b")  # escaped, never HTML
    shot("control")

    # -- dead letters: "requeue all" puts them back
    with project.client() as client:
        letters = DeadLetters(client, "books:dead", "test")
        for i in (200, 201, 202):
            letters.add("seed", f"simulated failure <i>{i}</i>", project.page(i))
        seeds_before = client.llen("books:start_urls")
    show("dead")
    _wait("3 dead shown", lambda: text("dead-total") == "3 dead letter(s)", 2)
    # (the answer is the summary's, read by the same tick before the view or by the next)
    _wait("the answer counts them", lambda: "3 dead letter(s)" in text("answer-lost"), 2)
    shot("dead")
    browser.find_element(By.ID, "btn-requeue-all").click()
    alert = browser.switch_to.alert
    assert "3" in alert.text
    alert.accept()
    _wait("nothing lost shown", lambda: text("answer-lost") == "Nothing lost.", 2)
    with project.client() as client:
        assert client.llen("books:dead") == 0
        assert client.llen("books:start_urls") == seeds_before + 3  # paused: they wait

    # -- resume, then a killed worker goes silent, counts down, and its leases return
    show("control")
    browser.find_element(By.ID, "btn-resume").click()
    _wait("running again", lambda: text("state") == "running", 2)
    with project.client() as client:
        done = int(client.hget("books:progress", "done") or 0)
    assert done < PAGES - 100, f"{done} of {PAGES} pages done at resume: too few left to steer"
    show("frontier")  # work queued: the oldest entry of each end of the levels, its URL
    _wait("frontier drawn", lambda: "queued in" in text("frontier-figures"), 3)
    _wait("oldest entries drawn", lambda: "/page/" in text("oldest-table"), 5)
    _wait("busiest slots drawn", lambda: "127.0.0.1" in text("slots-table"), 5)
    shot("frontier")
    with project.client() as client:
        _wait(
            "a worker holding leases",
            lambda: any(client.hlen(f"books:holders:{w}") for w in client.hkeys("books:workers")),
            10,
        )
        victim = next(w for w in client.hkeys("books:workers") if client.hlen(f"books:holders:{w}"))
    pid = int(victim.split(":")[1])
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    show("workers")
    row = f"tr[data-worker='{victim}']"

    def countdown() -> int | None:
        cells = browser.find_elements(By.CSS_SELECTOR, f"{row} td.countdown")
        if not cells:
            return None
        found = re.search(r"return in (\d+) s", str(cells[0].get_attribute("textContent")))
        return int(found.group(1)) if found else None

    _wait("silent and counting down", lambda: countdown() is not None, 6)
    first = countdown()
    shot("workers")
    time.sleep(1.5)
    later = countdown()
    assert first is not None
    assert later is not None
    assert later < first, (first, later)
    with project.client() as client:
        _wait("its leases return", lambda: client.hlen(f"books:holders:{victim}") == 0, 20)
    _wait("no countdown", lambda: countdown() is None, 3)
    assert time.monotonic() - killed < 30
    # the survivor that took them back says so, with the count
    [survivor] = [w for w in workers if w.process.pid != pid]
    said = re.compile(r"Took back (\d+) expired lease\(s\) of a silent worker")
    _wait("the survivor says so", lambda: said.search(survivor.text()), 5)
    show("redis")
    _wait("redis drawn", lambda: "maxmemory-policy" in text("redis-figures"), 3)
    assert "noeviction" in text("redis-figures")
    shot("redis")
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    print(f"page followed the crawl in {seen:.2f} s")  # (shown with -s)
