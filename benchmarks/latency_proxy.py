"""A TCP proxy on 127.0.0.1 that adds a fixed round-trip time, to put Redis "on another host".

Every chunk sent by the client is held for ``rtt`` seconds before it is forwarded to the
upstream server; replies come back at once. So each request/response exchange (a command,
or a whole pipeline) costs one ``rtt`` more than on loopback, while independent
connections and pipelined bytes do not wait for each other: latency, not bandwidth.

Threads and ``time.sleep`` keep the delay within ~0.1 ms of ``rtt`` (asyncio timers round
up to whole milliseconds); :func:`measure_rtt` times a ``PING`` loop so benchmarks report
what the proxy really added.

Run ``python benchmarks/latency_proxy.py --upstream 127.0.0.1:6390 --rtt-ms 1``; it prints
``listening on 127.0.0.1:<port>`` once ready and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from collections.abc import Sequence

    from typing_extensions import Self

__all__ = ["LatencyProxy", "measure_rtt", "serve"]

_CHUNK = 256 * 1024
_HOST = "127.0.0.1"


def _delayed_copy(source: socket.socket, target: socket.socket, delay: float) -> None:
    """Copy ``source`` to ``target``, each chunk ``delay`` seconds after it arrived, in order.

    A reader thread stamps chunks as they arrive; this thread sends each one when it is
    due (``time.sleep`` is precise to ~0.1 ms, unlike asyncio's millisecond timers).
    """
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def read() -> None:
        try:
            while data := source.recv(_CHUNK):
                chunks.put((time.perf_counter() + delay, data))
        except OSError:
            pass
        chunks.put((0.0, b""))

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            due, data = chunks.get()
            if not data:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            target.sendall(data)
    except OSError:
        pass
    finally:
        _shut(target)
        _shut(source)


def _copy(source: socket.socket, target: socket.socket) -> None:
    """Copy ``source`` to ``target`` as fast as it comes."""
    try:
        while data := source.recv(_CHUNK):
            target.sendall(data)
    except OSError:
        pass
    finally:
        _shut(target)
        _shut(source)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def serve(upstream_host: str, upstream_port: int, rtt: float, port: int = 0) -> None:
    """Proxy ``127.0.0.1:port`` to the upstream with ``rtt`` seconds added per exchange.

    Prints ``listening on 127.0.0.1:<port>`` once serving; runs until the process ends.
    Each connection gets three threads: client reader, delayed sender, reply copier.
    """
    listener = socket.create_server((_HOST, port), backlog=128)
    sys.stdout.write(f"listening on {_HOST}:{listener.getsockname()[1]}\n")
    sys.stdout.flush()
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection((upstream_host, upstream_port))
        except OSError:
            client.close()
            continue
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_delayed_copy, args=(client, upstream, rtt), daemon=True).start()
        threading.Thread(target=_copy, args=(upstream, client), daemon=True).start()


def measure_rtt(port: int, count: int = 300) -> float:
    """Median seconds of one ``PING`` exchange with the Redis server at ``127.0.0.1:port``."""
    client = redis.Redis(host=_HOST, port=port, socket_timeout=5)
    try:
        client.ping()
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            client.ping()
            samples.append(time.perf_counter() - started)
    finally:
        client.close()
    return statistics.median(samples)


class LatencyProxy:
    """This module run as a subprocess (its CPU is then not the benchmark's), as a context manager.

    Args:
        upstream_port: Port of the Redis server on 127.0.0.1.
        rtt: Seconds added to each exchange.
    """

    def __init__(self, upstream_port: int, rtt: float) -> None:
        self.upstream_port = upstream_port
        self.rtt = rtt
        self.port = 0
        self._process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<proxy port>/0``."""
        return f"redis://{_HOST}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> Self:
        """Start the proxy and wait for its ``listening on`` line.

        Raises:
            RuntimeError: It exited or did not report its port in time.
        """
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--upstream",
            f"{_HOST}:{self.upstream_port}",
            "--rtt-ms",
            str(self.rtt * 1000),
        ]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self._process.stdout is not None
        deadline = time.monotonic() + timeout
        line = self._process.stdout.readline()
        if not line.startswith("listening on ") or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"latency proxy did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def stop(self) -> None:
        """Stop the proxy (SIGTERM, then SIGKILL after 3 s). Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="TCP proxy adding a fixed round-trip time.")
    parser.add_argument("--upstream", required=True, help="host:port of the server")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="milliseconds added (1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (a free one)")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        serve(host, int(port), args.rtt_ms / 1000, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
