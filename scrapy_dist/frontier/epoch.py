"""A crawl's epoch: the id every frontier write is fenced by, and what its absence means.

``<crawl>:epoch`` holds a random id written by the crawl's first worker. Every frontier
script carries the epoch its worker joined and refuses the write, before it changes
anything, when the crawl's epoch is another or none (``lua/_fence.lua``), with the error
``EPOCH <found> expected <joined>``: the crawl finished (its keys deleted), vanished
(flushed, evicted, rolled back by a failover) or was replaced by another run. The
worker then reports its crawl lost instead of re-creating its state.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from typing import TYPE_CHECKING, Any

import redis

from scrapy_dist.frontier.wire import EPOCH_REFUSAL, NO_EPOCH

if TYPE_CHECKING:
    from scrapy_dist.keys import RedisKeys

logger = logging.getLogger(__name__)

#: States of a crawl whose epoch is gone: it finished (its keys deleted), it vanished
#: (flushed, evicted, rolled back by a failover), or another crawl replaced it.
FINISHED, VANISHED, REPLACED = "finished", "vanished", "replaced"


def join(client: redis.Redis, key: str) -> str:
    """The crawl's epoch, created (a random id) if the crawl has none; two round trips."""
    client.set(key, secrets.token_hex(8), nx=True)
    raw = client.get(key)
    return raw.decode() if isinstance(raw, bytes) else str(raw or "")


def fenced(error: BaseException) -> str | None:
    """The epoch Redis found (``"none"`` if gone) when a script refused a write for
    another epoch (``lua/_fence.lua``), else ``None``."""
    if isinstance(error, redis.exceptions.ResponseError):
        words = str(error).split()
        if len(words) >= 2 and words[0] == EPOCH_REFUSAL:
            return words[1]
    return None


def why_gone(client: redis.Redis, keys: RedisKeys, found: str, joined: str = "") -> str:
    """Why a crawl's epoch is ``found`` (:func:`fenced`) rather than ``joined``:
    :data:`FINISHED` (the run of ``joined`` was marked finished, even if another run
    started since; or, when ``found`` is ``"none"``, a completion time is recorded),
    :data:`VANISHED` or :data:`REPLACED`."""
    try:
        finished_at, finished_epoch = client.hmget(keys.progress, ["finished_at", "finished_epoch"])
    except redis.RedisError:
        finished_at = finished_epoch = None
    if joined and finished_epoch in (joined, joined.encode()):
        return FINISHED
    if found != NO_EPOCH:
        return REPLACED
    return FINISHED if stored_number(finished_at) is not None else VANISHED


#: A number as the scripts read one from the progress hash (``lua/_leases.lua``
#: decimal_of): decimal digits, optional sign, point and exponent, spaces around.
_DECIMAL = re.compile(rb"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*", re.ASCII)


def stored_number(value: bytes | str | None) -> float | None:
    """A counter or time of ``<crawl>:progress`` (``HGET``'s reply) as a finite number,
    or ``None`` if absent or not one as ``lua/_leases.lua`` decimal_of reads it (written
    by hand: ``junk``, ``nan``, ``0x10``, ``1_000``, ``1e999``)."""
    raw = value.encode() if isinstance(value, str) else value
    if raw is None or not _DECIMAL.fullmatch(raw):
        return None
    number = float(raw)
    return number if math.isfinite(number) else None


def log_gone(state: str, args: dict[str, Any]) -> None:
    """Say that a worker's crawl is gone and what it dropped.

    Args:
        state: :data:`FINISHED`, :data:`VANISHED` or :data:`REPLACED`.
        args: ``crawl``, ``key`` (the epoch key), ``epoch`` (joined), ``found`` and
            ``n`` (the writes dropped).
    """
    if state == FINISHED and not args["n"]:
        # (the normal end of every worker but the one that finished the crawl)
        logger.info("Crawl %(crawl)s was finished by another worker", args)
    elif state == FINISHED:
        logger.warning(
            "Crawl %(crawl)s finished without this worker (its epoch %(epoch)s is gone "
            "with its keys, e.g. while this worker was paused): dropped %(n)d pending "
            "write(s) for it",
            args,
        )
    elif state == VANISHED:
        logger.error(
            "The frontier of crawl %(crawl)s vanished: its epoch key %(key)s is gone "
            "although the crawl never finished (FLUSHDB, eviction, or a failover that "
            "lost writes); its queue, leases and dupefilter are gone with it. Dropped "
            "%(n)d pending write(s); this worker stops rather than re-create the crawl "
            "silently",
            args,
        )
    else:
        logger.error(
            "Crawl %(crawl)s is not the crawl this worker joined: its epoch changed "
            "from %(epoch)s to %(found)s (the crawl finished or was flushed, and "
            "another started). Dropped %(n)d pending write(s) for the old one",
            args,
        )
