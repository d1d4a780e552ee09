"""A throwaway Redis Cluster for tests: masters with replicas, each a local server process.

:class:`ClusterServers` starts ``masters * (1 + replicas_per_master)`` cluster-enabled
servers (:class:`ClusterNodeServer`, a :class:`~scrapy_dist.testing.RedisServer` whose
cluster bus also listens on a free port), joins them from Python (``CLUSTER MEET``,
``ADDSLOTS``, ``REPLICATE``: no ``redis-cli`` needed) and waits until every node reports
``cluster_state:ok``. Its helpers crash, restart and fail over nodes, and tell which node
is master now, which is what failover tests need. Needs Redis >= 7.0 (``cluster-port``)
or Valkey; the kind of server follows :class:`~scrapy_dist.testing.RedisServer`'s default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import redis
from redis.cluster import ClusterNode as _StartupNode
from redis.cluster import RedisCluster
from redis.crc import key_slot

from scrapy_dist.testing.redis_server import RedisServer, free_port, port_is_free
from scrapy_dist.testing.server_kinds import binary_version

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

    from typing_extensions import Self

__all__ = ["ClusterNodeServer", "ClusterServers", "NodeView"]

_HOST = "127.0.0.1"
_SLOTS = 16384
_POLL = 0.05
#: Where a server older than Redis 7 (no ``cluster-port``) puts its cluster bus port.
_BUS_OFFSET = 10000


class ClusterNodeServer(RedisServer):
    """A cluster-enabled :class:`RedisServer`; its cluster bus listens on a free port too.

    The bus port is chosen at each fresh start and kept by :meth:`restart`, so the other
    nodes find a restarted node where they knew it.

    Args:
        node_timeout_ms: ``cluster-node-timeout``: how long a node may be unreachable
            before the others fail it over.
        options: Keyword arguments of :class:`RedisServer`.
    """

    def __init__(self, *, node_timeout_ms: int = 3000, **options: Any) -> None:
        super().__init__(**options)
        self.node_timeout_ms = node_timeout_ms
        self._bus_port: int | None = None

    @property
    def bus_port(self) -> int:
        """The cluster bus port.

        Raises:
            RuntimeError: The server was never started.
        """
        if self._bus_port is None:
            raise RuntimeError("ClusterNodeServer has no bus port yet: call start() first")
        return self._bus_port

    @property
    def node_id(self) -> str:
        """The node's cluster id (``CLUSTER MYID``); the server must be running."""
        with self.client(decode_responses=True, socket_timeout=5) as client:
            return str(client.execute_command("CLUSTER", "MYID"))

    @property
    def _fixed_bus_offset(self) -> bool:
        """Whether the server predates ``cluster-port`` (Redis < 7): its bus port is
        then its port + 10000."""
        return binary_version(self.binary) < (7,)

    def _free_port(self) -> int:
        if not self._fixed_bus_offset:
            return super()._free_port()
        while True:  # a port whose bus port (+ 10000) exists and is free too
            port = free_port()
            if port + _BUS_OFFSET <= 65535 and port_is_free(port + _BUS_OFFSET):
                return port

    def _command(self, port: int) -> list[str]:
        if self._fixed_bus_offset:
            self._bus_port = port + _BUS_OFFSET
            bus = []
        else:
            if self._port is None or self._bus_port is None:
                # A fresh start (not a restart): take a new free bus port, as for the port.
                self._bus_port = free_port()
                while self._bus_port == port:
                    self._bus_port = free_port()
            bus = ["--cluster-port", str(self._bus_port)]
        return [
            *super()._command(port),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            *bus,
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # Any replica may take over, however long it was cut off, and none moves
            # to another master: the layout stays the one the test built.
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-allow-replica-migration",
            "no",
            "--repl-diskless-sync-delay",
            "0",
        ]


@dataclass(frozen=True)
class NodeView:
    """One node as another node sees it (a line of ``CLUSTER NODES``).

    Attributes:
        node_id: The node's cluster id.
        port: Its client port.
        flags: ``master``, ``slave``, ``myself``, ``fail``, ``fail?``, ``handshake``...
        master_id: Its master's id when it is a replica, else None.
        connected: Whether the cluster bus link to it is up.
        slots: The slot ranges it serves, ``(first, last)`` inclusive.
    """

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    connected: bool
    slots: tuple[tuple[int, int], ...]

    @property
    def failing(self) -> bool:
        """Whether it is flagged ``fail`` or ``fail?`` (or has no address)."""
        return bool(self.flags & {"fail", "fail?", "noaddr"})

    @classmethod
    def parse(cls, line: str) -> NodeView:
        """Parse one line of ``CLUSTER NODES``."""
        fields = line.split()
        address = fields[1].split(",")[0].split("@")[0]
        slots: list[tuple[int, int]] = []
        for item in fields[8:]:
            if item.startswith("["):  # a slot being imported or migrated
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        return cls(
            node_id=fields[0],
            port=int(address.rpartition(":")[2] or 0),
            flags=frozenset(fields[2].split(",")),
            master_id=None if fields[3] == "-" else fields[3],
            connected=fields[7] == "connected",
            slots=tuple(slots),
        )


def _owners(views: dict[str, NodeView]) -> dict[tuple[int, int], int]:
    """Slot range -> port of the master serving it, in these views."""
    return {
        slots: view.port
        for view in views.values()
        if "master" in view.flags and not view.failing
        for slots in view.slots
    }


def _layout(views: dict[str, NodeView]) -> dict[int, int | None]:
    """Port of each node -> port of its master (None for a master), in these views."""
    return {
        view.port: views[view.master_id].port if view.master_id in views else None
        for view in views.values()
    }


class ClusterServers:
    """A local Redis Cluster: ``masters`` masters, each with ``replicas_per_master`` replicas.

    Nodes listen on free ports of 127.0.0.1 (never 6379), keep their data in temporary
    directories, and are stopped by PID by :meth:`stop`, or at interpreter exit if the
    owner forgets. Use it as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        masters: Number of masters; the 16384 slots are split evenly among them.
        replicas_per_master: Replicas of each master.
        node_timeout_ms: ``cluster-node-timeout`` of every node.
        appendonly: Each node keeps an AOF (``appendfsync always``), so a node killed
            and restarted comes back with its data.
        binary: Server binary; default: :class:`RedisServer`'s.
        extra_args: More server arguments for every node.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 3000,
        appendonly: bool = False,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if masters < 1 or masters > _SLOTS or replicas_per_master < 0:
            raise ValueError(f"bad cluster shape: {masters} masters x {replicas_per_master}")
        self._master_count = masters
        self.nodes: list[ClusterNodeServer] = [
            ClusterNodeServer(
                node_timeout_ms=node_timeout_ms,
                appendonly=appendonly,
                binary=binary,
                extra_args=extra_args,
            )
            for _ in range(masters * (1 + replicas_per_master))
        ]

    # Lifecycle

    def start(self, timeout: float = 60.0) -> Self:
        """Start every node, build the cluster and wait until it is healthy.

        Args:
            timeout: Seconds to wait for the cluster to become healthy.

        Returns:
            This object.

        Raises:
            RuntimeError: A node did not start, or the cluster was not healthy in time
                (every node is stopped then).
        """
        try:
            for node in self.nodes:
                node.start()
            self._create(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, timeout: float) -> None:
        masters = self.nodes[: self._master_count]
        for epoch, node in enumerate(self.nodes, start=1):
            with node.client() as client:
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for index, node in enumerate(masters):
            first = index * _SLOTS // len(masters)
            last = (index + 1) * _SLOTS // len(masters) - 1
            with node.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
        with self.nodes[0].client() as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER", "MEET", _HOST, node.port, node.bus_port)
        ids = [node.node_id for node in self.nodes]
        deadline = time.monotonic() + timeout
        self._wait(deadline, "every node to know every other", lambda: self._all_met(ids))
        for index, node in enumerate(self.nodes[len(masters) :]):
            with node.client() as client:
                client.execute_command("CLUSTER", "REPLICATE", ids[index % len(masters)])
        self.wait_ok(max(deadline - time.monotonic(), 1.0))

    def _all_met(self, ids: Sequence[str]) -> bool:
        """Whether every node knows exactly ``ids``, each handshake done and link up."""
        for node in self.nodes:
            views = self.view(node)
            if set(views) != set(ids):
                return False
            for view in views.values():
                if "myself" in view.flags:
                    continue
                if view.flags & {"handshake", "noaddr"} or not view.connected:
                    return False
        return True

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and delete its directory. Idempotent."""
        for node in self.nodes:
            node.stop()

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
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node, for ``REDIS_STARTUP_NODES``-style settings."""
        return [(_HOST, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` of the first node (a cluster client finds the rest)."""
        return f"redis://{_HOST}:{self.nodes[0].port}"

    def client(self, *, decode_responses: bool = False, **options: Any) -> RedisCluster:
        """A new redis-py cluster client of this cluster; the caller closes it.

        Args:
            decode_responses: Return ``str`` instead of ``bytes``.
            options: More keyword arguments of ``redis.cluster.RedisCluster``.
        """
        # redis-py's ClusterNode has no type hints.
        nodes = [_StartupNode(_HOST, node.port) for node in self.running()]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=nodes, decode_responses=decode_responses, **options)

    # Topology

    def running(self) -> list[ClusterNodeServer]:
        """The nodes whose process is running."""
        return [node for node in self.nodes if node.pid is not None]

    def node_at(self, port: int) -> ClusterNodeServer:
        """The node listening on ``port``.

        Raises:
            KeyError: No node of this cluster has that port.
        """
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    def view(self, node: ClusterNodeServer) -> dict[str, NodeView]:
        """The cluster as ``node`` sees it (``CLUSTER NODES``), by node id."""
        with node.client(decode_responses=True, socket_timeout=5) as client:
            text = str(client.execute_command("CLUSTER", "NODES"))
        views = (NodeView.parse(line) for line in text.splitlines() if line.strip())
        return {view.node_id: view for view in views}

    def _owners(self, node: ClusterNodeServer) -> dict[tuple[int, int], int]:
        """Slot range -> port of the master serving it, as ``node`` sees it."""
        return _owners(self.view(node))

    def masters(self) -> list[ClusterNodeServer]:
        """The masters serving slots now, as the first running node sees them."""
        ports = sorted(set(self._owners(self._any_running()).values()))
        return [self.node_at(port) for port in ports]

    def replicas(self, master: ClusterNodeServer) -> list[ClusterNodeServer]:
        """The replicas of ``master`` (running or not), as the first running node sees them."""
        views = self.view(self._any_running())
        master_id = next(v.node_id for v in views.values() if v.port == master.port)
        ports = sorted(v.port for v in views.values() if v.master_id == master_id)
        return [self.node_at(port) for port in ports]

    def master_for(self, key: str | bytes) -> ClusterNodeServer:
        """The master serving ``key``'s hash slot now."""
        return self.master_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def _any_running(self) -> ClusterNodeServer:
        running = self.running()
        if not running:
            raise RuntimeError("no node of the cluster is running")
        return running[0]

    # Health and faults

    def healthy(self) -> bool:
        """Whether the running nodes agree on a full slot map served by running masters.

        Each running node must report ``cluster_state:ok``, see the same master for
        every slot range and the same master for every replica, flag no running node
        as failing, and each running replica of a running master must have its
        replication link up.
        """
        running = self.running()
        ports = {node.port for node in running}
        maps: list[tuple[dict[tuple[int, int], int], dict[int, int | None]]] = []
        for node in running:
            with node.client(decode_responses=True, socket_timeout=5) as client:
                info = str(client.execute_command("CLUSTER", "INFO"))
                if "cluster_state:ok" not in info:
                    return False
                views = self.view(node)
                if any(v.failing for v in views.values() if v.port in ports):
                    return False
                mine = next(v for v in views.values() if "myself" in v.flags)
                if mine.master_id is not None:
                    master = views.get(mine.master_id)
                    if master is None or master.port not in ports:
                        continue
                    link = client.info("replication").get("master_link_status")
                    if link != "up":
                        return False
            maps.append((_owners(views), _layout(views)))
        if not maps or any(seen != maps[0] for seen in maps):
            return False
        owners = maps[0][0]
        covered = sum(last - first + 1 for first, last in owners)
        return covered == _SLOTS and set(owners.values()) <= ports

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until :meth:`healthy`.

        Raises:
            RuntimeError: Not healthy within ``timeout`` seconds.
        """
        self._wait(time.monotonic() + timeout, "the cluster to be healthy", self._healthy)

    def _healthy(self) -> bool:
        try:
            return self.healthy()
        except (redis.ConnectionError, redis.TimeoutError):
            return False

    def _wait(self, deadline: float, what: str, done: Callable[[], bool]) -> None:
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.describe()}")
            time.sleep(_POLL)

    def describe(self) -> str:
        """``CLUSTER NODES`` of the first running node, for error messages."""
        try:
            with self._any_running().client(decode_responses=True, socket_timeout=2) as client:
                return str(client.execute_command("CLUSTER", "NODES"))
        except (RuntimeError, redis.RedisError) as e:
            return f"(no cluster view: {e})"

    def kill(self, node: ClusterNodeServer) -> None:
        """Crash ``node`` with SIGKILL. The others fail it over after the node timeout."""
        node.kill()

    def restart(self, node: ClusterNodeServer, timeout: float = 30.0) -> None:
        """Start ``node`` again on the same ports and directory, and wait until healthy.

        A master that was failed over comes back as a replica of its successor.
        """
        node.restart()
        self.wait_ok(timeout)

    def failover(
        self,
        replica: ClusterNodeServer,
        *,
        mode: Literal["", "FORCE", "TAKEOVER"] = "",
        timeout: float = 30.0,
    ) -> None:
        """Run ``CLUSTER FAILOVER [mode]`` on ``replica``; wait until it is a healthy master.

        Raises:
            RuntimeError: It was not master of a healthy cluster within ``timeout``.
        """
        with replica.client() as client:
            client.execute_command("CLUSTER", "FAILOVER", *([mode] if mode else []))
        deadline = time.monotonic() + timeout
        self._wait(deadline, f"{replica!r} to become master", lambda: self._is_master(replica))
        self.wait_ok(max(deadline - time.monotonic(), 1.0))

    def migrate_slot(
        self,
        slot: int,
        target: ClusterNodeServer,
        *,
        keys_per_step: int = 1,
        pause: float = 0.0,
        order: Callable[[bytes], Any] | None = None,
        timeout: float = 60.0,
    ) -> int:
        """Move ``slot`` to the master ``target`` as ``redis-cli --cluster reshard`` does:
        ``SETSLOT IMPORTING``/``MIGRATING``, ``MIGRATE`` of its keys ``keys_per_step`` at a
        time (``pause`` seconds between steps, so clients meet the slot half moved), then
        ``SETSLOT NODE`` on every master. A key ``MIGRATE`` finds on both sides (written on
        the source after its first move) is an error, as in ``redis-cli`` without
        ``--cluster-replace``: nothing is overwritten. ``order`` (a sort key of key names)
        moves the keys the slot holds when the move starts in that order, so a test can
        move the ones a client reaches by computed name first; the rest in the server's
        order.

        Returns:
            The number of keys moved.

        Raises:
            RuntimeError: The slot is ``target``'s already, or the move did not end within
                ``timeout`` (the slot is left migrating, for the test to report).
        """
        source = self.master_for_slot(slot)
        if source.port == target.port:
            raise RuntimeError(f"slot {slot} is served by {target!r} already")
        deadline = time.monotonic() + timeout
        moved = 0
        with source.client() as src, target.client() as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
            planned: list[bytes] = []
            if order is not None:
                held = src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
                planned = sorted(
                    src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, max(held, 1)), key=order
                )
            while True:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"slot {slot} still migrating after {timeout}s")
                keys = [key for key in planned[:keys_per_step] if src.exists(key)]
                del planned[:keys_per_step]
                if not keys and not planned:
                    keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, keys_per_step)
                    if not keys:
                        break
                if not keys:
                    continue
                src.execute_command("MIGRATE", _HOST, target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                if pause:
                    time.sleep(pause)
            for node in self.masters():
                with node.client() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        self._wait(deadline, f"slot {slot} on {target!r}", lambda: self._serves(target, slot))
        return moved

    def master_for_slot(self, slot: int) -> ClusterNodeServer:
        """The master serving hash slot ``slot`` now."""
        for (first, last), port in self._owners(self._any_running()).items():
            if first <= slot <= last:
                return self.node_at(port)
        raise RuntimeError(f"no master serves slot {slot} now")

    def _serves(self, node: ClusterNodeServer, slot: int) -> bool:
        try:
            return self.healthy() and self.master_for_slot(slot).port == node.port
        except (redis.ConnectionError, redis.TimeoutError):
            return False

    def _is_master(self, node: ClusterNodeServer) -> bool:
        try:
            return node in self.masters()
        except (redis.ConnectionError, redis.TimeoutError):
            return False

    def __repr__(self) -> str:
        ports = [node.port if node.pid is not None else None for node in self.nodes]
        return f"<ClusterServers ports={ports}>"
