"""A throwaway Sentinel set for tests: a master, its replicas and the Sentinels watching them.

:class:`SentinelServers` starts a master, ``replicas`` replicas of it and ``sentinels``
Sentinel processes (each a :class:`~scrapy_dist.testing.RedisServer` on a free port), and
waits until every Sentinel names the same master and knows the other Sentinels and the
replicas. Its helpers crash and restart servers, run ``SENTINEL FAILOVER`` and tell which
server is master now. The kind of server follows :class:`~scrapy_dist.testing.RedisServer`'s
default; the Sentinels run the same binary without the kind's arguments (no modules).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis
from redis.sentinel import Sentinel

from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.server_kinds import default_kind

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

    from typing_extensions import Self

__all__ = ["SentinelServers"]

_HOST = "127.0.0.1"
_POLL = 0.05


class SentinelServers:
    """A local master, its replicas and the Sentinels that monitor them as ``service_name``.

    Every process listens on a free port of 127.0.0.1 (never 6379), keeps its files in a
    temporary directory, and is stopped by PID by :meth:`stop`, or at interpreter exit if
    the owner forgets. Use it as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        service_name: The name the Sentinels monitor the master under.
        replicas: Number of replicas of the first master.
        sentinels: Number of Sentinels.
        quorum: Sentinels that must agree the master is down before a failover.
        down_after_ms: ``down-after-milliseconds``: silence after which a Sentinel
            considers a server down.
        failover_timeout_ms: ``failover-timeout`` of the Sentinels.
        appendonly: The master and replicas keep an AOF (``appendfsync always``).
        binary: Server binary of every process; default: the binary of the kind named
            by ``SCRAPY_DIST_TEST_REDIS_KIND`` (see :mod:`scrapy_dist.testing.server_kinds`).
        extra_args: More arguments for the master and replicas (not the Sentinels).
    """

    def __init__(
        self,
        *,
        service_name: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 2000,
        failover_timeout_ms: int = 10000,
        appendonly: bool = False,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if sentinels < 1 or not 1 <= quorum <= sentinels or replicas < 0:
            raise ValueError(f"bad Sentinel set: {sentinels} sentinels, quorum {quorum}")
        if binary is None:
            kind = default_kind()
            binary, extra_args = kind.binary, (*kind.extra_args, *extra_args)
        self.service_name = service_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self._binary = binary
        self._extra_args = (*extra_args, "--repl-diskless-sync-delay", "0")
        self.servers: list[RedisServer] = [
            RedisServer(binary=binary, appendonly=appendonly, extra_args=self._extra_args)
            for _ in range(1 + replicas)
        ]
        self.sentinels: list[RedisServer] = []
        self._sentinel_count = sentinels

    # Lifecycle

    def start(self, timeout: float = 60.0) -> Self:
        """Start the master, its replicas and the Sentinels; wait until they all agree.

        Args:
            timeout: Seconds to wait for replication and the Sentinels' agreement.

        Returns:
            This object.

        Raises:
            RuntimeError: A process did not start, or they did not agree in time (every
                process is stopped then).
        """
        deadline = time.monotonic() + timeout
        try:
            master, *replicas = self.servers
            master.start()
            for replica in replicas:
                replica.extra_args = (*self._extra_args, "--replicaof", _HOST, str(master.port))
                replica.start()
            self._wait(deadline, "the replicas to sync", lambda: self._synced(master))
            config = [
                f"sentinel monitor {self.service_name} {_HOST} {master.port} {self.quorum}",
                f"sentinel down-after-milliseconds {self.service_name} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service_name} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.service_name} 1",
            ]
            self.sentinels = [
                RedisServer(binary=self._binary, config=config, extra_args=["--sentinel"])
                for _ in range(self._sentinel_count)
            ]
            for sentinel in self.sentinels:
                sentinel.start()
            self.wait_agreed(max(deadline - time.monotonic(), 1.0))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL) and delete its directory. Idempotent."""
        for server in (*self.sentinels, *self.servers):
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # Clients and addresses

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every Sentinel, for ``REDIS_SENTINELS``-style settings."""
        return [(_HOST, sentinel.port) for sentinel in self.sentinels]

    def client(self, **options: Any) -> Sentinel:
        """A new redis-py ``Sentinel`` of the running Sentinels (``.master_for(name)``...).

        Args:
            options: Keyword arguments of ``redis.sentinel.Sentinel`` (``socket_timeout``,
                ``decode_responses``...), also used for the connections it makes.
        """
        running = [(_HOST, s.port) for s in self.sentinels if s.pid is not None]
        return Sentinel(running, **options)

    # Topology

    def master_address(self, sentinel: RedisServer) -> tuple[str, int]:
        """The master's address as ``sentinel`` names it (``GET-MASTER-ADDR-BY-NAME``)."""
        with sentinel.client(decode_responses=True, socket_timeout=5) as client:
            reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        host, port = reply
        return str(host), int(port)

    def master(self) -> RedisServer:
        """The server every running Sentinel names as master now.

        Raises:
            RuntimeError: The running Sentinels name different masters, or one this set
                did not start.
        """
        addresses = {self.master_address(s) for s in self.sentinels if s.pid is not None}
        if len(addresses) != 1:
            raise RuntimeError(f"the Sentinels disagree on the master: {sorted(addresses)}")
        ((_, port),) = addresses
        return self.server_at(port)

    def replicas(self) -> list[RedisServer]:
        """The servers other than the current master (running or not)."""
        master = self.master()
        return [server for server in self.servers if server is not master]

    def server_at(self, port: int) -> RedisServer:
        """The master or replica listening on ``port``.

        Raises:
            KeyError: None of this set's servers has that port.
        """
        for server in self.servers:
            if _port_of(server) == port:
                return server
        raise KeyError(port)

    @staticmethod
    def role(server: RedisServer) -> str:
        """``master`` or ``slave``, as ``server`` reports itself (``INFO replication``)."""
        with server.client(decode_responses=True, socket_timeout=5) as client:
            return str(client.info("replication")["role"])

    # Health and faults

    def agreed(self) -> bool:
        """Whether the set is steady: one master named by every running Sentinel.

        Every running Sentinel must name the same running master, flag it up with no
        failover in progress, know every other running Sentinel and list every running
        replica (flagged up) under that master; and every running replica must replicate
        that master with its link up.
        """
        running = [s for s in self.sentinels if s.pid is not None]
        try:
            master = self.master()
        except (KeyError, RuntimeError):
            return False
        if master.pid is None or self.role(master) != "master":
            return False
        replicas = [r for r in self.servers if r is not master and r.pid is not None]
        for sentinel in running:
            with sentinel.client(decode_responses=True, socket_timeout=5) as client:
                state = _pairs(client.execute_command("SENTINEL", "MASTER", self.service_name))
                if state.get("flags") != "master":
                    return False
                if int(state.get("num-other-sentinels", -1)) < len(running) - 1:
                    return False
                known = client.execute_command("SENTINEL", "REPLICAS", self.service_name)
            # A Sentinel reads a replica's master and link state from INFO every 10 s:
            # they are checked on the replica itself below, not waited for here.
            up = {
                int(entry["port"]) for entry in map(_pairs, known) if entry.get("flags") == "slave"
            }
            if not {r.port for r in replicas} <= up:
                return False
        return all(self._replicates(replica, master) for replica in replicas)

    def wait_agreed(self, timeout: float = 30.0) -> None:
        """Wait until :meth:`agreed`.

        Raises:
            RuntimeError: Not agreed within ``timeout`` seconds.
        """
        self._wait(time.monotonic() + timeout, "the Sentinels to agree", self._agreed)

    def _agreed(self) -> bool:
        try:
            return self.agreed()
        except (redis.ConnectionError, redis.TimeoutError):
            return False

    def failover(self, timeout: float = 60.0) -> RedisServer:
        """Run ``SENTINEL FAILOVER`` and wait until every Sentinel names a new master.

        Returns once every running Sentinel names the same new master, with no failover
        in progress, and that server reports itself master. As in production, the old
        master still takes writes until the Sentinels turn it into a replica, which
        takes them about 10 s (their INFO period): call :meth:`wait_agreed` to wait
        for that too. An attempt the Sentinels abandon (a replica they found not ready
        on a loaded machine: they give up after ``failover-timeout``) is asked for
        again.

        Returns:
            The new master.

        Raises:
            RuntimeError: No new master was named within ``timeout`` seconds.
        """
        old = self.master()
        deadline = time.monotonic() + timeout
        attempt = self.failover_timeout_ms / 1000 + 2
        while True:
            sentinel = next(s for s in self.sentinels if s.pid is not None)
            with sentinel.client(socket_timeout=5) as client:
                try:
                    client.execute_command("SENTINEL", "FAILOVER", self.service_name)
                except redis.ResponseError as e:  # INPROG: the last attempt goes on
                    if "INPROG" not in str(e):
                        raise
            try:
                self._wait(
                    min(deadline, time.monotonic() + attempt),
                    "a new master",
                    lambda: self._moved_from(old),
                )
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                continue
            return self.master()

    def _moved_from(self, old: RedisServer) -> bool:
        try:
            master = self.master()
            if master is old or self.role(master) != "master":
                return False
            for sentinel in self.sentinels:
                if sentinel.pid is None:
                    continue
                with sentinel.client(decode_responses=True, socket_timeout=5) as client:
                    reply = client.execute_command("SENTINEL", "MASTER", self.service_name)
                if _pairs(reply).get("flags") != "master":
                    return False
        except (KeyError, RuntimeError, redis.ConnectionError, redis.TimeoutError):
            return False
        return True

    def kill(self, server: RedisServer) -> None:
        """Crash ``server`` (a master, replica or Sentinel) with SIGKILL."""
        server.kill()

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start ``server`` again on the same port and directory; wait until :meth:`agreed`.

        A master that was failed over while down is turned into a replica by the Sentinels.
        """
        server.restart()
        self.wait_agreed(timeout)

    def _synced(self, master: RedisServer) -> bool:
        replicas = [r for r in self.servers if r is not master]
        return all(self._replicates(replica, master) for replica in replicas)

    @staticmethod
    def _replicates(replica: RedisServer, master: RedisServer) -> bool:
        with replica.client(decode_responses=True, socket_timeout=5) as client:
            info = client.info("replication")
        return (
            info.get("role") == "slave"
            and int(info.get("master_port", -1)) == master.port
            and info.get("master_link_status") == "up"
        )

    def _wait(self, deadline: float, what: str, done: Callable[[], bool]) -> None:
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}: {self!r}")
            time.sleep(_POLL)

    def __repr__(self) -> str:
        servers = [_port_of(s) for s in self.servers]
        sentinels = [_port_of(s) for s in self.sentinels]
        return f"<SentinelServers servers={servers} sentinels={sentinels}>"


def _port_of(server: RedisServer) -> int | None:
    try:
        return server.port
    except RuntimeError:  # never started
        return None


def _pairs(reply: Any) -> dict[str, str]:
    """A flat ``[name, value, ...]`` reply (or a RESP3 map) as a dict of strings."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    items = [str(item) for item in reply]
    return dict(zip(items[::2], items[1::2], strict=False))
