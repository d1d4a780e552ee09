#!/usr/bin/env python3
"""Run Scrapy's own engine and scheduler tests with scrapy_dist swapped in.

What it does (nothing of Scrapy is stored in this repository):

1. ``pip download`` the sdist of the Scrapy installed in this interpreter (cached in
   ``.cache/scrapy-suite/``, ignored by git) and unpack its ``tests/``, ``conftest.py``
   and ``pyproject.toml`` (pytest's configuration) into a temporary directory; not its
   ``scrapy/`` package, so the tests import the installed Scrapy.
2. Start a throwaway ``redis-server`` on a free port (never the machine's 6379).
3. Run the test modules of :data:`MODULES` that this Scrapy has with pytest, at once:
   ``plain`` (as they are) and each swapped mode (``classes``: ``SCHEDULER`` and
   ``DUPEFILTER_CLASS`` name scrapy_dist's; ``addon``: ``ADDONS`` enables
   ``scrapy_dist.addon.DistAddon``), through ``scripts/scrapy_suite_plugin.py``, which
   also gives every crawler ``REDIS_URL`` and its own ``SCHEDULER_JOB_ID``.
4. Run a mode's unexpected failures again, alone, when there are few (``--reruns``): a
   timing test may fail under the load of the other runs.
5. Compare: every test that passes plain must pass in each swapped mode, except those
   in :data:`KNOWN_FAILURES` (each with its reason).

Exit status 0 when nothing else fails, 1 otherwise. The runs need ``pytest-timeout`` and
``pytest-xdist`` (extra ``test``); what Scrapy's tests import besides
(:data:`REQUIREMENTS`) is installed into the cache, for the runs only.

Usage: ``python scripts/scrapy_suite.py [--mode classes|addon|both] [--modules a,b]
[-k EXPR] [-n N] [--reruns N] [--keep]``
"""

from __future__ import annotations

import argparse
import configparser
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from scrapy_dist.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "scrapy-suite"

#: Scrapy's test modules that run crawls through the engine and the scheduler; module
#: -> what of the scheduler's behaviour it exercises. A module this Scrapy lacks is
#: skipped (Scrapy 2.13 has 25 of them).
MODULES: dict[str, str] = {
    "test_addons": "add-ons setting SCHEDULER and friends, a crawl with add-ons",
    "test_closespider": "CLOSESPIDER_* close reasons of real crawls (page, item, error counts)",
    "test_contracts": "contract requests crawled through the engine (callbacks wrapped)",
    "test_core_scraper": "callback and errback output, errors of ignored requests",
    "test_crawl": "the core crawl tests: retries, timeouts, start requests, dupes, referers",
    "test_crawler": "Crawler life cycle, crawling twice, stopping, settings per crawler",
    "test_crawler_runners": "several crawls in one runner, at once and in sequence",
    "test_downloaderslotssettings": "download slots and delays of scheduled requests",
    "test_dupefilters": "DUPEFILTER_CLASS built by a scheduler, DUPEFILTER_DEBUG logging",
    "test_engine": "the engine's signals (request_scheduled/dropped/reached), spider_idle",
    "test_engine_close_spider": "closing the spider with a failing scheduler or downloader",
    "test_engine_download": "engine.download() beside scheduled requests",
    "test_engine_loop": "request order: priorities, start requests vs. others, FIFO/LIFO",
    "test_extension_memusage": "a looping crawl of repeated (dont_filter) requests",
    "test_feedexport": "items of real crawls exported, close order of the feeds",
    "test_feedexport_batch": "batched feeds over crawls",
    "test_logformatter": "crawled/dropped/error log lines of a crawl",
    "test_pipeline_crawl": "media pipelines' own requests scheduled by a crawl",
    "test_pipelines": "item pipelines (sync, async, deferred) during a crawl",
    "test_request_attribute_binding": "request/response attributes seen by callbacks, errbacks",
    "test_request_cb_kwargs": "cb_kwargs carried through the scheduler",
    "test_request_left": "the request_left_downloader signal, once per request",
    "test_scheduler": "the scheduler interface, JOBDIR, unserializable requests",
    "test_scheduler_base": "custom schedulers; BaseScheduler's contract with the engine",
    "test_signals": "signals sent by a crawl (item_scraped, spider_idle...)",
    "test_spider": "spiders' crawls (feed spiders, CrawlSpider rules) and callback errors",
    "test_spider_start": "start() / start_urls: what is scheduled from the start",
    "test_spidermiddleware_httperror": "HTTP errors reaching callbacks after retries",
    "test_spidermiddleware_output_chain": "callback output and exceptions through middlewares",
    "test_spidermiddleware_process_start": "start requests through process_start",
    "test_stats": "stats collectors over a crawl",
}

#: Tests that read the in-memory scheduler's or dupefilter's internals (or the
#: harness's own change of a default), which no crawl observes, and so may fail with
#: scrapy_dist; test id -> reason. Everything else that passes on Scrapy must pass.
KNOWN_FAILURES: dict[str, str] = {
    "tests/test_engine_close_spider.py::test_exception_scheduler": (
        "breaks Scrapy's scheduler by deleting its disk-queue attribute "
        "(del engine._slot.scheduler.dqs) to make close() fail"
    ),
    "tests/test_dupefilters.py::TestRFPDupeFilter::test_dupefilter_path": (
        "expects the seen set to persist in JOBDIR/requests.seen between two dupefilters; "
        "scrapy_dist keeps it in Redis (kept by SCHEDULER_PERSIST, per job id), and the "
        "harness gives every crawler its own job id"
    ),
    **{
        f"tests/test_dupefilters.py::TestRFPDupeFilter::{test}": (
            "reads the JOBDIR/requests.seen file of Scrapy's dupefilter (and truncates it)"
        )
        for test in ("test_seenreq_truncated", "test_seenreq_newlines")  # 2.19, 2.13
    },
    **{
        f"tests/test_dupefilters.py::TestRFPDupeFilter::{test}": (
            "expects the log record of a filtered duplicate under the logger name "
            "'scrapy.dupefilters' (scrapy_dist logs it as 'scrapy_dist.dupefilter')"
        )
        for test in ("test_log_debug[None]", "test_log_debug_default_dupefilter")
    },
    "tests/test_dupefilters.py::TestRFPDupeFilter::test_fingerprints_deprecation": (
        "reads RFPDupeFilter.fingerprints, Scrapy's in-memory set of fingerprints, and "
        "expects its deprecation warning"
    ),
    "tests/test_scheduler.py::TestIncompatibility::test_incompatibility": (
        "builds Scrapy's own Scheduler by hand, before the spider exists, for a spider "
        "class that has no name yet; the harness's SCHEDULER names scrapy_dist's, so "
        "DUPEFILTER_CLASS builds the crawl's shared dupefilter, whose keys are named "
        "after the spider (Scrapy's own check, the one the test is about, comes later)"
    ),
    "tests/test_addons.py::TestAddonManager::test_fallback_workflow": (
        "asserts that Scrapy's default SCHEDULER is 'scrapy.core.scheduler.Scheduler', "
        "which the harness changes in the classes mode"
    ),
}

SWAPPED_MODES = ("classes", "addon")

#: What the selected test modules import that the ``test`` extra does not provide
#: (from Scrapy's tox.ini test requirements), with their own dependencies: import name
#: -> requirement.
REQUIREMENTS = {
    "testfixtures": "testfixtures>=6",
    "pexpect": "pexpect>=4.8",
    "ptyprocess": "ptyprocess>=0.5",
    "pytest_twisted": "pytest-twisted>=1.14.3",
    "greenlet": "greenlet>=2",
    "decorator": "decorator>=4",
}
#: Needed only by a Scrapy whose tests run under pytest-twisted (2.14 and later).
TWISTED_ONLY = frozenset({"pytest_twisted", "greenlet", "decorator"})


def log(message: str) -> None:
    print(message, flush=True)  # noqa: T201 - the report of a command-line check


@dataclass
class Run:
    """One pytest process in one mode, over modules or over given tests."""

    mode: str
    name: str
    work: Path
    targets: list[str]
    workers: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float = 0.0
    #: node id -> (outcome, first line of the error)
    results: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: tests that failed in this run and passed when run again alone
    flaky: list[str] = field(default_factory=list)

    @property
    def results_file(self) -> Path:
        return self.work / f"{self.name}.json"

    @property
    def log_file(self) -> Path:
        return self.work / f"{self.name}.log"


def fetch_sdist(version: str) -> Path:
    """Download Scrapy's sdist into the cache (once); return the archive."""
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = sorted(CACHE.glob(f"scrapy-{version}.tar.gz"))
    if cached:
        return cached[0]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"scrapy=={version}",
            "-d",
            str(CACHE),
        ],
        check=True,
    )
    return next(CACHE.glob(f"scrapy-{version}.tar.gz"))


def unpack_tests(archive: Path, dest: Path) -> Path:
    """Unpack the sdist's tests and pytest configuration (not its ``scrapy/``)."""
    wanted = ("tests/", "conftest.py", "pyproject.toml", "tox.ini")
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if inner in wanted or inner.startswith(wanted[0]):
                member.name = inner
                members.append(member)
        tar.extractall(dest, members=members, filter="data")
    return dest


def make_keys(source: Path) -> None:
    """Write the test TLS key and certificate of the unpacked tests once, before any run
    (the plugin keeps them: Scrapy's conftest would write new ones in every pytest
    process, not atomically, and a mock server could load a mismatched pair)."""
    subprocess.run(
        [sys.executable, "-c", "from tests.keys import generate_keys; generate_keys()"],
        cwd=source,
        check=True,
    )


def run_dir(source: Path, work: Path, name: str) -> Path:
    """A copy of the unpacked tests (``source``) for one run, ``work/name``: no run
    writes into another's files."""
    dest = work / name
    shutil.copytree(source, dest)
    return dest


def wants_pytest_twisted(work: Path) -> bool:
    """Whether Scrapy's own test environment (tox.ini) runs with pytest-twisted."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(work / "tox.ini", encoding="utf-8")
    deps = tox.get("test-requirements", "deps", fallback="")
    return "pytest-twisted" in deps


def provide_requirements(twisted: bool) -> Path:
    """Make what the selected tests import beyond the ``test`` extra importable.

    The missing ones of :data:`REQUIREMENTS` are installed once into a directory of the
    cache, which only the suite's runs have on their path: pytest-twisted, loaded by
    every pytest that can import it, would install its own reactor in this package's
    test suite. Returns the directory.
    """
    target = CACHE / f"deps-py{sys.version_info.major}{sys.version_info.minor}"
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    wanted = {m: r for m, r in REQUIREMENTS.items() if twisted or m not in TWISTED_ONLY}
    missing = [r for m, r in wanted.items() if importlib.util.find_spec(m) is None]
    if missing:
        log(f"installing {', '.join(missing)} for the suite's runs")
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
        subprocess.run([*command, "--target", str(target), *missing], check=True)
    return target


def start_run(run: Run, args: argparse.Namespace, extra: list[str], url: str) -> None:
    """Start pytest over ``run.targets`` in ``run.mode``, its output going to its log."""
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    # the plugin, this checkout's scrapy_dist, the suite's own requirements
    paths = [str(ROOT / "scripts"), str(ROOT), str(args.deps), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["SCRAPY_SUITE_MODE"] = run.mode
    env["SCRAPY_SUITE_REDIS_URL"] = url
    env["SCRAPY_SUITE_RESULTS"] = str(run.results_file)
    if args.queue:
        env["SCRAPY_SUITE_QUEUE"] = args.queue
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "scrapy_suite_plugin",
        f"--timeout={args.timeout}",
        "--durations=5",
        *extra,
        *run.targets,
    ]
    if run.workers:
        command += ["-n", str(run.workers)]
    run.started = time.monotonic()
    with run.log_file.open("wb") as out:
        run.process = subprocess.Popen(command, cwd=run.work, env=env, stdout=out, stderr=out)


def finish_run(run: Run, deadline: float) -> None:
    """Wait for the run (killing it past ``deadline``) and read its outcomes."""
    assert run.process is not None
    try:
        run.process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        run.process.kill()
        run.process.wait()
        log(f"  {run.name}: killed after {deadline - run.started:.0f} s")
    run.seconds = time.monotonic() - run.started
    if run.results_file.exists():
        raw = json.loads(run.results_file.read_text(encoding="utf-8"))
        run.results = {test: (outcome, why) for test, (outcome, why) in raw.items()}
    else:
        tail = run.log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-20:]
        log(f"  {run.name}: pytest wrote no results; its output ends with:")
        for line in tail:
            log(f"    {line}")


def suspects(plain: Run, swapped: Run) -> list[str]:
    """The tests that pass plain and not in ``swapped``, less the known failures."""
    return [
        test
        for test, (outcome, _) in sorted(plain.results.items())
        if outcome == "passed"
        and swapped.results.get(test, ("not run", ""))[0] != "passed"
        and test not in KNOWN_FAILURES
    ]


def take_reruns(swapped: Run, rerun: Run) -> None:
    """Count as passed the tests of ``swapped`` that passed when run again alone."""
    for test, (outcome, _) in rerun.results.items():
        if outcome == "passed" and swapped.results.get(test, ("",))[0] != "passed":
            swapped.results[test] = ("passed", "")
            swapped.flaky.append(test)


def compare(plain: Run, swapped: Run) -> list[str]:
    """Report ``swapped`` against ``plain``; return its unexpected failures."""
    passing = sorted(t for t, (outcome, _) in plain.results.items() if outcome == "passed")
    failed = [t for t in passing if swapped.results.get(t, ("not run", ""))[0] != "passed"]
    unexpected = [t for t in failed if t not in KNOWN_FAILURES]
    known = [t for t in failed if t in KNOWN_FAILURES]
    fixed = [t for t in KNOWN_FAILURES if t in passing and t not in failed]
    log(
        f"{swapped.mode}: {len(passing) - len(failed)} of the {len(passing)} tests that pass "
        f"on Scrapy pass with scrapy_dist; {len(known)} known failure(s), "
        f"{len(unexpected)} unexpected ({swapped.seconds:.0f} s)"
    )
    for test in unexpected:
        why = swapped.results.get(test, ("not run", "no outcome reported"))[1]
        log(f"  FAIL {test}: {why[:240]}")
    for test in known:
        log(f"  known failure {test}: {KNOWN_FAILURES[test]}")
    for test in fixed:
        log(f"  listed as a known failure but passes: {test}")
    for test in swapped.flaky:
        log(f"  failed beside the other runs, passed alone: {test}")
    return unexpected


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode",
        choices=(*SWAPPED_MODES, "both"),
        default="both",
        help="how scrapy_dist is swapped in (default: both, each in its own run)",
    )
    parser.add_argument(
        "--modules",
        default="",
        help="comma-separated subset of the modules, e.g. test_crawl,test_engine",
    )
    parser.add_argument("-k", default="", help="pytest -k expression, for every run")
    parser.add_argument(
        "--queue",
        default="",
        help="SCHEDULER_QUEUE_CLASS of the swapped runs, e.g. scrapy_dist.slot_queue.SlotQueue",
    )
    parser.add_argument(
        "-n",
        dest="workers",
        type=int,
        default=2,
        help="pytest-xdist processes per run (0: none; default 2)",
    )
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument(
        "--reruns",
        type=int,
        default=10,
        help="run the unexpected failures of a mode again alone, if at most this many",
    )
    parser.add_argument(
        "--run-timeout", type=int, default=1500, help="seconds for all the runs together"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    version = importlib.metadata.version("scrapy")
    modes = SWAPPED_MODES if args.mode == "both" else (args.mode,)
    selected = [m.strip().removesuffix(".py") for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in selected if m not in MODULES]
    if unknown:
        log(f"unknown module(s): {', '.join(unknown)}; choose among {', '.join(MODULES)}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="scrapy-dist-suite-"))
    source = work / "sdist"
    try:
        unpack_tests(fetch_sdist(version), source)
        make_keys(source)
        absent_tools = [m for m in ("pytest_timeout", "xdist") if not importlib.util.find_spec(m)]
        if absent_tools:
            log(f"missing {', '.join(absent_tools)}: pip install -e '.[test]' (make install)")
            return 1
        twisted = wants_pytest_twisted(source)
        args.deps = provide_requirements(twisted)
        modules = [m for m in selected or MODULES if (source / "tests" / f"{m}.py").exists()]
        absent = [m for m in selected or MODULES if m not in modules]
        log(
            f"Scrapy {version}: {len(modules)} test modules"
            + (f" (not in this version: {', '.join(absent)})" if absent else "")
            + f"; modes plain, {', '.join(modes)}"
        )
        extra = [] if twisted else ["-p", "no:twisted"]  # its --reactor clashes with conftest
        if args.k:
            extra += ["-k", args.k]
        files = [f"tests/{m}.py" for m in modules]
        runs = [
            Run(mode, mode, run_dir(source, work, mode), files, args.workers)
            for mode in ("plain", *modes)
        ]
        with RedisServer() as server:
            for run in runs:
                start_run(run, args, extra, server.url)
            deadline = time.monotonic() + args.run_timeout
            for run in runs:
                finish_run(run, deadline)
            # A test that fails beside the other runs (timing under load) is run again
            # alone; not when many fail, which no rerun would change.
            reruns = [
                (
                    run,
                    Run(
                        run.mode,
                        f"{run.mode}-rerun",
                        run_dir(source, work, f"{run.mode}-rerun"),
                        tests,
                        0,
                    ),
                )
                for run in runs[1:]
                if 0 < len(tests := suspects(runs[0], run)) <= args.reruns
            ]
            for _, rerun in reruns:
                start_run(rerun, args, extra, server.url)
            for run, rerun in reruns:
                finish_run(rerun, deadline)
                take_reruns(run, rerun)
        plain, swapped = runs[0], runs[1:]
        outcomes = [o for o, _ in plain.results.values()]
        log(
            f"plain: {outcomes.count('passed')} passed, {outcomes.count('failed')} failed, "
            f"{outcomes.count('skipped')} skipped ({plain.seconds:.0f} s)"
        )
        unexpected = [test for run in swapped for test in compare(plain, run)]
        ok = bool(plain.results) and all(run.results for run in swapped) and not unexpected
        log(
            f"scrapy-suite (Scrapy {version}): {'OK' if ok else 'FAILED'} in "
            f"{time.monotonic() - started:.0f} s"
            + (f" (work dir kept: {work})" if args.keep else "")
        )
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
