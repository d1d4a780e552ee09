"""Ways to make a test's own redis-server refuse writes for a while, each returning the
function that lifts the refusal (for the fault tests of the frontier, the item pipeline
and the shared stats). Only for servers a test started itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

__all__ = ["OOM_REFUSED", "refuse_noreplicas", "refuse_oom", "refuse_readonly"]

#: What the error of a write refused for want of memory says, wherever it stands in the
#: message (Redis 6.2 wraps an error a script's call raised: search, do not match).
OOM_REFUSED = "used memory > 'maxmemory'"


def refuse_oom(client: redis.Redis) -> Callable[[], object]:
    """``maxmemory`` of 1 byte under ``noeviction`` (the default): every write gets OOM."""
    client.config_set("maxmemory", 1)
    return lambda: client.config_set("maxmemory", 0)


def refuse_noreplicas(client: redis.Redis) -> Callable[[], object]:
    """``min-replicas-to-write 1`` on a server without replicas: writes get NOREPLICAS."""
    client.config_set("min-replicas-to-write", 1)
    return lambda: client.config_set("min-replicas-to-write", 0)


def refuse_readonly(client: redis.Redis) -> Callable[[], object]:
    """A demoted master (a replica of a port nothing listens on): writes get READONLY."""
    client.replicaof("127.0.0.1", "1")
    return lambda: client.replicaof("NO", "ONE")
