"""A project deployed to scrapyd with ``scrapyd-deploy``: two jobs share one crawl.

Needs the ``acceptance`` extra (``pip install scrapy-dist[acceptance]``: scrapyd and
scrapyd-client from PyPI). Two deployments: scrapy_dist installed in scrapyd's
environment (the egg is scrapyd-deploy's default), and scrapy_dist bundled in the
project's egg (a zipped egg, so its Lua scripts are read from inside the zip).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import BOOKS_SPIDER, environment

import scrapy_dist
from scrapy_dist.testing import free_port

if TYPE_CHECKING:
    from collections.abc import Iterator

    from conftest import Project

for _module in ("scrapyd", "scrapyd_client"):
    if os.environ.get("CI"):  # in CI a missing extra is a failure, not a skip
        importlib.import_module(_module)
    else:
        pytest.importorskip(_module, reason="not installed: pip install -e '.[acceptance]'")

BIN = Path(sys.executable).parent
#: The user's setup.py when scrapy_dist is bundled in the egg: its Lua files declared.
BUNDLED_SETUP = """\
from setuptools import find_packages, setup

setup(
    name="books",
    version="1.0",
    packages=find_packages(),
    package_data={"scrapy_dist": ["py.typed"], "scrapy_dist.lua": ["*.lua"]},
    entry_points={"scrapy": ["settings = books.settings"]},
)
"""
#: The README's spider, saying where it imported scrapy_dist from.
SPIDER = (
    "import scrapy_dist\n"
    + BOOKS_SPIDER
    + """
    def closed(self, reason):
        self.logger.info("scrapy_dist imported from %s", scrapy_dist.__file__)
"""
)


def _environment() -> dict[str, str]:
    """A user's environment without this checkout on ``PYTHONPATH``: scrapyd and its jobs
    import what is installed, or the project's egg."""
    return {**environment(), "PYTHONPATH": ""}


class Scrapyd:
    """A scrapyd server running in its own directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "scrapyd.conf").write_text(
            "[scrapyd]\n"
            "bind_address = 127.0.0.1\n"
            f"http_port = {self.port}\n"
            "eggs_dir = eggs\nlogs_dir = logs\ndbs_dir = dbs\nitems_dir =\n"
            "poll_interval = 0.5\nmax_proc = 4\n",
            encoding="utf-8",
        )
        self.output = (directory / "scrapyd.out").open("wb")
        self.process = subprocess.Popen(
            [str(BIN / "scrapyd")],
            cwd=directory,
            env=_environment(),
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.get("daemonstatus.json")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        "scrapyd did not start:\n" + (directory / "scrapyd.out").read_text()
                    ) from None
                time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def get(self, path: str, **query: str) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def post(self, path: str, **data: str) -> Any:
        body = urllib.parse.urlencode(data).encode()
        with urllib.request.urlopen(self.url + path, body, timeout=10) as response:
            return json.load(response)

    def job_log(self, project: str, job: str) -> str:
        path = self.directory / "logs" / project / "books" / f"{job}.log"
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()


@pytest.fixture(scope="module")
def scrapyd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrapyd]:
    server = Scrapyd(tmp_path_factory.mktemp("scrapyd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("deployment", ["installed", "bundled"])
def test_scrapyd_two_jobs(project: Project, scrapyd: Scrapyd, deployment: str) -> None:
    """Deploy with ``scrapyd-deploy``, schedule two jobs over HTTP: each page once, no error."""
    name = f"books_{deployment}"
    project.use_scrapy_dist()
    project.write("books/spiders/books.py", SPIDER)
    (project.root / "scrapy.cfg").write_text(
        "[settings]\ndefault = books.settings\n\n"
        f"[deploy]\nurl = {scrapyd.url}\nproject = {name}\n",
        encoding="utf-8",
    )
    if deployment == "bundled":
        shutil.copytree(
            Path(scrapy_dist.__file__).parent,
            project.root / "scrapy_dist",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        project.write("setup.py", BUNDLED_SETUP)
    deployed = subprocess.run(
        [str(BIN / "scrapyd-deploy")],
        cwd=project.root,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert '"status": "ok"' in deployed.stdout, deployed.stdout + deployed.stderr

    jobs = [scrapyd.post("schedule.json", project=name, spider="books")["jobid"] for _ in "ab"]
    deadline = time.monotonic() + 60
    while not all("Spider opened" in scrapyd.job_log(name, job) for job in jobs):
        ended = {job["id"] for job in scrapyd.get("listjobs.json", project=name)["finished"]}
        logs = "\n".join(scrapyd.job_log(name, j)[-3000:] for j in jobs)
        assert not ended & set(jobs), logs
        assert time.monotonic() < deadline, logs
        time.sleep(0.2)
    project.seed()

    deadline = time.monotonic() + 90
    while True:
        listed = scrapyd.get("listjobs.json", project=name)
        finished = {job["id"] for job in listed["finished"]}
        if set(jobs) <= finished:
            break
        assert time.monotonic() < deadline, f"jobs not finished: {listed}"
        time.sleep(0.5)
    for log in [scrapyd.job_log(name, job) for job in jobs]:
        assert "Spider closed (crawl_finished)" in log, log[-3000:]
        assert " ERROR: " not in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        source = log.split("scrapy_dist imported from ")[1].splitlines()[0]
        assert (".egg" in source) == (deployment == "bundled"), source
    project.assert_each_page_once()
