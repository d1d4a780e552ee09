"""The scripts' typed calls follow each ``.lua`` header, and Lua sees Python's constants."""

from __future__ import annotations

import re
from importlib.resources import files
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_dist import lua_source
from scrapy_dist.frontier.wire import ENTRY_ID_LEN, LUA_CONSTANTS
from scrapy_dist.lua_source import source
from scrapy_dist.scripts import HistoryKeys, ScriptCall, Scripts

if TYPE_CHECKING:
    from collections.abc import Callable


def _header(name: str) -> str:
    """The comment lines that open ``lua/<name>.lua``."""
    text = lua_source._read(name)
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
    "heartbeat": lambda s: s.heartbeat(
        workers="w",
        worker="me",
        history=HistoryKeys("f", "h", "s", "p", "q", "o", "l", "d", queue_kind="list"),
        figures=(1, 2, 3),
    ),
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


def test_every_script_has_the_constants_written_in_and_each_library_once() -> None:
    for name in lua_source.NAMES:
        text = source(name)
        assert not lua_source._names_in(text) & set(LUA_CONSTANTS), name  # written as values
        for library in ("_leases", "_fence", "_filters", "_batch"):
            opening = lua_source._read(library).splitlines()[0]
            assert text.count(opening) <= 1, (name, library)


def test_lua_and_python_agree_on_the_constants(client: redis.Redis) -> None:
    names = list(LUA_CONSTANTS)
    lua = lua_source.constants() + "\nreturn {" + ", ".join(f"tostring({n})" for n in names) + "}"
    values = [v.decode() for v in client.eval(lua, 0)]
    assert values == [str(LUA_CONSTANTS[n]) for n in names]


def test_a_script_keeps_the_library_definitions_it_reaches_and_drops_the_rest() -> None:
    library = "\n".join(
        [
            "-- A library.",
            "local LIMIT = 3",
            "local a, b = 1, 2",
            "-- helper: named in this comment, the string below and a field: not kept for it",
            "local function helper(x)",
            "  return x + LIMIT",
            "end",
            "local function unused()",
            '  return "helper" .. t.helper',
            "end",
            "-- used by the body",
            "local function wanted(x)",
            "  return helper(x) + b",
            "end",
        ]
    )
    kept = "\n".join(lua_source.used_definitions([library], "return wanted(1)"))
    assert "local LIMIT = 3" in kept
    assert "local a, b = 1, 2" in kept  # b is read
    assert "local function helper(x)" in kept
    assert "local function wanted(x)" in kept
    assert "-- used by the body" in kept
    assert "unused" not in kept
    kept = "\n".join(lua_source.used_definitions([library], '-- wanted\nreturn "wanted"'))
    assert "wanted" not in kept.replace("-- A library.", "")


def _definition_names(text: str) -> set[str]:
    return {name for names, _ in lua_source._definitions(text) for name in names}


def test_every_script_defines_each_library_name_its_text_uses() -> None:
    """Every library definition a script's shaken text names (outside comments and
    strings) is in that text: none was dropped that the script can reach."""
    for name in lua_source.NAMES:
        libraries, _ = lua_source.parts(name)
        everything = set().union(*(_definition_names(lib) for lib in libraries))
        text = source(name)
        used = lua_source._names_in(text) & everything
        assert used <= _definition_names(text), (name, used - _definition_names(text))


#: Globals a script may read (Lua 5.1's and Redis's): a library definition of one of
#: these names would change what a text placed after it reads.
LUA_GLOBALS = {
    "assert", "collectgarbage", "error", "getmetatable", "ipairs", "loadstring", "next",
    "pairs", "pcall", "rawequal", "rawget", "rawset", "select", "setmetatable", "tonumber",
    "tostring", "type", "unpack", "xpcall", "string", "table", "math", "bit", "cjson",
    "cmsgpack", "struct", "redis", "KEYS", "ARGV", "_G", "_VERSION",
}  # fmt: skip


def test_no_library_defines_a_name_lua_or_redis_gives_scripts() -> None:
    """source() may put a definition before text that came before it (the definitions a
    script's early return reaches): that text would read the library's local where it
    read a global of the same name. No library defines one."""
    for path in files(lua_source.LUA_PACKAGE).iterdir():
        if path.name.startswith("_") and path.name.endswith(".lua"):
            assert not _definition_names(path.read_text()) & LUA_GLOBALS, path.name


def test_the_definitions_only_the_rest_reaches_come_after_the_early_return() -> None:
    """settle's all-done path returns before the definitions only its general path
    needs: they follow it, and what it needs precedes it, each definition once."""
    text = source("settle")
    head, tail = text.split("\nlocal done, retried", 1)[0].rsplit("if all_done and", 1)
    libraries, body = lua_source.parts("settle")
    defined = [_definition_names(t) for t in lua_source.used_definitions(libraries, body)]
    everything = set().union(*defined)
    before = _definition_names(head) & everything
    after = _definition_names(tail) & everything
    assert {"fence", "add_counts", "array_of"} <= before
    assert {"parse_holding", "return_entry", "dead_record"} <= after
    assert not before & after
    assert before | after == everything
    # the line that marks the place is a comment of the script's own text
    assert "-- (the libraries' other definitions go here)" in body


#: A library and a script of blocks, for the tests of source()'s placement.
_BLOCKS_LIBRARY = """-- A library.
local shared = {}
local function note(x)
  shared[#shared + 1] = x
  return #shared
end
local function double(x)
  return 2 * x
end
local function only_a(x)
  return double(x) + 1
end
local function only_b(x)
  return note(double(x))
end
local function everywhere(x)
  return x
end
"""
_BLOCKS_SCRIPT = """-- uses: _lib
local out = {everywhere(1)}
if ARGV[1] == "a" then
  -- (the libraries' definitions only this block uses go here)
  out[#out + 1] = only_a(2)
  out[#out + 1] = note(7)
elseif ARGV[1] == "b" then
  -- (the libraries' definitions only this block uses go here)
  out[#out + 1] = only_b(3)
end
return out
"""


def _assembled(monkeypatch: pytest.MonkeyPatch, texts: dict[str, str]) -> str:
    monkeypatch.setattr(lua_source, "_read", texts.__getitem__)
    return lua_source.source.__wrapped__("script")


def test_the_definitions_only_one_block_reaches_are_built_in_it(
    monkeypatch: pytest.MonkeyPatch, client: redis.Redis
) -> None:
    """A definition only one block reaches is made in it; a function two blocks reach,
    in each; any other definition two blocks reach (state: one table for both), and
    what the text outside the blocks reaches, before the body."""
    text = _assembled(monkeypatch, {"script": _BLOCKS_SCRIPT, "_lib": _BLOCKS_LIBRARY})
    head, body = text.split("local out = ", 1)
    block_a, block_b = body.split('elseif ARGV[1] == "b" then')
    assert _definition_names(head) == {"shared", "everywhere"}
    assert _definition_names(block_a) == {"double", "note", "only_a"}
    assert _definition_names(block_b) == {"double", "note", "only_b"}
    assert "(the libraries' definitions" not in text
    assert [int(x) for x in client.eval(text, 0, "a")] == [1, 5, 1]
    assert [int(x) for x in client.eval(text, 0, "b")] == [1, 1]
    assert [int(x) for x in client.eval(text, 0, "c")] == [1]


def test_a_block_of_definitions_is_refused_where_they_would_read_the_wrong_local(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shadowing = _BLOCKS_SCRIPT.replace("local out = ", "local double = 3\nlocal out = ")
    with pytest.raises(ValueError, match="double"):
        _assembled(monkeypatch, {"script": shadowing, "_lib": _BLOCKS_LIBRARY})
    outside = "-- uses: _lib\n  -- (the libraries' definitions only this block uses go here)\n"
    with pytest.raises(ValueError, match="outside a block"):
        _assembled(monkeypatch, {"script": outside + "return 1\n", "_lib": _BLOCKS_LIBRARY})


def test_reserve_and_enqueue_build_their_rare_paths_only_where_they_run() -> None:
    """Reclaiming expired leases, the other kind of queue, the other dupefilter kinds:
    their definitions are made in the blocks that run them, not on every call."""
    for name, first, common, rare in [
        (
            "reserve",
            "local holders, holding,",
            {"fence", "holding_record", "batched"},
            {"parse_holding", "take_slots", "take_levels", "rebuild_holders", "next_ids"},
        ),
        (
            "enqueue",
            "local queue, seq, holding =",
            {"fence", "set_filter", "push_levels", "next_ids"},
            {"filter_for", "bloom_filter", "push_slots", "slots_refusal"},
        ),
    ]:
        head = source(name).split(first, 1)[0]
        assert common <= _definition_names(head), name
        assert not rare & _definition_names(head), name
        assert (
            "(the libraries' definitions only this block uses go here)"
            in (lua_source.parts(name)[1])
        )


@pytest.mark.parametrize(
    ("first", "n"),
    [(0, 1), (1, 25), (9, 3), (10, 10), (999, 2), (123456789012345, 17), (2**53 - 31, 31)],
)
def test_consecutive_ids_are_written_as_the_entries_start(
    client: redis.Redis, first: int, n: int
) -> None:
    lua = "\n".join(
        [
            lua_source.constants(),
            *lua_source.used_definitions(
                [lua_source._read("_batch"), lua_source._read("_sequence")], "id_texts"
            ),
            "return id_texts(tonumber(ARGV[1]), tonumber(ARGV[2]))",
        ]
    )
    texts = [t.decode() for t in client.eval(lua, 0, first, n)]
    assert texts == [f"{i:0{ENTRY_ID_LEN}d}" for i in range(first, first + n)]


@pytest.mark.parametrize("size", [0, 1, 7, 1000, 1001])
def test_an_array_made_at_its_size_is_as_long_as_what_was_put_in_it(
    client: redis.Redis, size: int
) -> None:
    lua = "\n".join(
        [
            *lua_source.used_definitions([lua_source._read("_batch")], "array_of"),
            "local lengths, size = {}, tonumber(ARGV[1])",
            "for filled = 0, math.min(size, 12) do",
            "  local t = array_of(size)",
            "  for i = 1, filled do t[i] = i end",
            "  local n = 0",
            "  for _ in ipairs(t) do n = n + 1 end",
            "  lengths[#lengths + 1] = #t .. '/' .. n",
            "end",
            "return lengths",
        ]
    )
    lengths = [x.decode() for x in client.eval(lua, 0, size)]
    assert lengths == [f"{n}/{n}" for n in range(min(size, 12) + 1)]


def test_constants_are_written_as_values_where_code_names_them() -> None:
    text = lua_source.inline_constants(
        'x = a..ENTRY_ID_LEN .. t.DONE .. "ENTRY_ID_LEN" -- ENTRY_ID_LEN\n'
        "if ENTRY_ID_LEN == 2 then y = {ENTRY_ID_LEN = FROM_QUEUE} end t:FROM_QUEUE()"
    )
    assert text == (
        'x = a..16 .. t.DONE .. "ENTRY_ID_LEN" -- ENTRY_ID_LEN\n'
        'if 16 == 2 then y = {ENTRY_ID_LEN = "q"} end t:FROM_QUEUE()'
    )


def test_every_assembled_script_compiles(client: redis.Redis) -> None:
    """A definition left out, or a constant written in where Lua cannot take a value,
    is a script Redis refuses to load (or a global it refuses to read, caught by the
    name test above): every script is loaded here, not only those a test calls."""
    for script in Scripts(client).all():
        assert client.script_load(script.script) == script.sha
