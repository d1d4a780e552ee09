"""Run ``scrapy crawl`` worker processes of a Scrapy project, for demos and end-to-end tests.

Each worker is ``python -m scrapy crawl <spider> -s NAME=VALUE ...`` run in the
project directory, in its own process group, with Scrapy's log in ``worker-<n>.log``
and anything printed outside logging in ``worker-<n>.out``, both in ``log_dir``.
The workers import the same ``scrapy_dist`` package as the caller, and on Linux die
with the process that started them (:mod:`scrapy_dist.testing.processes`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_dist.testing.processes import die_with_parent

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from subprocess import CompletedProcess

__all__ = [
    "Worker",
    "alive",
    "final_stats",
    "run_cli",
    "start_workers",
    "stop_workers",
    "wait_ready",
    "wait_workers",
    "worker_command",
]

#: Directory that holds the ``scrapy_dist`` package the caller runs.
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]
#: Environment variables that would make ``scrapy`` ignore the project's ``scrapy.cfg``.
_PROJECT_VARIABLES = ("SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT")


@dataclass
class Worker:
    """One ``scrapy crawl`` subprocess.

    Attributes:
        index: Number of the worker, from 0.
        process: The subprocess.
        log_file: Scrapy's log (``LOG_FILE``).
        output_file: The process's stdout and stderr.
        stats_file: Where the project writes the final stats as JSON, if it does.
    """

    index: int
    process: subprocess.Popen[bytes]
    log_file: Path
    output_file: Path
    stats_file: Path | None = None

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """Exit status, or None while the process runs."""
        return self.process.poll()

    def stats(self) -> dict[str, Any]:
        """The final crawl stats the worker wrote to :attr:`stats_file`.

        Returns:
            The decoded JSON object.

        Raises:
            FileNotFoundError: The worker has no stats file (yet).
        """
        if self.stats_file is None:
            raise FileNotFoundError(f"worker {self.index} has no stats file")
        with self.stats_file.open(encoding="utf-8") as stream:
            stats: dict[str, Any] = json.load(stream)
        return stats

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the Scrapy log and of the process output."""
        parts = []
        for path in (self.log_file, self.output_file):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            tail = "\n".join(text.splitlines()[-lines:])
            if tail:
                parts.append(f"--- {path.name} ---\n{tail}")
        return "\n".join(parts) if parts else "(no output)"


def worker_command(
    spider: str,
    *,
    settings: Mapping[str, object] | None = None,
    spider_args: Mapping[str, object] | None = None,
    python: str | None = None,
) -> list[str]:
    """The command line of one worker.

    Args:
        spider: Spider name.
        settings: Setting overrides, each passed as ``-s NAME=str(value)``.
        spider_args: Spider arguments, each passed as ``-a NAME=str(value)``.
        python: Interpreter; default ``sys.executable``.

    Returns:
        ``[python, "-m", "scrapy", "crawl", spider, ...]``.
    """
    command = [python or sys.executable, "-m", "scrapy", "crawl", spider]
    for name, value in (settings or {}).items():
        command += ["-s", f"{name}={value}"]
    for name, value in (spider_args or {}).items():
        command += ["-a", f"{name}={value}"]
    return command


def _environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PROJECT_VARIABLES}
    path = [str(_PACKAGE_PARENT)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(extra or {})
    return env


def run_cli(*args: str, cwd: str | os.PathLike[str], timeout: float = 120) -> CompletedProcess[str]:
    """Run ``python -m scrapy_dist ARGS`` in ``cwd`` as an operator does, in a worker's
    environment (no ``SCRAPY_SETTINGS_MODULE``, this copy of scrapy_dist first on
    ``PYTHONPATH``), stdin empty (not a terminal); its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "scrapy_dist", *args],
        cwd=cwd,
        env=_environment(None),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_workers(
    count: int,
    *,
    project_dir: str | os.PathLike[str],
    spider: str,
    log_dir: str | os.PathLike[str],
    settings: Mapping[str, object] | None = None,
    spider_args: Mapping[str, object] | None = None,
    stats_setting: str | None = "DEMO_STATS_FILE",
    env: Mapping[str, str] | None = None,
    first_index: int = 0,
) -> list[Worker]:
    """Start ``count`` workers of ``spider`` in the Scrapy project at ``project_dir``.

    Every worker gets ``settings`` plus ``LOG_FILE=<log_dir>/worker-<n>.log`` and, if
    ``stats_setting`` is set, ``<stats_setting>=<log_dir>/stats-<n>.json``.

    Args:
        count: Number of workers.
        project_dir: Directory holding the project's ``scrapy.cfg`` (the workers' cwd).
        spider: Spider name.
        log_dir: Existing directory for logs and stats files.
        settings: Setting overrides common to all workers.
        spider_args: Spider arguments common to all workers.
        stats_setting: Name of the project setting that receives the stats file path,
            or None.
        env: Extra environment variables.
        first_index: Number of the first worker (to add workers to a running crawl).

    Returns:
        The started workers. If one cannot start, those already started are stopped.

    Raises:
        OSError: A process cannot be started.
    """
    log_path = Path(log_dir)
    environment = _environment(env)
    workers: list[Worker] = []
    try:
        for index in range(first_index, first_index + count):
            log_file = log_path / f"worker-{index}.log"
            output_file = log_path / f"worker-{index}.out"
            stats_file = log_path / f"stats-{index}.json" if stats_setting else None
            own_settings = dict(settings or {})
            own_settings["LOG_FILE"] = log_file
            if stats_setting and stats_file is not None:
                own_settings[stats_setting] = stats_file
            command = worker_command(spider, settings=own_settings, spider_args=spider_args)
            with output_file.open("wb") as output:
                process = subprocess.Popen(
                    command,
                    cwd=project_dir,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),  # noqa: PLW1509 (takes no lock: see its module)
                )
            workers.append(Worker(index, process, log_file, output_file, stats_file))
    except BaseException:
        stop_workers(workers, timeout=2.0)
        raise
    return workers


def final_stats(workers: Iterable[Worker]) -> list[dict[str, Any] | None]:
    """Each worker's final stats (:meth:`Worker.stats`), or None for a worker that
    wrote none (or an unreadable file)."""
    result: list[dict[str, Any] | None] = []
    for worker in workers:
        try:
            result.append(worker.stats())
        except (OSError, ValueError):
            result.append(None)
    return result


def alive(workers: Iterable[Worker]) -> list[Worker]:
    """The workers whose process is still running."""
    return [worker for worker in workers if worker.process.poll() is None]


def wait_ready(
    workers: Sequence[Worker], timeout: float = 60.0, marker: str = "Spider opened"
) -> None:
    """Wait until every worker's Scrapy log contains ``marker``.

    Args:
        workers: The workers.
        timeout: Seconds to wait in all.
        marker: Log text that means ready; Scrapy logs ``Spider opened`` when the
            engine opens the spider.

    Raises:
        RuntimeError: A worker exited first (the message has its log tail).
        TimeoutError: Not all workers were ready in time.
    """
    pending = list(workers)
    deadline = time.monotonic() + timeout
    while pending:
        for worker in list(pending):
            try:
                text = worker.log_file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            if marker in text:
                pending.remove(worker)
            elif worker.process.poll() is not None:
                raise RuntimeError(
                    f"worker {worker.index} exited with status {worker.process.returncode} "
                    f"before it was ready\n{worker.log_tail()}"
                )
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(str(worker.index) for worker in pending)
            raise TimeoutError(f"workers {names} not ready after {timeout:g} s")
        time.sleep(0.05)


def wait_workers(workers: Sequence[Worker], timeout: float | None = None) -> list[int]:
    """Wait until every worker has exited by itself.

    Args:
        workers: The workers.
        timeout: Seconds to wait in all; None waits forever.

    Returns:
        The exit statuses, in the order of ``workers``.

    Raises:
        TimeoutError: Some workers still run after ``timeout`` (they are left running).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    for worker in workers:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            worker.process.wait(remaining)
        except subprocess.TimeoutExpired:
            names = ", ".join(str(w.index) for w in alive(workers))
            raise TimeoutError(f"workers {names} still running after {timeout:g} s") from None
    return [worker.process.returncode for worker in workers]


def stop_workers(workers: Iterable[Worker], timeout: float = 10.0) -> None:
    """Stop the workers that still run: SIGTERM, then SIGKILL after ``timeout`` seconds.

    Scrapy shuts down gracefully on the first SIGTERM. Always reaps every process.

    Args:
        workers: The workers.
        timeout: Seconds to wait for the graceful shutdowns, in all.
    """
    workers = list(workers)
    for worker in alive(workers):
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for worker in workers:
        try:
            worker.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
            worker.process.wait()
