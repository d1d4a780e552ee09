"""The config: frozen, built once per crawler from its final settings, every setting
checked in scrapy_dist.config with the messages users see (imported here through
scrapy_dist.settings, its compatibility face)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_dist.addon import DistAddon
from scrapy_dist.assembly import assemble
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import keys_from_settings
from scrapy_dist.settings import SECTIONS, Config, check_seed_batch_size, with_defaults


def config(**values: object) -> Config:
    return Config.from_settings(Settings(values))


def test_defaults_fill_unset_settings() -> None:
    c = config(SCHEDULER_PERSIST=True)
    assert c.scheduler.persist
    assert c.frontier.lease_timeout == 120
    assert c.keys.requests == "%(spider)s:requests"
    assert c.dupefilter.backend == "set"
    assert c.dupefilter.bloom is None
    assert c.seeds.kind == "list"
    assert c.seeds.encoding == "utf-8"
    assert c.requests.serializer == "json"
    assert not c.metrics.enabled


def test_the_config_and_its_sections_are_frozen() -> None:
    c = config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.scheduler = None  # type: ignore[assignment]  # the point: it is refused
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.frontier.lease_timeout = 1  # type: ignore[misc]
    assert c.settings.frozen
    with pytest.raises(TypeError):
        c.settings.set("SCHEDULER_PERSIST", True)


def test_sections_are_parsed_once() -> None:
    c = config()
    assert c.scheduler is c.scheduler
    assert c.validate() is c
    assert all(getattr(c, name) is getattr(c, name) for name in SECTIONS)


def test_the_source_settings_are_not_written() -> None:
    settings = Settings({"REDIS_URL": "redis://h/1"})
    settings.freeze()
    c = Config.from_settings(settings)
    assert c.connection.url == "redis://h/1"
    assert "REDIS_ENCODING" not in settings.attributes


def test_with_defaults_leaves_frozen_settings_alone() -> None:
    settings = Settings({"REDIS_URL": "redis://h/1"})
    settings.freeze()
    resolved = with_defaults(settings)
    assert resolved["REDIS_URL"] == "redis://h/1"
    assert resolved["REDIS_ENCODING"] == "utf-8"
    assert "REDIS_ENCODING" not in settings.attributes


def test_job_id_and_timestamp_are_exclusive() -> None:
    with pytest.raises(ConfigurationError, match="both set"):
        keys_from_settings(
            with_defaults(Settings({"SCHEDULER_JOB_ID": "a", "SCHEDULER_JOB_TIMESTAMP": "%Y"})),
            "x",
        )


def test_built_once_per_crawler() -> None:
    crawler = get_crawler(settings_dict={"SCHEDULER_PERSIST": True})
    parts = assemble(crawler)
    assert parts is assemble(crawler)
    assert parts.config is assemble(crawler).config
    assert parts.client is parts.client
    assert assemble(get_crawler()).config is not parts.config


def test_built_from_the_settings_after_the_add_ons() -> None:
    crawler = get_crawler(settings_dict={"ADDONS": {DistAddon: 0}, "SCHEDULER_LEASE_TIMEOUT": 60})
    c = assemble(crawler).config
    assert c.frontier.lease_timeout == 60  # the project's value wins over the add-on's
    assert c.components.scheduler == "scrapy_dist.scheduler.Scheduler"  # the add-on's


def test_refused_before_the_add_ons_ran() -> None:
    """A crawling crawler without its spider yet is inside the spider's from_crawler:
    Scrapy has not applied the add-ons."""
    crawler = get_crawler()
    crawler.crawling = True
    crawler.settings.frozen = False
    with pytest.raises(RuntimeError) as info:
        assemble(crawler)
    assert str(info.value) == (
        "scrapy_dist settings were read before Scrapy applied the add-ons (from a "
        "spider's __init__ or from_crawler); read them from spider_opened on"
    )
    crawler.crawling = False
    assert assemble(crawler).config.frontier.lease_timeout == 120


def test_with_values_overrides_some_settings() -> None:
    c = config(DUPEFILTER_BACKEND="set", BLOOM_CAPACITY=1000)
    adopted = c.with_values({"DUPEFILTER_BACKEND": "auto"})
    assert adopted.dupefilter.backend == "auto"
    assert adopted.dupefilter.bloom is not None
    assert adopted.dupefilter.bloom.capacity == 1000
    assert c.dupefilter.backend == "set"


def test_an_invalid_section_does_not_fail_the_others() -> None:
    c = config(METRICS_PORT=70000, SCHEDULER_PREFETCH=-1, BLOOM_ON_FULL="explode")
    assert not c.metrics.enabled  # checked only when enabled
    assert c.dupefilter.backend == "set"  # BLOOM_ON_FULL matters only to Bloom backends
    assert c.seeds.kind == "list"
    with pytest.raises(ConfigurationError, match="SCHEDULER_PREFETCH"):
        c.scheduler  # noqa: B018


#: (settings, section, the exact message)
ERRORS: list[tuple[dict[str, Any], str, str]] = [
    (
        {"REDIS_URL": "redis://h/0", "REDIS_PARAMS": {"url": "redis://elsewhere/0"}},
        "connection",
        "REDIS_URL and REDIS_PARAMS['url'] name different servers; set only one",
    ),
    (
        {"REDIS_URL": "redis://h:7/3", "REDIS_HOST": "other", "REDIS_URL_PRECEDENCE": False},
        "connection",
        "REDIS_URL is set together with REDIS_HOST; put the whole address in REDIS_URL or "
        "use the separate settings, not both",
    ),
    (
        {"REDIS_URL": "http://h/0"},
        "connection",
        "REDIS_URL 'http://h/0' must start with redis://, rediss:// or unix://",
    ),
    (
        {"REDIS_HOST": "a", "REDIS_PARAMS": {"host": "b"}},
        "connection",
        "REDIS_HOST='a' contradicts REDIS_PARAMS['host']='b'",
    ),
    (
        {"REDIS_PARAMS": {"decode_responses": True}},
        "connection",
        "REDIS_PARAMS['decode_responses'] must be false: scrapy_dist stores raw bytes",
    ),
    (
        {"SCHEDULER_JOB_ID": "a", "SCHEDULER_JOB_TIMESTAMP": "%Y"},
        "keys",
        "SCHEDULER_JOB_ID and SCHEDULER_JOB_TIMESTAMP are both set; use one of them",
    ),
    (
        {"REDIS_EVICTION_POLICY_CHECK": "x"},
        "frontier",
        "REDIS_EVICTION_POLICY_CHECK must be 'refuse', 'warn' or 'off', not 'x'",
    ),
    (
        {"SCHEDULER_LEASE_TIMEOUT": 0},
        "frontier",
        "SCHEDULER_LEASE_TIMEOUT must be positive (0.0)",
    ),
    (
        {"SCHEDULER_MAX_DELIVERIES": 0},
        "frontier",
        "SCHEDULER_MAX_DELIVERIES must be at least 1 (0)",
    ),
    (
        {"SCHEDULER_PREFETCH": -1},
        "scheduler",
        "SCHEDULER_PREFETCH must be at least 1, not -1",
    ),
    (
        {"SCHEDULER_CALLBACK_ERRORS": "dead-letter"},
        "scheduler",
        "SCHEDULER_CALLBACK_ERRORS must be one of 'done', 'retry', 'dead', not 'dead-letter'",
    ),
    (
        {"SCHEDULER_CALLBACK_ERRORS": True},
        "scheduler",
        "SCHEDULER_CALLBACK_ERRORS must be one of 'done', 'retry', 'dead', not True",
    ),
    (
        {"SCHEDULER_IDLE_BEFORE_CLOSE": -1},
        "scheduler",
        "SCHEDULER_IDLE_BEFORE_CLOSE cannot be negative (-1.0)",
    ),
    (
        {"SCHEDULER_WORKER_TIMEOUT": 1, "SCHEDULER_HEARTBEAT_INTERVAL": 5},
        "scheduler",
        "SCHEDULER_WORKER_TIMEOUT (1.0s) must be at least twice "
        "SCHEDULER_HEARTBEAT_INTERVAL (5.0s)",
    ),
    (
        {"SCHEDULER_LEASE_TIMEOUT": 10, "SCHEDULER_HEARTBEAT_INTERVAL": 5},
        "scheduler",
        "SCHEDULER_LEASE_TIMEOUT (10.0s) must be at least three times "
        "SCHEDULER_HEARTBEAT_INTERVAL (5.0s), which is how often leases are renewed",
    ),
    (
        {"SCHEDULER_FLUSH_INTERVAL": -1},
        "scheduler",
        "SCHEDULER_FLUSH_INTERVAL cannot be negative (-1.0)",
    ),
    (
        {"SCHEDULER_IDLE_POLL": 0},
        "spider",
        "SCHEDULER_IDLE_POLL must be positive",
    ),
    (
        {"DUPEFILTER_BACKEND": "x"},
        "dupefilter",
        "DUPEFILTER_BACKEND must be one of 'set', 'bloom', 'bitmap', 'redisbloom', 'auto', "
        "'buckets', not 'x'",
    ),
    (
        {"DUPEFILTER_TTL": "abc"},
        "dupefilter",
        "DUPEFILTER_TTL must be a number of seconds: 'abc'",
    ),
    (
        {"DUPEFILTER_TTL": -1},
        "dupefilter",
        "DUPEFILTER_TTL cannot be negative: -1",
    ),
    (
        {"DUPEFILTER_BACKEND": "bloom", "BLOOM_ON_FULL": "explode"},
        "dupefilter",
        "BLOOM_ON_FULL must be 'grow' or 'refuse', not 'explode'",
    ),
    (
        {"DUPEFILTER_BACKEND": "bitmap", "BLOOMFILTER_BIT": "x"},
        "dupefilter",
        "invalid Bloom dupefilter size: invalid literal for int() with base 10: 'x'",
    ),
    (
        {"REDIS_ITEMS_MAXLEN": -1},
        "items",
        "REDIS_ITEMS_MAXLEN cannot be negative (-1)",
    ),
    (
        {"REDIS_ITEMS_BATCH_SIZE": 0},
        "items",
        "REDIS_ITEMS_BATCH_SIZE must be at least 1 (0)",
    ),
    (
        {"REDIS_ITEMS_FLUSH_INTERVAL": 0},
        "items",
        "REDIS_ITEMS_FLUSH_INTERVAL must be positive (0.0)",
    ),
    (
        {"REDIS_ITEMS_SERIALIZER": "os.sep"},
        "items",
        "REDIS_ITEMS_SERIALIZER 'os.sep' is not a function",
    ),
    (
        {"STATS_FLUSH_INTERVAL": 0},
        "stats",
        "STATS_FLUSH_INTERVAL must be a positive number of seconds (0.0)",
    ),
    (
        {"METRICS_ENABLED": True, "METRICS_INTERVAL": 0},
        "metrics",
        "METRICS_INTERVAL must be positive (0.0)",
    ),
    (
        {"METRICS_ENABLED": True, "METRICS_PORT": 70000},
        "metrics",
        "METRICS_PORT must be a TCP port number (70000)",
    ),
]


@pytest.mark.parametrize(("values", "section", "message"), ERRORS)
def test_every_error_message(values: dict[str, Any], section: str, message: str) -> None:
    c = config(**values)
    with pytest.raises(ConfigurationError) as info:
        getattr(c, section)
    assert str(info.value) == message
    with pytest.raises(ConfigurationError):  # and validate() finds it
        config(**values).validate()


@pytest.mark.parametrize(
    ("value", "read"),
    [(None, "done"), ("done", "done"), ("retry", "retry"), ("dead", "dead"), (" Dead ", "dead")],
)
def test_callback_errors(value: str | None, read: str) -> None:
    """``SCHEDULER_CALLBACK_ERRORS``: "done" (Scrapy's behaviour) unless set, read as
    other choices are."""
    values = {} if value is None else {"SCHEDULER_CALLBACK_ERRORS": value}
    assert config(**values).scheduler.callback_errors == read


def test_seed_batch_size() -> None:
    check_seed_batch_size(1)
    with pytest.raises(ConfigurationError) as info:
        check_seed_batch_size(0)
    assert str(info.value) == "REDIS_START_URLS_BATCH_SIZE must be at least 1"


#: REDIS_PARAMS values redis-py takes, then fails on when it connects (a TypeError, a
#: ValueError, a refusal by the server), and the start of the message naming each.
REFUSED_PARAMS: list[tuple[dict[str, Any], str]] = [
    ({"socket_timeout": "abc"}, "REDIS_PARAMS['socket_timeout'] = 'abc' is not a number"),
    ({"socket_timeout": -1}, "REDIS_PARAMS['socket_timeout'] = -1 is not a number"),
    ({"socket_connect_timeout": "5"}, "REDIS_PARAMS['socket_connect_timeout'] = '5'"),
    ({"socket_connect_timeout": float("nan")}, "REDIS_PARAMS['socket_connect_timeout']"),
    ({"health_check_interval": "30"}, "REDIS_PARAMS['health_check_interval'] = '30'"),
    ({"port": "abc"}, "REDIS_PARAMS['port'] = 'abc' is not a TCP port"),
    ({"port": None}, "REDIS_PARAMS['port'] = None is not a TCP port"),
    ({"port": 99999}, "REDIS_PARAMS['port'] = 99999 is not a TCP port"),
    ({"port": True}, "REDIS_PARAMS['port'] = True is not a TCP port"),
    ({"db": "abc"}, "REDIS_PARAMS['db'] = 'abc' is not a database number"),
    ({"db": 1.5}, "REDIS_PARAMS['db'] = 1.5 is not a database number"),
    ({"db": -1}, "REDIS_PARAMS['db'] = -1 is not a database number"),
    ({"max_connections": "10"}, "REDIS_PARAMS['max_connections'] = '10'"),
    ({"protocol": 4}, "REDIS_PARAMS['protocol'] = 4 is not a RESP version"),
    ({"host": 5}, "REDIS_PARAMS['host'] = 5 is not a host name"),
    ({"unix_socket_path": 5}, "REDIS_PARAMS['unix_socket_path'] = 5 is not a path"),
    ({"socket_keepalive_options": "x"}, "REDIS_PARAMS['socket_keepalive_options'] = 'x'"),
    ({"retry_on_error": 5}, "REDIS_PARAMS['retry_on_error'] = 5"),
    ({"retry_on_error": [5]}, "REDIS_PARAMS['retry_on_error'] = [5]"),
    ({"retry": 5}, "REDIS_PARAMS['retry'] = 5 is not a redis.retry.Retry"),
    ({"encoding_errors": "loose"}, "REDIS_PARAMS['encoding_errors'] = 'loose'"),
    ({"client_name": "my crawler"}, "REDIS_PARAMS['client_name'] = 'my crawler' contains"),
]


@pytest.mark.parametrize(("params", "message"), REFUSED_PARAMS)
def test_redis_params_values_redis_py_refuses(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        config(REDIS_PARAMS=params).connection  # noqa: B018
    assert str(info.value).startswith(message)
    sentinels = {"REDIS_SENTINELS": "127.0.0.1", "REDIS_SENTINEL_PARAMS": {"service_name": "m"}}
    if "port" not in params:  # (a port next to Sentinels is refused for that)
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            config(REDIS_PARAMS=params, **sentinels).connection  # noqa: B018


def test_redis_params_values_redis_py_takes_pass() -> None:
    """Values redis-py converts itself, None where it takes None, and keys scrapy_dist
    does not know (given to a custom redis_cls, as scrapy-redis did) are left alone."""
    import redis

    params: dict[str, Any] = {
        "port": "6380",
        "db": "2",
        "socket_timeout": None,
        "socket_connect_timeout": 1.5,
        "health_check_interval": 0,
        "max_connections": None,
        "protocol": "3",
        "retry_on_error": [redis.ConnectionError],
        "retry": None,
        "encoding_errors": "replace",
        "client_name": "crawler-1",
        "socket_keepalive_options": {},
        "my_own_option": ["kept", 1],
    }
    assert config(REDIS_PARAMS=params).connection.params["my_own_option"] == ["kept", 1]


@pytest.mark.parametrize(
    "values",
    [
        # A settings file's `REDIS_PARAMS = {"port": os.getenv("REDIS_PORT")}` next to a
        # REDIS_URL: the port is ignored (with a warning), whatever it is.
        {"REDIS_URL": "redis://h:6379/0", "REDIS_PARAMS": {"port": None}},
        {"REDIS_URL": "redis://h:6379/0", "REDIS_PARAMS": {"host": None, "port": ""}},
        {"REDIS_URL": "redis://h:6379/0", "REDIS_PARAMS": {"port": 0}},
        # A Unix socket: redis-py reads no host or port.
        {"REDIS_PARAMS": {"unix_socket_path": "/run/redis.sock", "port": None}},
        # The URL's query arguments win over REDIS_PARAMS.
        {"REDIS_URL": "redis://h:6379/0?socket_timeout=5", "REDIS_PARAMS": {"socket_timeout": "5"}},
    ],
)
def test_redis_params_values_redis_py_never_reads_pass(values: dict[str, Any]) -> None:
    """Values redis-py ignores worked before REDIS_PARAMS was checked; they still do."""
    config(**values).connection  # noqa: B018


def test_redis_params_unused_values_are_still_checked_where_read() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("REDIS_PARAMS['port'] = None")):
        config(REDIS_PARAMS={"port": None}).connection  # noqa: B018
    with pytest.raises(ConfigurationError, match=re.escape("REDIS_PARAMS['db'] = 'x'")):
        config(REDIS_URL="unix:///run/redis.sock", REDIS_PARAMS={"db": "x"}).connection  # noqa: B018


def test_a_unix_socket_path_object_is_given_to_redis_py_as_text() -> None:
    """A pathlib.Path passed the check and failed at connect (redis-py takes str)."""
    from pathlib import Path

    params = config(REDIS_PARAMS={"unix_socket_path": Path("/run/redis.sock")}).connection.params
    assert params["unix_socket_path"] == "/run/redis.sock"


def test_sentinel_and_cluster_params_are_checked_too() -> None:
    sentinels = {"REDIS_SENTINELS": "127.0.0.1"}
    cases = [
        (
            {**sentinels, "REDIS_SENTINEL_PARAMS": {"service_name": "m", "socket_timeout": "x"}},
            "REDIS_SENTINEL_PARAMS['socket_timeout'] = 'x'",
        ),
        (
            {
                **sentinels,
                "REDIS_SENTINEL_PARAMS": {
                    "service_name": "m",
                    "sentinel_kwargs": {"socket_timeout": "x"},
                },
            },
            "REDIS_SENTINEL_PARAMS['sentinel_kwargs']['socket_timeout'] = 'x'",
        ),
        (
            {
                "REDIS_STARTUP_NODES": "127.0.0.1:7000",
                "REDIS_CLUSTER_PARAMS": {"socket_timeout": "x"},
            },
            "REDIS_CLUSTER_PARAMS['socket_timeout'] = 'x'",
        ),
    ]
    for values, message in cases:
        c = config(**values)
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            c.connection  # noqa: B018


class OwnClient:
    """A client class of the user's own, reading its arguments its own way."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class SubclassedClient(redis.Redis):
    """A subclass of redis-py's client that keeps its ``__init__``."""


def test_an_own_redis_cls_gets_redis_params_unchecked_and_redis_py_s_are_checked() -> None:
    """scrapy-redis's own suite passes ``REDIS_PARAMS`` through to a ``redis_cls`` of its
    own (sentinel objects as values); the value checks refused them (scripts/compat.py)."""
    from scrapy_dist.settings import connection_config

    marker = object()
    own = {"redis_cls": OwnClient, "socket_connect_timeout": marker}
    assert (
        connection_config(Settings({"REDIS_PARAMS": own})).params["socket_connect_timeout"]
        is marker
    )
    for cls in (SubclassedClient, f"{__name__}.SubclassedClient", "redis.Redis"):
        bad = {"redis_cls": cls, "socket_connect_timeout": "abc"}
        with pytest.raises(ConfigurationError, match="socket_connect_timeout"):
            connection_config(Settings({"REDIS_PARAMS": bad}))


#: The names ``scrapy_dist.settings`` exported before the package ``scrapy_dist.config``.
COMPAT_NAMES = [
    "BACKENDS",
    "CALLBACK_ERRORS",
    "CLUSTER",
    "DEFAULT_PARAMS",
    "DIST_SCHEDULER",
    "EVICTION_CHECKS",
    "MAX_SHARDS",
    "ON_FULL",
    "RECRAWL_MAX_SECONDS",
    "RECRAWL_MIN_MS",
    "REDIS_PORT",
    "SECTIONS",
    "SENTINEL",
    "SENTINEL_PORT",
    "SINGLE",
    "TOPOLOGY_SCHEMES",
    "URL_SCHEMES",
    "BloomSize",
    "ComponentsConfig",
    "Config",
    "ConnectionConfig",
    "DupefilterConfig",
    "FrontierConfig",
    "ItemsConfig",
    "KeysConfig",
    "MetricsConfig",
    "PolitenessConfig",
    "QueueConfig",
    "ReplicationConfig",
    "RequestsConfig",
    "SchedulerConfig",
    "SeedsConfig",
    "SpiderConfig",
    "StatsConfig",
    "WorkersConfig",
    "check_frontier",
    "check_items",
    "check_metrics",
    "check_on_full",
    "check_params",
    "check_politeness",
    "check_replication",
    "check_scheduler",
    "check_seed_batch_size",
    "check_stats_interval",
    "connection_config",
    "is_dist_scheduler",
    "load_setting",
    "mask_url",
    "memory_queue_order",
    "parse_nodes",
    "recrawl_after",
    "settings_final",
    "start_requests_first",
    "with_defaults",
]

#: The modules of ``scrapy_dist.config``, each importing only those before it.
CONFIG_MODULES = ["reading", "params", "topology", "scheduling", "components", "core"]


def test_scrapy_dist_settings_still_exports_its_names() -> None:
    """The compatibility face: each name re-exported from where it is defined now."""
    import scrapy_dist.settings as compat

    assert sorted(compat.__all__) == sorted(COMPAT_NAMES)
    modules = [importlib.import_module(f"scrapy_dist.config.{m}") for m in CONFIG_MODULES]
    for name in COMPAT_NAMES:
        assert any(vars(m).get(name) is getattr(compat, name) for m in modules), name


def test_the_config_modules_import_each_other_in_one_direction() -> None:
    """No import circle: a config module imports of the package only the config modules
    before it, the exceptions and the defaults."""
    package = Path(importlib.import_module("scrapy_dist.config").__file__ or "").parent
    for i, name in enumerate(CONFIG_MODULES):
        tree = ast.parse((package / f"{name}.py").read_text(encoding="utf-8"))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "scrapy_dist":
                imported |= {f"scrapy_dist.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scrapy_dist"):
                imported.add(str(node.module))
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name.startswith("scrapy_dist")}
        allowed = {"scrapy_dist.exceptions", "scrapy_dist.default_settings"}
        allowed |= {f"scrapy_dist.config.{m}" for m in CONFIG_MODULES[:i]}
        assert imported <= allowed, (name, sorted(imported - allowed))
