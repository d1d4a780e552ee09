"""Run, against a Redis client, the read a worker's part asks a flush to carry
(:meth:`scrapy_dist.frontier.events.FrontierEvents.carry`), as the flush would: its
command sent, its reply (or the error) handed back to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from scrapy_dist.frontier.events import Read

__all__ = ["carry"]


def carry(rider: Callable[[], Read | None], client: redis.Redis) -> None:
    """Ask ``rider`` for its read and run it on ``client``, as a flush does.

    Raises:
        AssertionError: the rider had nothing due.
    """
    read = rider()
    assert read is not None, "the rider had nothing due"
    try:
        reply: Any = client.execute_command(*read.command.args)  # type: ignore[no-untyped-call]
    except Exception as e:  # (a flush hands the error to the reply's owner)
        reply = e
    read.on_reply(reply)
