from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.settings import Settings

from scrapy_dist.addon import with_defaults
from scrapy_dist.assembly import assemble
from scrapy_dist.connection import (
    check,
    client_from_config,
    client_from_settings,
    describe,
    mask_url,
    topology,
)
from scrapy_dist.exceptions import ConfigurationError, RedisUnavailable
from scrapy_dist.settings import ConnectionConfig, connection_config
from scrapy_dist.testing.redis_server import free_port

if TYPE_CHECKING:
    import redis


def build(**values: object) -> redis.Redis:
    return client_from_settings(with_defaults(Settings(values)))


def test_url_unix_and_tls() -> None:
    assert describe(build(REDIS_URL="redis://h:1234/3")) == "redis://h:1234/3"
    assert describe(build(REDIS_URL="rediss://h:1234/0")) == "rediss://h:1234/0"
    assert describe(build(REDIS_URL="unix:///run/redis.sock?db=2")) == (
        "unix:///run/redis.sock?db=2"
    )


def test_host_port_db_and_params() -> None:
    client = build(REDIS_HOST="h", REDIS_PORT=7000, REDIS_DB=4, REDIS_PARAMS={"socket_timeout": 3})
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["socket_timeout"]) == (
        "h",
        7000,
        4,
        3,
    )


def test_defaults_to_localhost_without_io() -> None:
    client = build()  # no server is contacted to build a client
    assert describe(client) == "redis://localhost:6379/0"


#: REDIS_URL together with a host or port: the URL wins with a warning, as in scrapy-redis
#: (this used to stop at start-up, as it still does with REDIS_URL_PRECEDENCE = False).
URL_AND_HOST = [
    {"REDIS_URL": "redis://h:7/3", "REDIS_HOST": "other"},
    {"REDIS_URL": "redis://h:7/3", "REDIS_PORT": 1},
    {"REDIS_URL": "redis://h:7/3", "REDIS_PARAMS": {"host": "x"}},
]


@pytest.mark.parametrize("values", URL_AND_HOST)
def test_url_wins_over_host_with_a_warning(
    values: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    assert describe(build(**values)) == "redis://h:7/3"
    assert "REDIS_URL is set together with" in caplog.text


@pytest.mark.parametrize("values", URL_AND_HOST)
def test_url_and_host_stop_without_url_precedence(values: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        build(**values, REDIS_URL_PRECEDENCE=False)


@pytest.mark.parametrize(
    "values",
    [
        {"REDIS_URL": "redis://h/0", "REDIS_PARAMS": {"url": "redis://elsewhere/0"}},
        {"REDIS_HOST": "a", "REDIS_PARAMS": {"host": "b"}},
        {"REDIS_URL": "http://h/0"},
        {"REDIS_PARAMS": {"decode_responses": True}},
    ],
)
def test_conflicts_are_configuration_errors(values: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        build(**values)


def test_password_is_masked() -> None:
    assert mask_url("redis://user:secret@h:1/0") == "redis://user:***@h:1/0"
    client = build(REDIS_URL="redis://user:secret@h:1/0")
    assert "secret" not in describe(client)
    assert "***" in describe(client)


def test_unreachable_server_names_the_url_masked() -> None:
    port = free_port()
    client = build(REDIS_URL=f"redis://:hunter2@127.0.0.1:{port}/0")
    with pytest.raises(RedisUnavailable) as info:
        check(client)
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_one_client_per_crawler(make_crawler) -> None:  # type: ignore[no-untyped-def]
    crawler = make_crawler()
    assert assemble(crawler).client is assemble(crawler).client
    assert assemble(crawler).client is not assemble(make_crawler()).client


# -- Cluster and Sentinel settings (no server) ----------------------------------------------


def topo(**values: object) -> ConnectionConfig:
    return connection_config(Settings(values))


@pytest.mark.parametrize(
    "values",
    [
        {"REDIS_STARTUP_NODES": ["a:7000", ("b", 7001), {"host": "c", "port": "7002"}]},
        {"REDIS_MASTER_NODES": "a:7000,b:7001,c:7002"},
        {"REDIS_URL": "redis+cluster://a:7000,b:7001,c:7002"},
        {
            "REDIS_URL": "redis://a:7000",
            "REDIS_PARAMS": {"redis_cls": "redis.cluster.RedisCluster"},
        },
    ],
)
def test_cluster_settings(values: dict[str, object]) -> None:
    config = topo(**values)
    assert config.topology == "cluster"
    assert config.nodes[0] == ("a", 7000)
    client = client_from_config(config)  # no I/O
    assert topology(client) == "cluster"
    assert describe(client).startswith("redis+cluster://a:7000")


def test_cluster_params_and_url_auth() -> None:
    config = topo(
        REDIS_URL="rediss+cluster://u:pw@a:7000/?socket_timeout=3",
        REDIS_CLUSTER_PARAMS={"require_full_coverage": False},
    )
    assert config.ssl
    assert config.params["username"] == "u"
    assert config.params["password"] == "pw"
    assert config.params["socket_timeout"] == 3
    assert config.cluster_params == {"require_full_coverage": False}
    text = describe(client_from_config(config))
    assert text == "rediss+cluster://u:***@a:7000"


@pytest.mark.parametrize(
    "values",
    [
        {
            "REDIS_SENTINELS": ["s1:26379", ("s2", 26380), "s3"],
            "REDIS_SENTINEL_PARAMS": {
                "service_name": "mymaster",
                "password": "master-pw",
                "sentinel_password": "sentinel-pw",
                "db": 2,
            },
        },
        {
            "REDIS_URL": "redis+sentinel://:master-pw@s1,s2:26380,s3/mymaster/2?sentinel_password=sentinel-pw"
        },
    ],
)
def test_sentinel_settings(values: dict[str, object]) -> None:
    config = topo(**values)
    assert config.topology == "sentinel"
    assert config.nodes == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert config.service_name == "mymaster"
    assert config.params["password"] == "master-pw"  # the master's auth ...
    assert config.sentinel_params["password"] == "sentinel-pw"  # ... apart from the Sentinels'
    assert config.params["db"] == 2
    client = client_from_config(config)  # no I/O
    assert topology(client) == "sentinel"
    text = describe(client)
    assert text == "redis+sentinel://:***@s1:26379,s2:26380,s3:26379/mymaster/2"
    assert "pw" not in text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"REDIS_URL": "redis://h/0", "REDIS_STARTUP_NODES": ["a:1"]}, "REDIS_URL .* both"),
        ({"REDIS_SENTINELS": ["s:1"], "REDIS_STARTUP_NODES": ["a:1"]}, "both set"),
        ({"REDIS_STARTUP_NODES": ["a:1"], "REDIS_MASTER_NODES": ["a:1"]}, "both set"),
        ({"REDIS_SENTINELS": ["s:1"]}, "service_name"),
        ({"REDIS_STARTUP_NODES": ["a:1"], "REDIS_HOST": "h"}, "REDIS_HOST"),
        ({"REDIS_STARTUP_NODES": ["a:1"], "REDIS_DB": 3}, "only database 0"),
        ({"REDIS_URL": "redis+cluster://a:1/2"}, "only database 0"),
        ({"REDIS_STARTUP_NODES": ["a:port"]}, "not a node"),
        ({"REDIS_STARTUP_NODES": [42]}, "not a node"),
        ({"REDIS_CLUSTER_PARAMS": {"x": 1}}, "no Cluster nodes"),
        ({"REDIS_SENTINEL_PARAMS": {"service_name": "m"}}, "no Sentinels"),
        (
            {"REDIS_STARTUP_NODES": ["a:1"], "REDIS_SENTINEL_PARAMS": {"service_name": "m"}},
            "not both",
        ),
        (
            {"REDIS_URL": "redis+sentinel://s/a", "REDIS_SENTINEL_PARAMS": {"service_name": "b"}},
            "set only one",
        ),
        ({"REDIS_STARTUP_NODES": ["a:1"], "REDIS_PARAMS": {"host": "h"}}, "REDIS_PARAMS"),
    ],
)
def test_contradicting_topology_settings_are_one_clear_error(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        topo(**values)


def test_a_single_server_config_is_unchanged() -> None:
    config = topo(REDIS_URL="redis://h:1/2")
    assert (config.topology, config.url, config.nodes) == ("single", "redis://h:1/2", ())
    assert topology(client_from_config(config)) == "single"
