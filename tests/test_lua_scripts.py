"""The scripts' typed calls follow each ``.lua`` header, and Lua sees Python's constants."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_dist import scripts
from scrapy_dist.scripts import LUA_CONSTANTS, ScriptCall, Scripts, source

if TYPE_CHECKING:
    from collections.abc import Callable


def _header(name: str) -> str:
    """The comment lines that open ``lua/<name>.lua``."""
    text = scripts._read(name)
    return "\n".join(line for line in text.splitlines() if line.startswith("--")).split(
        "\n-- uses:"
    )[0]


def _fixed(header: str, what: str) -> int:
    """The highest ``KEYS[i]``/``ARGV[i]`` the header names one by one."""
    return max((int(i) for i in re.findall(rf"{what}\[(\d+)\] =", header)), default=0)


#: A typed call of each script with one value per parameter (variable tails of one).
CALLS: dict[str, Callable[[Scripts], ScriptCall]] = {
    "enqueue": lambda s: s.enqueue(
        queue="q", seq="s", epoch_key="e", queue_kind="list", entries=[(b"", 0.0, b"p")]
    ),
    "reserve": lambda s: s.reserve(
        holders="h",
        holding="hw",
        deliveries="n",
        dead="x",
        queue="q",
        seeds="s",
        seq="c",
        progress="p",
        epoch_key="e",
        previous=("l", "d"),
        origin="q",
        take="rpop",
        queue_put_back="rpush",
        seeds_put_back="lpush",
        count=1,
        duration=1.0,
        worker="w",
        max_deliveries=3,
        reclaim_limit=100,
        epoch="",
    ),
    "settle": lambda s: s.settle(
        holding="hw",
        deliveries="n",
        dead="x",
        queue="q",
        seeds="s",
        progress="p",
        epoch_key="e",
        worker="w",
        queue_put_back="rpush",
        seeds_put_back="lpush",
        max_deliveries=3,
        epoch="",
        outcomes=[("1", "")],
    ),
    "renew": lambda s: s.renew(
        holders="h",
        holding="hw",
        epoch_key="e",
        worker="w",
        duration=1.0,
        epoch="",
        lease_ids=["1"],
    ),
    "release": lambda s: s.release(
        holding="hw",
        deliveries="n",
        queue="q",
        seeds="s",
        epoch_key="e",
        dead="d",
        progress="p",
        queue_put_back="rpush",
        seeds_put_back="lpush",
        epoch="",
        worker="w",
        known=["1"],
    ),
    "progress": lambda s: s.progress(
        queue="q",
        seeds="s",
        holders="h",
        previous="l",
        progress="p",
        epoch_key="e",
        clear_keys=["k"],
        queue_kind="list",
        seeds_kind="list",
        grace=1.0,
        clear=True,
        keep_for=0,
        epoch="",
    ),
    "join": lambda s: s.join(
        workers="w",
        progress="p",
        starts="t",
        flush_keys=["k"],
        worker="me",
        timeout=1.0,
        flush=False,
        age=0.0,
    ),
    "heartbeat": lambda s: s.heartbeat(workers="w", worker="me"),
    "census": lambda s: s.census(
        queue="q",
        holders="h",
        previous="l",
        progress="p",
        epoch_key="e",
        queue_kind="list",
        epoch="",
    ),
    "leased": lambda s: s.leased(holders="h", previous="l"),
    "leave": lambda s: s.leave(workers="w", worker="me", timeout=1.0),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_typed_call_passes_the_keys_and_args_its_header_names(name: str) -> None:
    call = CALLS[name](Scripts(redis.Redis()))  # registering is local: no server needed
    header = _header(name)
    assert call.script.script == source(name)
    keys, args = _fixed(header, "KEYS"), _fixed(header, "ARGV")
    assert len(call.keys) >= keys > 0
    assert len(call.args) >= args
    if f"KEYS[{keys + 1}.." not in header and f"KEYS[{keys}.." not in header:
        assert len(call.keys) == keys  # no variable tail: exactly the keys named


def test_every_script_sees_the_constants_once_and_each_library_once() -> None:
    for name in scripts.NAMES:
        text = source(name)
        assert text.startswith(scripts.constants())
        assert text.count("local ENTRY_ID_LEN =") == 1
        for library in ("_leases", "_fence", "_filters", "_batch"):
            opening = scripts._read(library).splitlines()[0]
            assert text.count(opening) <= 1, (name, library)


def test_lua_and_python_agree_on_the_constants(client: redis.Redis) -> None:
    names = list(LUA_CONSTANTS)
    lua = scripts.constants() + "\nreturn {" + ", ".join(f"tostring({n})" for n in names) + "}"
    values = [v.decode() for v in client.eval(lua, 0)]
    assert values == [str(LUA_CONSTANTS[n]) for n in names]
