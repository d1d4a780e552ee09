"""The other servers the tests start: Cluster, Sentinel, Valkey, Redis with RedisBloom.

These check that the fixtures are real servers doing what the later Cluster and Sentinel
tests rely on (``scrapy_dist.testing.redis_cluster``, ``redis_sentinel``, ``server_kinds``).
The failover tests wait on real timeouts and are marked ``slow``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
import redis
from redis.exceptions import MovedError

from scrapy_dist.testing.redis_cluster import NodeView
from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.server_kinds import (
    KIND_VARIABLE,
    KINDS,
    default_kind,
    find_redisbloom_module,
    find_valkey_server,
    server_kind,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy_dist.testing.redis_cluster import ClusterServers
    from scrapy_dist.testing.redis_sentinel import SentinelServers
    from scrapy_dist.testing.server_kinds import ServerKind


@pytest.fixture
def cluster_keys(redis_cluster: ClusterServers) -> Iterator[list[str]]:
    """Keys a test writes to the cluster, deleted afterwards through a cluster client."""
    keys: list[str] = []
    yield keys
    client = redis_cluster.client()
    try:
        for key in keys:
            client.delete(key)
    finally:
        client.close()


# Kinds


def test_kinds_are_named_and_unknown_ones_refused() -> None:
    assert KINDS[0] == "redis"
    with pytest.raises(ValueError, match="unknown server kind 'memcached'"):
        server_kind("memcached")


def test_default_kind_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KIND_VARIABLE, "redis")
    assert default_kind().name == "redis"
    monkeypatch.setenv(KIND_VARIABLE, "nope")
    with pytest.raises(ValueError, match="unknown server kind"):
        RedisServer()


def test_binaries_prefer_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VALKEY_SERVER", "/opt/valkey/valkey-server")
    monkeypatch.setenv("REDISBLOOM_MODULE", "/opt/bloom/redisbloom.so")
    assert find_valkey_server() == "/opt/valkey/valkey-server"
    assert find_redisbloom_module() == "/opt/bloom/redisbloom.so"
    kind = server_kind("redisbloom")
    assert kind.extra_args == ("--loadmodule", "/opt/bloom/redisbloom.so")
    assert RedisServer.of_kind(kind, extra_args=["--maxmemory", "1mb"]).extra_args == (
        "--loadmodule",
        "/opt/bloom/redisbloom.so",
        "--maxmemory",
        "1mb",
    )


def test_the_session_server_is_of_the_chosen_kind(redis_url: str, redis_kind: str) -> None:
    if os.environ.get("SCRAPY_DIST_TEST_REDIS_URL"):
        pytest.skip("the session uses a Redis it did not start")
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        info = client.info("server")
        modules = {module["name"] for module in client.module_list()}
    assert (info.get("server_name") == "valkey") == (redis_kind == "valkey")
    assert ("bf" in modules) == (redis_kind == "redisbloom")


def test_valkey_answers_info_server_as_valkey(kind_of: Callable[[str], ServerKind]) -> None:
    with (
        RedisServer.of_kind(kind_of("valkey")) as server,
        server.client(decode_responses=True) as client,
    ):
        info = client.info("server")
        assert info["server_name"] == "valkey"
        assert "valkey_version" in info
        assert client.ping()


def test_redisbloom_module_answers_bf_add(kind_of: Callable[[str], ServerKind]) -> None:
    with (
        RedisServer.of_kind(kind_of("redisbloom")) as server,
        server.client(decode_responses=True) as client,
    ):
        assert {module["name"] for module in client.module_list()} >= {"bf"}
        assert client.execute_command("BF.ADD", "bloom", "a") == 1
        assert client.execute_command("BF.ADD", "bloom", "a") == 0
        assert client.execute_command("BF.EXISTS", "bloom", "a") == 1


# Cleanup

_FORGETFUL_OWNER = """
import json
from scrapy_dist.testing import ClusterServers, SentinelServers
cluster = ClusterServers(masters=1, replicas_per_master=1).start()
sentinels = SentinelServers(replicas=0, sentinels=1, quorum=1).start()
servers = cluster.nodes + sentinels.servers + sentinels.sentinels
print(json.dumps([[server.pid, str(server.directory)] for server in servers]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_servers_are_stopped_at_exit_when_the_owner_forgets() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FORGETFUL_OWNER],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    started = json.loads(done.stdout.splitlines()[-1])
    pids = [pid for pid, _ in started]
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, pids))
    assert not any(os.path.exists(directory) for _, directory in started)


# Cluster


def test_cluster_is_ok_with_three_masters_each_with_a_replica(
    redis_cluster: ClusterServers,
) -> None:
    for node in redis_cluster.running():
        with node.client(decode_responses=True) as client:
            info = str(client.execute_command("CLUSTER", "INFO"))
        assert "cluster_state:ok" in info
        assert "cluster_size:3" in info
        assert "cluster_known_nodes:6" in info
    masters = redis_cluster.masters()
    assert len(masters) == 3
    replicas = [replica for master in masters for replica in redis_cluster.replicas(master)]
    assert len(replicas) == 3
    assert len({node.port for node in masters + replicas}) == 6
    assert 6379 not in {port for _, port in redis_cluster.startup_nodes}


def test_cluster_client_writes_land_on_the_slot_owner(
    redis_cluster: ClusterServers, cluster_keys: list[str]
) -> None:
    tag = secrets.token_hex(4)
    cluster_keys += [f"{tag}:{i}" for i in range(30)] + [f"{{{tag}}}:a", f"{{{tag}}}:b"]
    client = redis_cluster.client(decode_responses=True)
    try:
        for key in cluster_keys:
            client.set(key, key)
    finally:
        client.close()
    owners = {redis_cluster.master_for(key).port for key in cluster_keys}
    assert len(owners) == 3  # 30 random keys spread over the 3 masters
    for key in cluster_keys:
        owner = redis_cluster.master_for(key)
        with owner.client(decode_responses=True) as direct:
            assert direct.get(key) == key
        other = next(m for m in redis_cluster.masters() if m is not owner)
        with other.client() as direct, pytest.raises(redis.ResponseError) as refused:
            direct.get(key)
        # redis-py >= 5.1 raises MovedError ("<slot> <address>"), 5.0 the plain reply.
        assert isinstance(refused.value, MovedError) or str(refused.value).startswith("MOVED")
    a, b = (redis_cluster.master_for(key) for key in cluster_keys[-2:])
    assert a is b  # one hash tag, one slot


def test_node_view_parses_cluster_nodes_lines() -> None:
    view = NodeView.parse("07c3 127.0.0.1:30004@31004,host slave e7d1 0 1426238317239 4 connected")
    assert (view.port, view.master_id, view.connected, view.slots) == (30004, "e7d1", True, ())
    view = NodeView.parse(
        "e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 5462 [5461->-0c4b]"
    )
    assert view.flags == {"myself", "master"}
    assert view.slots == ((0, 5460), (5462, 5462))
    assert not view.failing


@pytest.mark.slow
def test_cluster_failover_promotes_the_replica(
    redis_cluster: ClusterServers, cluster_keys: list[str]
) -> None:
    key = f"failover:{secrets.token_hex(4)}"
    cluster_keys.append(key)
    client = redis_cluster.client(decode_responses=True)
    try:
        client.set(key, "kept")
        master = redis_cluster.master_for(key)
        with master.client() as direct:
            assert direct.execute_command("WAIT", 1, 5000) == 1
        (replica,) = redis_cluster.replicas(master)
        redis_cluster.failover(replica)
        assert redis_cluster.master_for(key) is replica
        assert redis_cluster.replicas(replica) == [master]
        assert client.get(key) == "kept"  # the client follows MOVED to the new master
    finally:
        client.close()


@pytest.mark.slow
def test_cluster_survives_a_killed_master(
    redis_cluster: ClusterServers, cluster_keys: list[str]
) -> None:
    key = f"kill:{secrets.token_hex(4)}"
    cluster_keys.append(key)
    master = redis_cluster.master_for(key)
    with master.client() as direct:
        direct.set(key, "kept")
        assert direct.execute_command("WAIT", 1, 5000) == 1
    (replica,) = redis_cluster.replicas(master)
    redis_cluster.kill(master)
    assert master.pid is None
    redis_cluster.wait_ok(30)
    assert redis_cluster.master_for(key) is replica
    with replica.client() as direct:
        assert direct.get(key) == b"kept"
    redis_cluster.restart(master)
    assert master in redis_cluster.replicas(replica)
    assert len(redis_cluster.masters()) == 3


# Sentinel


def test_sentinels_report_the_master(redis_sentinel: SentinelServers) -> None:
    master = redis_sentinel.master()
    (replica,) = redis_sentinel.replicas()
    assert redis_sentinel.role(master) == "master"
    assert redis_sentinel.role(replica) == "slave"
    for sentinel in redis_sentinel.sentinels:
        assert redis_sentinel.master_address(sentinel) == ("127.0.0.1", master.port)
    sentinels = redis_sentinel.client(socket_timeout=5)
    name = redis_sentinel.service_name
    assert sentinels.discover_master(name) == ("127.0.0.1", master.port)
    assert sentinels.discover_slaves(name) == [("127.0.0.1", replica.port)]
    key = f"sentinel:{secrets.token_hex(4)}"
    client = sentinels.master_for(name, decode_responses=True)
    try:
        client.set(key, "v")
        with master.client() as direct:
            assert direct.get(key) == b"v"
    finally:
        client.delete(key)
        client.close()


@pytest.mark.slow
def test_sentinel_failover_promotes_the_replica(redis_sentinel: SentinelServers) -> None:
    old = redis_sentinel.master()
    (replica,) = redis_sentinel.replicas()
    key = f"sentinel:{secrets.token_hex(4)}"
    client = redis_sentinel.client(socket_timeout=5).master_for(
        redis_sentinel.service_name, decode_responses=True
    )
    try:
        client.set(key, "kept")
        assert client.execute_command("WAIT", 1, 5000) == 1
        new = redis_sentinel.failover()
        assert new is replica
        assert redis_sentinel.role(new) == "master"
        assert client.get(key) == "kept"  # the client asks the Sentinels again
        with new.client() as direct:
            assert direct.get(key) == b"kept"
        redis_sentinel.wait_agreed(30)  # the old master replicates the new one
        assert redis_sentinel.role(old) == "slave"
        assert redis_sentinel.replicas() == [old]
    finally:
        client.delete(key)
        client.close()
