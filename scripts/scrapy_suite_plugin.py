"""pytest plugin of ``scripts/scrapy_suite.py``: Scrapy's own tests with scrapy_dist swapped in.

Loaded with ``-p scrapy_suite_plugin`` (``scripts/`` on ``PYTHONPATH``) before Scrapy's
conftest imports anything, it reads two environment variables:

- ``SCRAPY_SUITE_MODE``: ``plain`` (nothing is changed), ``classes`` (Scrapy's default
  ``SCHEDULER`` and ``DUPEFILTER_CLASS`` become scrapy_dist's) or ``addon`` (Scrapy's
  default ``ADDONS`` enables :class:`scrapy_dist.addon.DistAddon`).
- ``SCRAPY_SUITE_REDIS_URL``: the throwaway server (``classes`` and ``addon``).
- ``SCRAPY_SUITE_QUEUE`` (optional): the ``SCHEDULER_QUEUE_CLASS`` of the swapped modes.

In the two swapped modes every :class:`scrapy.crawler.Crawler` gets ``REDIS_URL`` and its
own ``SCHEDULER_JOB_ID`` at ``project`` priority (where a user puts them), so no two
crawls share a key. In every mode the outcome of each test (``passed``, ``failed`` or
``skipped``, with the first line of its error) is written as JSON to
``SCRAPY_SUITE_RESULTS`` when the session ends.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

#: The modes, as ``SCRAPY_SUITE_MODE`` names them.
MODES = ("plain", "classes", "addon")

_SCHEDULER = "scrapy_dist.scheduler.Scheduler"
_DUPEFILTER = "scrapy_dist.dupefilter.RFPDupeFilter"
_ADDON = "scrapy_dist.addon.DistAddon"


def _swap(mode: str, redis_url: str) -> None:
    """Make every crawler built from now on use scrapy_dist (``mode`` not ``plain``)."""
    from scrapy.crawler import Crawler
    from scrapy.settings import default_settings

    queue = os.environ.get("SCRAPY_SUITE_QUEUE")
    if queue:
        default_settings.SCHEDULER_QUEUE_CLASS = queue
    if mode == "classes":
        default_settings.SCHEDULER = _SCHEDULER
        default_settings.DUPEFILTER_CLASS = _DUPEFILTER
    else:
        default_settings.ADDONS = {**default_settings.ADDONS, _ADDON: 0}
    jobs = itertools.count(1)
    init = Crawler.__init__

    @functools.wraps(init)
    def __init__(self: Crawler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        frozen = self.settings.frozen  # a test may hand in frozen settings
        self.settings.frozen = False
        self.settings.set("REDIS_URL", redis_url, priority="project")
        job = f"suite-{os.getpid()}-{next(jobs)}"
        self.settings.set("SCHEDULER_JOB_ID", job, priority="project")
        self.settings.frozen = frozen

    Crawler.__init__ = __init__  # type: ignore[method-assign]


def _keys_once() -> None:
    """Keep the test TLS key and certificate the harness wrote once: Scrapy's conftest
    writes new ones in every pytest process, xdist workers too, not atomically, so a
    mock server starting meanwhile may load a key and a certificate that do not match
    and every test of its class fails (plain Scrapy as well)."""
    try:
        from tests import keys  # type: ignore[attr-defined]  # Scrapy's, from the run's directory
    except ImportError:
        return
    folder = Path(keys.__file__).parent
    if (folder / "localhost.key").exists() and (folder / "localhost.crt").exists():
        keys.generate_keys = lambda: None


_keys_once()
_MODE = os.environ.get("SCRAPY_SUITE_MODE", "plain")
if _MODE not in MODES:
    raise ValueError(f"SCRAPY_SUITE_MODE={_MODE!r}: expected one of {', '.join(MODES)}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Swap scrapy_dist in after Scrapy's conftest has installed its reactor."""
    if _MODE != "plain":
        _swap(_MODE, os.environ["SCRAPY_SUITE_REDIS_URL"])


#: node id -> [outcome, first line of the error]; filled on the controller (or the only
#: process), from every phase's report.
_RESULTS: dict[str, list[str]] = {}


def _first_line(report: pytest.TestReport) -> str:
    """The line that says why ``report`` failed or was skipped."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0] if crash.message else ""
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return str(report.longrepr[2])
    lines = [line for line in str(report.longrepr or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return (errors or lines or [""])[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record the worst outcome of the phases of each test (failed > skipped > passed)."""
    outcome, _ = _RESULTS.get(report.nodeid, ["passed", ""])
    if outcome == "failed":
        return
    if report.failed:
        _RESULTS[report.nodeid] = ["failed", f"{report.when}: {_first_line(report)}"]
    elif report.skipped:
        _RESULTS[report.nodeid] = ["skipped", _first_line(report)]
    elif report.when == "call":
        _RESULTS[report.nodeid] = ["passed", ""]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module that cannot be collected counts as one failed test named after it."""
    if report.failed:
        _RESULTS[report.nodeid] = ["failed", f"collect: {_first_line(report)}"]  # type: ignore[arg-type]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the outcomes (not in an xdist worker: its reports reach the controller)."""
    path = os.environ.get("SCRAPY_SUITE_RESULTS")
    if path and not hasattr(session.config, "workerinput"):
        Path(path).write_text(json.dumps(_RESULTS, indent=1, sort_keys=True), encoding="utf-8")
