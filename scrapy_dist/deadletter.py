"""The dead-letter list: seeds and requests that could not be processed, with why.

Nothing the crawl cannot handle is dropped silently: it is appended to
``<crawl>:dead`` as a JSON record an operator can read, fix and requeue::

    {"kind": "seed", "reason": "...", "data": "<raw text>", "time": 1795000000.0,
     "worker": "host:1234:ab12cd"}

``data`` is the raw seed or serialized request; bytes that are not UTF-8 are stored
as ``{"$b": <latin-1 text>}`` like the JSON serializer does.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

logger = logging.getLogger(__name__)

#: ``kind`` of a record made from a seed read from Redis.
SEED = "seed"
#: ``kind`` of a record made from a request that could not be stored or rebuilt.
REQUEST = "request"


def _text(data: bytes | str) -> str | dict[str, str]:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"$b": data.decode("latin-1")}


class DeadLetters:
    """Appends failure records to one crawl's dead-letter list.

    Args:
        client: the crawl's Redis client.
        key: the dead-letter list key.
        worker: id of this worker, recorded in each entry.
    """

    def __init__(self, client: redis.Redis, key: str, worker: str = "") -> None:
        self.client = client
        self.key = key
        self.worker = worker

    def record(self, kind: str, reason: str, data: bytes | str, **extra: Any) -> bytes:
        """Build the JSON record of one failure (see the module docstring)."""
        entry: dict[str, Any] = {
            "kind": kind,
            "reason": reason,
            "data": _text(data),
            "time": round(time.time(), 3),
            "worker": self.worker,
        }
        entry.update(extra)
        return json.dumps(entry, ensure_ascii=False, default=repr).encode("utf-8")

    def add(
        self,
        kind: str,
        reason: str,
        data: bytes | str,
        pipe: Pipeline | None = None,
        **extra: Any,
    ) -> None:
        """Append one failure record; ``extra`` fields (JSON-able) are stored with it."""
        (pipe or self.client).rpush(self.key, self.record(kind, reason, data, **extra))

    def __len__(self) -> int:
        return int(self.client.llen(self.key))
