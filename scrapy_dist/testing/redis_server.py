"""A throwaway ``redis-server`` process for tests, demos and benchmarks.

:class:`RedisServer` runs a private server on a free port of 127.0.0.1 with its data in
a temporary directory, and can stop, crash (:meth:`RedisServer.kill`) and restart it
on the same port and directory, which is what fault-injection tests need. On Linux the
server dies with the process that started it, even one killed with SIGKILL
(:mod:`scrapy_dist.testing.processes`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scrapy_dist.testing.processes import die_with_parent
from scrapy_dist.testing.server_kinds import default_kind, parse_version

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

    from typing_extensions import Self

    from scrapy_dist.testing.server_kinds import ServerKind

__all__ = [
    "MIN_REDIS_VERSION",
    "RedisServer",
    "free_port",
]

#: Oldest server version the package supports (``LPOP key count``, ``ZRANGE ... REV``...).
MIN_REDIS_VERSION = (6, 2)

_HOST = "127.0.0.1"
_FORBIDDEN_PORTS = frozenset({6379})
_START_ATTEMPTS = 5
_LOG_NAME = "redis.log"
_CONFIG_NAME = "redis.conf"
_LOG_TAIL_LINES = 20


def free_port() -> int:
    """Pick a TCP port of 127.0.0.1 that is free right now (never 6379).

    Returns:
        The port. Another process may take it before the caller binds it.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((_HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in _FORBIDDEN_PORTS:
            return port


def port_is_free(port: int) -> bool:
    """Whether TCP ``port`` of 127.0.0.1 can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
    return True


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Send SIGTERM, wait up to ``timeout`` seconds, then SIGKILL and reap."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait()


class RedisServer:
    """A private ``redis-server`` subprocess bound to 127.0.0.1.

    The server never uses port 6379, saves no RDB snapshot, and runs in its own
    process group so that Ctrl-C in a terminal reaches only the Python parent, which
    stops it. Use it as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        binary: Path of the server binary. Default: the binary of the kind of server
            (:func:`~scrapy_dist.testing.server_kinds.default_kind`) named by the
            environment variable ``SCRAPY_DIST_TEST_REDIS_KIND``, ``redis`` when unset;
            that kind's arguments (RedisBloom's ``--loadmodule``) then come first.
        directory: Working directory of the server (log, AOF). Default: a fresh
            temporary directory, deleted by :meth:`stop` (or at interpreter exit).
        appendonly: Enable the append-only file with ``appendfsync always``, so data
            written before :meth:`kill` survives :meth:`restart`.
        port: Fixed port. Default: a free port, chosen by :meth:`start`.
        extra_args: More ``redis-server`` command-line arguments, appended last.
        config: Lines of a configuration file, written to ``redis.conf`` in the
            directory by :meth:`start` and named first on the command line; a server
            that rewrites its file (a Sentinel) finds it again at :meth:`restart`.

    Raises:
        RedisServerNotFound: ``binary`` is None and no server binary (or module) is found.
        ValueError: ``port`` is 6379 (reserved for a real server), or
            ``SCRAPY_DIST_TEST_REDIS_KIND`` names no known kind.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        directory: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        config: Sequence[str] = (),
    ) -> None:
        if port is not None and port in _FORBIDDEN_PORTS:
            raise ValueError(f"refusing to run a throwaway redis-server on port {port}")
        if binary is None:
            kind = default_kind()
            binary, extra_args = kind.binary, (*kind.extra_args, *extra_args)
        self.binary = binary
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)
        self.config = tuple(config)
        self._fixed_port = port
        self._port = port
        self._directory = Path(directory) if directory is not None else None
        # Deletes a temporary directory this object made: called by stop(), or at exit.
        self._remove_directory: weakref.finalize[..., RedisServer] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes], float], RedisServer] | None
        self._finalizer = None

    @classmethod
    def of_kind(
        cls, kind: ServerKind, *, extra_args: Sequence[str] = (), **options: Any
    ) -> RedisServer:
        """A new, not yet started server of ``kind``.

        Args:
            kind: The server binary and the arguments it always gets.
            extra_args: More command-line arguments, after the kind's own.
            options: Other keyword arguments of :class:`RedisServer`.
        """
        arguments = (*kind.extra_args, *extra_args)
        return cls(binary=kind.binary, extra_args=arguments, **options)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{_HOST}:{self.port}/0"

    @property
    def port(self) -> int:
        """The server's port.

        Raises:
            RuntimeError: No port was given and the server was never started.
        """
        if self._port is None:
            raise RuntimeError("RedisServer has no port yet: call start() first")
        return self._port

    @property
    def pid(self) -> int | None:
        """PID of the running server, or None when it is not running."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    @property
    def directory(self) -> Path:
        """The server's working directory (log file, AOF).

        Raises:
            RuntimeError: No directory was given and the server was never started.
        """
        if self._directory is None:
            raise RuntimeError("RedisServer has no directory yet: call start() first")
        return self._directory

    @property
    def log_file(self) -> Path:
        """Path of the server's log file."""
        return self.directory / _LOG_NAME

    def client(
        self, *, decode_responses: bool = False, socket_timeout: float | None = 10.0
    ) -> redis.Redis:
        """A new redis-py client of this server, database 0.

        Args:
            decode_responses: Return ``str`` instead of ``bytes``.
            socket_timeout: Seconds a command may take.

        Returns:
            The client; the caller closes it.
        """
        return redis.Redis(
            host=_HOST,
            port=self.port,
            db=0,
            decode_responses=decode_responses,
            socket_timeout=socket_timeout,
        )

    def start(self, timeout: float = 10.0) -> Self:
        """Start the server and wait until it answers PING.

        Does nothing if it is already running. Without a fixed port, a port that was
        taken in the meantime is replaced by another one, up to 5 attempts.

        Args:
            timeout: Seconds to wait for each attempt to answer.

        Returns:
            This object.

        Raises:
            RuntimeError: The server did not start (the message ends with the tail of
                its log), or its version is older than 6.2.
        """
        if self.pid is not None:
            return self
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="scrapy-dist-redis-"))
            # Made before the process's finalizer, so run after it at interpreter exit.
            self._remove_directory = weakref.finalize(
                self, shutil.rmtree, self._directory, ignore_errors=True
            )
        self._directory.mkdir(parents=True, exist_ok=True)
        if self.config:
            text = "".join(f"{line}\n" for line in self.config)
            (self._directory / _CONFIG_NAME).write_text(text, encoding="utf-8")
        for attempt in range(_START_ATTEMPTS):
            port = self._port if self._port is not None else self._free_port()
            if self._launch(port, timeout):
                self._port = port
                break
            if self._fixed_port is not None or attempt == _START_ATTEMPTS - 1:
                raise RuntimeError(
                    f"redis-server could not listen on {_HOST}:{port}: port in use\n"
                    f"{self._log_tail()}"
                )
            self._port = None
        self._check_version()
        return self

    def _command(self, port: int) -> list[str]:
        command = [self.binary]
        if self.config:
            command.append(str(self.directory / _CONFIG_NAME))
        command += [
            "--port",
            str(port),
            "--bind",
            _HOST,
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
        ]
        if self.appendonly:
            command += ["--appendfsync", "always"]
        command += ["--daemonize", "no", "--logfile", _LOG_NAME, "--protected-mode", "no"]
        command += self.extra_args
        return command

    def _free_port(self) -> int:
        """A free port for a fresh start (:func:`free_port`)."""
        return free_port()

    def _launch(self, port: int, timeout: float) -> bool:
        """Run the server on ``port`` and wait for PING.

        Returns:
            True once it answers; False if it exited because the port was taken.

        Raises:
            RuntimeError: It exited for another reason, or did not answer in time.
        """
        log_size = self.log_file.stat().st_size if self.log_file.exists() else 0
        process = subprocess.Popen(
            self._command(port),
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 (takes no lock: see its module)
        )
        self._process = process
        if self._finalizer is not None:
            self._finalizer.detach()
        # Never leave a server behind, even if the owner forgets stop().
        self._finalizer = weakref.finalize(self, _terminate, process, 1.0)
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                self._process = None
                new_log = self._read_log()[log_size:]
                if "already in use" in new_log or "Address in use" in new_log:
                    return False
                raise RuntimeError(
                    f"redis-server exited with status {process.returncode} "
                    f"while starting on {_HOST}:{port}\n{self._log_tail()}"
                )
            if self._answers(port, process.pid):
                return True
            if time.monotonic() > deadline and process.poll() is None:
                _terminate(process, 1.0)
                self._process = None
                raise RuntimeError(
                    f"redis-server did not answer PING on {_HOST}:{port} within "
                    f"{timeout:g} s\n{self._log_tail()}"
                )
            time.sleep(0.02)

    @staticmethod
    def _answers(port: int, pid: int) -> bool:
        """Whether our own process (not another server on that port) answers PING."""
        client = redis.Redis(
            host=_HOST,
            port=port,
            socket_connect_timeout=0.5,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            info = client.info("server")
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False
        finally:
            client.close()
        return int(info.get("process_id", -1)) == pid

    def _check_version(self) -> None:
        with self.client(socket_timeout=5) as client:
            version = str(client.info("server")["redis_version"])
        if parse_version(version) < MIN_REDIS_VERSION:
            self.stop()
            wanted = ".".join(map(str, MIN_REDIS_VERSION))
            raise RuntimeError(f"redis-server {version} is too old: version >= {wanted} needed")

    def _read_log(self) -> str:
        try:
            return self.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _log_tail(self) -> str:
        lines = self._read_log().splitlines()[-_LOG_TAIL_LINES:]
        return "\n".join(lines) if lines else "(redis.log is empty)"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and delete its temporary directory.

        Idempotent. A directory given to the constructor is kept.
        """
        self._stop_process(graceful=True)
        if self._remove_directory is not None:
            self._remove_directory()
            self._remove_directory = None
            self._directory = None
        self._port = self._fixed_port

    def kill(self) -> None:
        """Crash the server now with SIGKILL and wait for it to exit.

        Port and directory are kept, so :meth:`restart` brings it back with its AOF.
        """
        self._stop_process(graceful=False)

    def restart(self, timeout: float = 10.0, down: float = 0.0) -> None:
        """Start the server again on the same port and directory, stopping it first if running.

        With ``appendonly=True`` the AOF is reloaded, so writes acknowledged before a
        :meth:`kill` are back.

        Args:
            timeout: Seconds to wait for the server to answer.
            down: Seconds to stay stopped before starting again (an outage clients
                are sure to meet, where a quick restart can pass unseen between calls).

        Raises:
            RuntimeError: The server cannot start again (port taken, bad AOF...).
        """
        port = self._port
        self._stop_process(graceful=True)
        time.sleep(down)
        if port is None:
            self.start(timeout)
            return
        if not self._launch(port, timeout):
            raise RuntimeError(
                f"redis-server could not listen again on {_HOST}:{port}: port in use\n"
                f"{self._log_tail()}"
            )
        self._check_version()

    def _stop_process(self, *, graceful: bool) -> None:
        process, self._process = self._process, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if process is None:
            return
        if graceful:
            _terminate(process, 5.0)
        elif process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait()
        else:
            process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RedisServer port={self._port} pid={self.pid}>"
