"""Test utilities shipped with the package, like ``scrapy.utils.test``.

- :class:`RedisServer`: a throwaway ``redis-server`` on a free local port; with
  :func:`server_kind`, a ``valkey-server`` or a ``redis-server`` with RedisBloom instead.
- :class:`ClusterServers` and :class:`SentinelServers`: a local Redis Cluster (masters
  with replicas) and a Sentinel set (master, replica, Sentinels), with failover helpers.
- :class:`TestSite` and :func:`links`: a fast local website with a known link graph
  that counts how often each page is fetched.
- :func:`start_workers` and friends: ``scrapy crawl`` worker processes; :func:`run_cli`
  runs ``python -m scrapy_dist`` as an operator does.
- :class:`HeldRequests`: scrapy_dist's scheduler driven by hand, the test standing in
  for the engine (what it holds is what the scheduler sees in flight).

The names are imported on first use, so ``python -m scrapy_dist.testing.site`` does not
import its own module twice, and importing one utility does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_dist.testing.engine import HeldRequests
    from scrapy_dist.testing.redis_cluster import ClusterServers
    from scrapy_dist.testing.redis_sentinel import SentinelServers
    from scrapy_dist.testing.redis_server import RedisServer, free_port
    from scrapy_dist.testing.server_kinds import (
        RedisServerNotFound,
        ServerKind,
        find_redis_server,
        server_kind,
    )
    from scrapy_dist.testing.site import TestSite, links
    from scrapy_dist.testing.workers import (
        Worker,
        alive,
        final_stats,
        run_cli,
        start_workers,
        stop_workers,
        wait_ready,
        wait_workers,
    )

__all__ = [
    "ClusterServers",
    "HeldRequests",
    "RedisServer",
    "RedisServerNotFound",
    "SentinelServers",
    "ServerKind",
    "TestSite",
    "Worker",
    "alive",
    "final_stats",
    "find_redis_server",
    "free_port",
    "links",
    "run_cli",
    "server_kind",
    "start_workers",
    "stop_workers",
    "wait_ready",
    "wait_workers",
]

_MODULES = {
    "HeldRequests": "engine",
    "ClusterServers": "redis_cluster",
    "SentinelServers": "redis_sentinel",
    "ServerKind": "server_kinds",
    "server_kind": "server_kinds",
    "RedisServer": "redis_server",
    "RedisServerNotFound": "server_kinds",
    "find_redis_server": "server_kinds",
    "free_port": "redis_server",
    "TestSite": "site",
    "links": "site",
    "Worker": "workers",
    "alive": "workers",
    "final_stats": "workers",
    "run_cli": "workers",
    "start_workers": "workers",
    "stop_workers": "workers",
    "wait_ready": "workers",
    "wait_workers": "workers",
}


def __getattr__(name: str) -> object:
    """Import the utility ``name`` from its module on first access.

    Raises:
        AttributeError: ``name`` is not one of ``__all__``.
    """
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
