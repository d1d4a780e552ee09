"""The dead-letter list: seeds and requests that could not be processed, with why.

Nothing the crawl cannot handle is dropped silently: it is appended to
``<crawl>:dead`` as a JSON record an operator can read, fix and requeue::

    {"kind": "seed", "reason": "...", "data": "<raw text>", "time": 1795000000.0,
     "worker": "host:1234:ab12cd", "deliveries": 3}

``data`` is the raw seed or serialized request; bytes that are not UTF-8 are stored
as ``{"$b": <latin-1 text>}`` like the JSON serializer does, so :func:`data_of` gives
back the exact bytes. This module owns the format: the Lua scripts write the same
record with ``dead_json`` of ``lua/_deadletter.lua`` (a library a script names in its
``-- uses:`` line), and the ``scrapy-dist dead`` command reads records only through
:func:`parse`, :func:`data_of` and :func:`url_of`, and puts them back with
:class:`Requeuer`. Extra fields (``key``, ``url``...) may follow.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from redis.client import Pipeline

    from scrapy_dist.queue import RedisQueue
    from scrapy_dist.seeds import SeedQueue

logger = logging.getLogger(__name__)

#: ``kind`` of a record made from a seed read from Redis.
SEED = "seed"
#: ``kind`` of a record made from a request that could not be stored or rebuilt.
REQUEST = "request"


#: The tag of non-UTF-8 ``data``.
BYTES = "$b"


def _text(data: bytes | str) -> str | dict[str, str]:
    """``data`` as the record stores it: text if it is UTF-8, else tagged latin-1 text.
    A ``str`` with lone surrogates (bytes decoded with ``surrogateescape``) is stored as
    the bytes it stands for."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            try:
                raw = data.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raw = data.encode("utf-8", "surrogatepass")
            return _text(raw)
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


def url_of(record: dict[str, Any], limit: int = 200) -> str:
    """What a record is about, for people: its ``url`` field, else the URL of the
    request it carries (JSON serializer), else its data as text (cut at ``limit``)."""
    if isinstance(record.get("url"), str):
        return str(record["url"])
    data = data_of(record)
    if data is None:
        return ""
    text = data.decode("utf-8", "replace")
    if record.get("kind") == REQUEST:
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(text).get("url", ""))
    return text if len(text) <= limit else text[:limit] + "..."


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
        self,
        kind: str,
        reason: str,
        data: bytes | str,
        deliveries: int = 0,
        *,
        now: float | None = None,
        **extra: Any,
    ) -> bytes:
        """Build the JSON record of one failure (see the module docstring); ``now``
        is its time (default: this machine's clock)."""
        entry: dict[str, Any] = {
            "kind": kind,
            "reason": reason,
            "data": _text(data),
            "time": round(time.time() if now is None else now, 3),
            "worker": self.worker,
            "deliveries": deliveries,
        }
        entry.update(extra)
        # a lone surrogate in the reason or an extra field becomes its JSON escape
        text = json.dumps(entry, ensure_ascii=False, default=repr)
        return text.encode("utf-8", "backslashreplace")

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


class NoSuchRecord(LookupError):
    """An index past the end of the dead-letter list."""


class ListContended(RuntimeError):
    """The dead-letter list changed under every attempt to requeue from it."""


@dataclass
class _Plan:
    """What to do with the records read in one transaction."""

    requests: list[tuple[bytes, float | str, bytes]] = field(default_factory=list)
    #: The requests' records, and their numbers as ``dead list`` showed them.
    request_records: list[tuple[int, bytes]] = field(default_factory=list)
    seeds: list[bytes] = field(default_factory=list)
    seed_records: list[tuple[int, bytes]] = field(default_factory=list)
    #: Positions in the list now of the records to remove.
    chosen: list[int] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    read: int = 0


#: Records read per transaction by :meth:`Requeuer.all`.
REQUEUE_CHUNK = 1_000
#: Attempts at one record, or at the records :meth:`Requeuer.indexes` names, whose list
#: changed meanwhile (a worker appended a record, an operator requeued) before giving up
#: with :class:`ListContended`; a larger batch of :meth:`Requeuer.all` is halved after
#: :data:`BATCH_ATTEMPTS`.
CONTENDED_ATTEMPTS = 50
BATCH_ATTEMPTS = 3


class Requeuer:
    """Puts dead-letter records back where they came from, atomically with their removal.

    Each batch runs in a ``WATCH``/``MULTI`` transaction on the dead-letter list: the
    records are read, then pushed (requests with the enqueue script and no dedupe, as
    their fingerprints are recorded already; seeds with the seed mode's command) and
    removed in one ``MULTI``, retried if a worker appended a record meanwhile. So a
    record is requeued exactly once, even with two operators at work. Should Redis
    refuse a push inside the transaction, its records are appended to the list again.

    Args:
        client: the crawl's Redis client.
        key: the dead-letter list.
        queue: the crawl's request queue (its class from the settings).
        seeds: the crawl's seeds key.
        check_seed: raises :class:`~scrapy_dist.exceptions.InvalidSeed` (or another
            ``ValueError``) for a seed a worker would dead-letter again.
        check_request: the queue score of a serialized request; raises ``ValueError``
            (the reason) for one a worker would dead-letter again.
        kind: requeue only records of this kind (:data:`REQUEST`, :data:`SEED`), or all.
    """

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        *,
        queue: RedisQueue,
        seeds: SeedQueue,
        check_seed: Callable[[bytes], object],
        check_request: Callable[[bytes], float | str],
        kind: str | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self.queue = queue
        self.seeds = seeds
        self.check_seed = check_seed
        self.check_request = check_request
        self.kind = kind
        self.tombstone = f"\x00scrapy-dist requeue {secrets.token_hex(8)}"
        #: Requests and seeds requeued so far.
        self.requests = self.seeds_done = 0
        #: ``(index, reason)`` of the records left in the list.
        self.skipped: list[tuple[int, str]] = []

    def _plan(self, plan: _Plan, index: int, position: int, raw: bytes | None) -> None:
        """Decide about the record numbered ``index`` (now at ``position``)."""
        if raw is None:
            plan.skipped.append((index, "no such record"))
            return
        record = parse(raw)
        kind = record.get("kind")
        if self.kind and kind != self.kind:
            return
        data = data_of(record)
        if data is None:
            plan.skipped.append((index, f"{kind} record without data"))
        elif kind == SEED:
            try:
                self.check_seed(data)
            except ValueError as e:
                plan.skipped.append((index, f"seed is still invalid: {e}"))
                return
            plan.seeds.append(data)
            plan.seed_records.append((index, raw))
            plan.chosen.append(position)
        elif kind == REQUEST:
            try:
                score = self.check_request(data)
            except ValueError as e:
                plan.skipped.append((index, str(e)))
                return
            plan.requests.append((data, score, b""))
            plan.request_records.append((index, raw))
            plan.chosen.append(position)
        else:
            plan.skipped.append((index, f"unknown record kind {kind!r}"))

    def _run(self, read: Callable[[Any], _Plan], attempts: int = CONTENDED_ATTEMPTS) -> _Plan:
        """Read and plan under ``WATCH``, then push and remove in one ``MULTI``.

        Raises:
            redis.WatchError: the list changed meanwhile in each of ``attempts`` tries.
        """
        with self.client.pipeline(transaction=True) as pipe:
            for attempt in range(1, attempts + 1):
                try:
                    pipe.watch(self.key)  # type: ignore[no-untyped-call]
                    plan = read(pipe)
                    pipe.multi()
                    if plan.requests:
                        self.queue.enqueue_call(plan.requests).run(pipe)
                    if plan.seeds:
                        self.seeds.push(plan.seeds, pipe=pipe)
                    for index in plan.chosen:
                        pipe.lset(self.key, index, self.tombstone)
                    if plan.chosen:
                        pipe.lrem(self.key, 0, self.tombstone)
                    replies = pipe.execute(raise_on_error=False)
                except redis.WatchError:
                    if attempt == attempts:
                        raise
                    continue
                break
        failed: list[bytes] = []
        for name in ("requests", "seeds"):
            if not getattr(plan, name):
                continue
            reply = replies.pop(0)
            if isinstance(reply, Exception):
                records = plan.request_records if name == "requests" else plan.seed_records
                failed += [raw for _, raw in records]
                plan.skipped += [
                    (
                        i,
                        f"Redis refused the push ({reply}); the record was "
                        "appended to the list again",
                    )
                    for i, _ in records
                ]
                setattr(plan, name, [])
        if failed:
            self.client.rpush(self.key, *failed)
        self.requests += len(plan.requests)
        self.seeds_done += len(plan.seeds)
        self.skipped += plan.skipped
        return plan

    def indexes(self, indexes: Sequence[int]) -> None:
        """Requeue the records at these positions of the list.

        Raises:
            NoSuchRecord: an index is past the end of the list (nothing is requeued).
        """
        wanted = sorted(set(indexes))

        def read(pipe: Any) -> _Plan:
            length = int(pipe.llen(self.key))
            bad = [i for i in wanted if not 0 <= i < length]
            if bad:
                raise NoSuchRecord(
                    f"no record #{bad[0]} in {self.key} ({length} record(s): 0..{length - 1})"
                )
            plan = _Plan()
            for index in wanted:
                self._plan(plan, index, index, pipe.lindex(self.key, index))
            return plan

        try:
            self._run(read)
        except redis.WatchError:
            raise self._contended(len(wanted)) from None

    def _contended(self, records: int) -> ListContended:
        return ListContended(
            f"{self.key} changed under each of {CONTENDED_ATTEMPTS} attempts to requeue "
            f"{records} record(s) from it: workers are adding dead letters faster than they "
            "can be read, or another requeue or purge is running. Pause the crawl "
            "('scrapy-dist pause') and run it again"
        )

    def _read_chunk(self, pipe: Any, examined: int, start: int, count: int) -> _Plan:
        raws = pipe.lrange(self.key, start, start + count - 1)
        plan = _Plan(read=len(raws))
        for offset, raw in enumerate(raws):
            self._plan(plan, examined + offset, start + offset, raw)
        return plan

    def all(self) -> None:
        """Requeue every record present now (records added meanwhile are left).

        A batch whose list changed while it was read and planned (workers appending
        dead letters) is retried, then halved, down to one record, so a crawl that
        keeps failing pages does not keep the requeue from getting anywhere.

        Raises:
            ListContended: even one record could not be moved in
                :data:`CONTENDED_ATTEMPTS` attempts (what was moved before stays moved).
        """
        total = int(self.client.llen(self.key))
        examined = position = 0
        batch = REQUEUE_CHUNK
        while examined < total:
            count = min(batch, total - examined)
            try:
                plan = self._run(
                    partial(self._read_chunk, examined=examined, start=position, count=count),
                    CONTENDED_ATTEMPTS if count == 1 else BATCH_ATTEMPTS,
                )
            except redis.WatchError:
                if count == 1:
                    raise self._contended(1) from None
                batch = max(1, count // 2)
                continue
            batch = min(REQUEUE_CHUNK, batch * 2)
            if not plan.read:
                break
            examined += plan.read
            position += plan.read - len(plan.chosen)
