"""The request queue contract, on a real Redis, for all three queues."""

from __future__ import annotations

import pytest
import redis
from scrapy import Request

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters import SetBackend
from scrapy_dist.queue import FifoQueue, LifoQueue, PriorityQueue, RedisQueue

QUEUES = [FifoQueue, LifoQueue, PriorityQueue]


@pytest.fixture(params=QUEUES, ids=lambda c: c.__name__)
def queue(request: pytest.FixtureRequest, client: redis.Redis, name: str) -> RedisQueue:
    cls: type[RedisQueue] = request.param
    return cls(client, f"{name}:requests", f"{name}:seq")


def push(queue: RedisQueue, *payloads: bytes, priority: int = 0) -> None:
    score = queue.score(Request("https://e.com/", priority=priority))
    assert queue.push([(p, score, b"") for p in payloads]) == [True] * len(payloads)


def test_empty(queue: RedisQueue) -> None:
    assert len(queue) == 0
    assert queue.pop_payloads(5) == []


def test_push_pop_keeps_every_entry(queue: RedisQueue) -> None:
    push(queue, b"a", b"b", b"c")
    assert len(queue) == 3
    assert sorted(queue.pop_payloads(10)) == [b"a", b"b", b"c"]
    assert len(queue) == 0


def test_identical_payloads_never_collapse(queue: RedisQueue) -> None:
    push(queue, b"same", b"same")
    push(queue, b"same")
    assert len(queue) == 3
    assert queue.pop_payloads(10) == [b"same"] * 3


def test_binary_payloads(queue: RedisQueue) -> None:
    payload = bytes(range(256))
    push(queue, payload)
    assert queue.pop_payloads(1) == [payload]


def test_pop_count(queue: RedisQueue) -> None:
    push(queue, *[str(i).encode() for i in range(10)])
    assert len(queue.pop_payloads(4)) == 4
    assert len(queue) == 6


def test_clear(queue: RedisQueue) -> None:
    push(queue, b"x")
    queue.clear()
    assert len(queue) == 0


def test_order(queue: RedisQueue) -> None:
    push(queue, b"1", b"2")
    push(queue, b"3")
    popped = [queue.pop_payloads(1)[0] for _ in range(3)]
    expected = [b"3", b"2", b"1"] if isinstance(queue, LifoQueue) else [b"1", b"2", b"3"]
    assert popped == expected


def test_priority_order_fifo_among_equals(client: redis.Redis, name: str) -> None:
    queue = PriorityQueue(client, f"{name}:requests", f"{name}:seq")
    push(queue, b"low1", priority=-5)
    push(queue, b"mid1", b"mid2", priority=0)
    push(queue, b"high1", priority=10)
    push(queue, b"mid3", priority=0)
    push(queue, b"high2", priority=10)
    assert queue.pop_payloads(10) == [b"high1", b"high2", b"mid1", b"mid2", b"mid3", b"low1"]


def test_dedupe_is_atomic_with_the_push(queue: RedisQueue, name: str) -> None:
    backend = SetBackend(queue.client, f"{name}:dupefilter")
    score = 0.0
    assert queue.push(
        [(b"p1", score, b"fp1"), (b"p2", score, b"fp1"), (b"p3", score, b"fp2")], backend
    ) == [True, False, True]
    # an empty fingerprint (dont_filter) is never filtered and never recorded
    assert queue.push([(b"p4", score, b""), (b"p5", score, b"")], backend) == [True, True]
    assert len(queue) == 4
    assert len(backend) == 2


def test_failed_push_leaves_no_fingerprint(queue: RedisQueue, name: str) -> None:
    """A push that fails (here: the queue key has the wrong type) records nothing."""
    backend = SetBackend(queue.client, f"{name}:dupefilter")
    queue.client.set(queue.key, b"not a queue")
    with pytest.raises(redis.ResponseError):
        queue.push([(b"p", 0.0, b"fp")], backend)
    assert b"fp" not in backend
    assert len(backend) == 0


def test_wrong_key_type_is_reported(queue: RedisQueue) -> None:
    queue.client.set(queue.key, b"x")
    with pytest.raises(ConfigurationError, match=queue.key):
        queue.check_type()
