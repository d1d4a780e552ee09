"""The dead-letter list: seeds and requests that could not be processed, with why.

Nothing the crawl cannot handle is dropped silently: it is appended to
``<crawl>:dead`` as a JSON record an operator can read, fix and requeue::

    {"kind": "seed", "reason": "...", "data": "<raw text>", "time": 1795000000.0,
     "worker": "host:1234:ab12cd", "deliveries": 3}

``data`` is the raw seed or serialized request; bytes that are not UTF-8 are stored
as ``{"$b": <latin-1 text>}`` like the JSON serializer does, so :func:`data_of` gives
back the exact bytes. This module owns the format: the Lua scripts write the same
record (``dead_json`` in ``lua/_leases.lua``), and the ``scrapy-dist dead`` command
reads records only through :func:`parse` and :func:`data_of`. Extra fields (``key``,
``url``...) may follow.
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


#: The tag of non-UTF-8 ``data``.
BYTES = "$b"


def _text(data: bytes | str) -> str | dict[str, str]:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {BYTES: data.decode("latin-1")}


def parse(raw: bytes) -> dict[str, Any]:
    """Read one record; anything that is not one comes back as a record of kind ``"?"``
    whose ``data`` is the raw bytes (so nothing in the list is unreadable)."""
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        return {"kind": "?", "reason": "not a dead-letter record", "data": _text(raw)}
    return record


def data_of(record: dict[str, Any]) -> bytes | None:
    """The exact bytes of the seed or serialized request a record carries (``None`` if
    it has none)."""
    data = record.get("data")
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, dict) and set(data) == {BYTES} and isinstance(data[BYTES], str):
        try:
            return str(data[BYTES]).encode("latin-1")
        except UnicodeEncodeError:
            return None
    return None


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

    def record(
        self, kind: str, reason: str, data: bytes | str, deliveries: int = 0, **extra: Any
    ) -> bytes:
        """Build the JSON record of one failure (see the module docstring)."""
        entry: dict[str, Any] = {
            "kind": kind,
            "reason": reason,
            "data": _text(data),
            "time": round(time.time(), 3),
            "worker": self.worker,
            "deliveries": deliveries,
        }
        entry.update(extra)
        return json.dumps(entry, ensure_ascii=False, default=repr).encode("utf-8")

    def add(
        self,
        kind: str,
        reason: str,
        data: bytes | str,
        pipe: Pipeline | None = None,
        deliveries: int = 0,
        **extra: Any,
    ) -> None:
        """Append one failure record; ``extra`` fields (JSON-able) are stored with it."""
        record = self.record(kind, reason, data, deliveries, **extra)
        (pipe or self.client).rpush(self.key, record)

    def __len__(self) -> int:
        return int(self.client.llen(self.key))
