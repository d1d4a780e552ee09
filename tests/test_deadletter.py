"""The dead-letter record: one format, written by Python and by Lua, read and requeued
through :mod:`scrapy_dist.deadletter` alone."""

from __future__ import annotations

import json
import pickle
from typing import TYPE_CHECKING

import pytest

from scrapy_dist import deadletter
from scrapy_dist.cli import main
from scrapy_dist.lua_source import source
from scrapy_dist.testing.queues import queued_entries

if TYPE_CHECKING:
    from pathlib import Path

    import redis

#: A seed in latin-1 (``REDIS_ENCODING = "latin-1"``, so not UTF-8) with quotes.
SEED = b"https://a.example/caf\xe9?q=\"x\"&r='y'&s=\\"
#: A request as the pickle serializer stores it: not UTF-8, with quotes and control
#: characters in its bytes.
REQUEST = pickle.dumps(
    {
        "url": "https://a.example/\u00e9t\u00e9",
        "priority": 3,
        "meta": {"note": 'a "quoted" \\ \x00\x01\x1f\x7f\n\t text'},
    },
    protocol=4,
)
#: A long reason: quotes, backslashes, control characters, non-ASCII text.
REASON = 'boom "quoted" \\ \x00\x01\x1f\t\n\x7f caf\u00e9 \u2028 \U0001f600 ' * 600


def lua_record(client: redis.Redis, kind: str, data: bytes, reason: str) -> bytes:
    """The record ``dead_json`` of ``lua/_deadletter.lua`` writes, at time 12.5."""
    script = client.register_script(
        source("_deadletter")
        + "\nreturn dead_json(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5],"
        " tonumber(ARGV[6]))"
    )
    return bytes(script(args=[kind, data, reason.encode(), 12.5, "w1", 3]))


def python_record(client: redis.Redis, kind: str, data: bytes | str, reason: str) -> bytes:
    """The record :class:`~scrapy_dist.deadletter.DeadLetters` writes, at time 12.5."""
    return deadletter.DeadLetters(client, "unused", "w1").record(kind, reason, data, 3, now=12.5)


@pytest.mark.parametrize(("kind", "data"), [("seed", SEED), ("request", REQUEST)])
def test_lua_and_python_write_the_same_record(client: redis.Redis, kind: str, data: bytes) -> None:
    assert len(REASON) > 15_000
    with pytest.raises(UnicodeDecodeError):
        data.decode()
    lua = deadletter.parse(lua_record(client, kind, data, REASON))
    python = deadletter.parse(python_record(client, kind, data, REASON))
    assert lua == python
    assert lua == {
        "kind": kind,
        "reason": REASON,
        "data": {deadletter.BYTES: data.decode("latin-1")},
        "time": 12.5,
        "worker": "w1",
        "deliveries": 3,
    }
    assert deadletter.data_of(lua) == data


def test_the_scripts_that_dead_letter_use_the_library_once() -> None:
    for name in ("reserve", "settle"):
        text = source(name)
        assert text.count("local function dead_json(") == 1, name
        assert text.index("local function dead_json(") < text.index("local function dead_record(")


def test_records_of_both_writers_are_listed_and_requeued_byte_for_byte(  # noqa: PLR0917
    redis_url: str,
    client: redis.Redis,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    dead = f"{name}:dead"
    for kind, data in (("seed", SEED), ("request", REQUEST)):
        client.rpush(dead, lua_record(client, kind, data, REASON))
        client.rpush(dead, python_record(client, kind, data, REASON))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    options = [
        "--redis-url",
        redis_url,
        "-s",
        "SCHEDULER_SERIALIZER=pickle",
        "-s",
        "REDIS_ENCODING=latin-1",
    ]

    assert main(["dead", "list", name, "--json", *options]) == 0
    # one record per "\n"-ended line (str.splitlines would also split at the U+2028)
    listed = [json.loads(line) for line in capsys.readouterr().out.split("\n")[:-1]]
    assert [r["index"] for r in listed] == [0, 1, 2, 3]
    assert [deadletter.data_of(r) for r in listed] == [SEED, SEED, REQUEST, REQUEST]
    assert {r["reason"] for r in listed} == {REASON}
    assert main(["dead", "list", name, *options]) == 0
    text = capsys.readouterr().out
    assert text.count("https://a.example/caf") == 2  # the seeds, as text

    assert main(["dead", "requeue", name, "--all", *options]) == 0, capsys.readouterr()
    assert client.llen(dead) == 0
    assert client.lrange(f"{name}:start_urls", 0, -1) == [SEED, SEED]
    assert [e[16:] for e in queued_entries(client, f"{name}:requests")] == [REQUEST, REQUEST]


def test_url_of_a_record(client: redis.Redis) -> None:
    data = json.dumps({"url": "https://a.example/r"}).encode()
    request = deadletter.parse(python_record(client, "request", data, "x"))
    assert deadletter.url_of(request) == "https://a.example/r"
    assert deadletter.url_of({"kind": "seed", "data": "x" * 300}) == "x" * 200 + "..."
    assert deadletter.url_of({"kind": "request", "url": "https://u/", "data": "?"}) == "https://u/"
    assert deadletter.url_of({"kind": "?"}) == ""


def test_text_with_lone_surrogates_is_stored_readably(client: redis.Redis) -> None:
    """A reason or data decoded with ``surrogateescape`` does not break the writer: the
    data comes back as the bytes it stood for, the reason as the same text."""
    data = b"https://a.example/\xff".decode("utf-8", "surrogateescape")
    reason = "bad byte \udcff \ud800"
    record = deadletter.parse(python_record(client, "seed", data, reason))
    assert record["kind"] == "seed"
    assert record["reason"] == reason
    assert deadletter.data_of(record) == b"https://a.example/\xff"


def test_a_requeue_whose_list_changes_under_every_attempt_stops_with_a_clear_error(
    client: redis.Redis, name: str
) -> None:
    """A dead-letter list that changes while each batch is planned (here: at every
    record, as no real crawl does) is retried, its batch halved down to one record,
    then given up with a message that says what to do, instead of spinning for ever."""
    from scrapy_dist.queue import FifoQueue
    from scrapy_dist.seeds import SeedQueue

    dead = f"{name}:dead"
    client.rpush(dead, *[python_record(client, "request", REQUEST, REASON) for _ in range(3)])
    plans = []

    def appending_meanwhile(data: bytes) -> float:
        plans.append(data)
        client.rpush(dead, b"appended by a worker")
        return 0.0

    requeuer = deadletter.Requeuer(
        client,
        dead,
        queue=FifoQueue(client, f"{name}:requests", f"{name}:seq"),
        seeds=SeedQueue(client, f"{name}:start_urls", "list"),
        check_seed=lambda data: None,
        check_request=appending_meanwhile,
    )
    with pytest.raises(deadletter.ListContended, match="Pause the crawl"):
        requeuer.all()
    # the batch of 3 tried 3 times, then batches of 1, 50 times
    batches = deadletter.BATCH_ATTEMPTS * 3 + deadletter.CONTENDED_ATTEMPTS
    assert len(plans) == batches
    assert requeuer.requests == 0
    assert client.llen(dead) == 3 + batches
    assert not client.exists(f"{name}:requests")
