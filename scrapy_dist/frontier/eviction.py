"""Whether the Redis server may evict a crawl's keys: checked once, when a worker opens.

Frontier keys hold no expiry, so only an ``allkeys-*`` ``maxmemory-policy`` evicts them,
or a ``volatile-*`` one when some of them do expire (a dupefilter with
``DUPEFILTER_TTL``). An evicted queue, lease or dupefilter loses requests or crawls them
again, so a worker refuses to start on such a server unless told to run anyway
(``REDIS_EVICTION_POLICY_CHECK``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

import redis

from scrapy_dist.connection import describe
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger(__name__)

#: Eviction policies that may delete frontier keys (they hold no TTL).
EVICTING = ("allkeys-",)


def eviction_risk(policy: str, expiring: Sequence[str] = ()) -> str | None:
    """What ``maxmemory-policy`` ``policy`` may evict of a crawl whose keys ``expiring``
    have an expiry, in words (``None``: nothing of the frontier). What a worker says
    when it opens, and the page shows."""
    if policy.startswith(EVICTING):
        what = "frontier keys (queue, leases, dupefilter)"
    elif policy.startswith("volatile-") and expiring:
        what = f"the keys with an expiry ({', '.join(expiring)})"
    else:
        return None
    return (
        f"maxmemory-policy {policy}: at maxmemory it evicts {what} and requests are "
        "lost or crawled again"
    )


def check_eviction_policy(client: redis.Redis, check: str, expiring: Sequence[str] = ()) -> None:
    """Refuse (or warn about) a ``maxmemory-policy`` that may delete frontier keys:
    ``allkeys-*``, or ``volatile-*`` when some of them expire (``expiring``, e.g.
    a dupefilter with ``DUPEFILTER_TTL``).

    Args:
        client: the crawl's Redis client (one ``CONFIG GET``).
        check: ``REDIS_EVICTION_POLICY_CHECK``: ``"refuse"``, ``"warn"`` or ``"off"``.
        expiring: the frontier keys that have an expiry.

    Raises:
        ConfigurationError: the policy may delete frontier keys and ``check`` is
            ``"refuse"``.
    """
    if check == "off":
        return
    try:
        reply = cast("dict[str, str]", client.config_get("maxmemory-policy"))
    except redis.exceptions.ResponseError as e:  # CONFIG renamed or not allowed
        logger.warning(
            "Cannot read Redis's maxmemory-policy (%(error)s): make sure it is "
            "noeviction or a volatile-* policy, or frontier keys may be evicted",
            {"error": e},
        )
        return
    policy = next(iter(reply.values()), "")
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    risk = eviction_risk(policy, expiring)
    if risk is None:
        return
    message = (
        f"Redis at {describe(client)} has {risk}. Set it to noeviction (a full server "
        f"then refuses writes and the crawl waits), or set "
        f"REDIS_EVICTION_POLICY_CHECK = 'warn' to run anyway"
    )
    if check == "refuse":
        raise ConfigurationError(message)
    logger.warning("%(message)s", {"message": message})
