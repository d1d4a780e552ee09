"""Instructions the Redis server runs per frontier script call, and per crawled page in a
steady crawl's mix of calls, counted by valgrind's callgrind (issue 15: Redis CPU per page).

Usage::

    python benchmarks/bench_instructions.py               # ~2 min
    python benchmarks/bench_instructions.py --calls 200 --out FILE
    python benchmarks/bench_instructions.py --queue slots   # SlotQueue
    python benchmarks/bench_instructions.py --ops --functions   # ~4 min
    REDIS_SERVER=<a build with symbols> python benchmarks/bench_instructions.py --profile
    python benchmarks/bench_instructions.py --compare BEFORE.json AFTER.json

Timings on a shared machine move by 10-50 % between runs; an instruction count does not
(the same binary, inputs and calls give the same count whatever else the machine does).
So this is the figure to compare two versions of the scripts by. The server runs under
``valgrind --tool=callgrind`` (slow, so only script calls are measured, not a crawl);
before each case its counters are zeroed, after it they are dumped, and the count is
divided by the calls. The idle server's own instructions over the same span (a case of
no calls, subtracted) are small next to the calls'.

What is counted is user-space work only: the script, the commands it runs, reading the
request and writing the reply. The kernel's side of each round trip (socket calls,
``epoll``) is not, and it does not depend on the scripts.

Cases (compact entries of 67-character URLs, a priority queue, or with ``--queue slots``
a queue per download slot whose requests are all of one slot, as the benchmark site's;
the exact set dupefilter):
``return 1`` and ``PING`` (the floor of a call), ``reserve`` of 1, 5 and 20 leases,
``settle`` of 1, 5 and 20 leases done, ``enqueue`` of 1 and 20 new links, and **page**: the
calls of a steady crawl for 10 pages, as ``bench_server.py`` counted them on the
benchmark site (one worker, the default settings: a reserve of about 10 leases, an
enqueue of about 12 links each naming its parent lease, 10 of them new, a settle of 10),
divided by 10.

``--ops`` adds what one operation inside a script costs (a statement run 20 times in a
loop, less the loop): string functions, a table, ``redis.call`` of a few commands, a
number given to a command. ``--functions`` adds ``EVALSHA`` against ``FCALL`` of
reserve, settle and enqueue loaded as a Redis function library (``bench_lua.library``).

``--profile`` adds the page case by the server's functions (callgrind_annotate's
inclusive counts): the Lua code, the commands it calls, Lua's memory, garbage collection
and table growth, KEYS and ARGV, the replies. It needs a redis-server whose functions
have names: Debian's is stripped, one built from Redis's sources (``make``) is not.

Needs ``valgrind`` (Debian's package) and a ``redis-server`` (``$REDIS_SERVER``, or the
one ``make install`` finds). Writes ``benchmarks/results/instructions-<time>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_lua import Frontier, library, url67, write_result

from scrapy_dist.queue import PriorityQueue
from scrapy_dist.slot_queue import SlotQueue
from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.server_kinds import find_redis_server

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from scrapy_dist.scripts import ScriptCall

#: Pages of the "page" case: its calls are counted together, then divided by this.
PAGE_BATCH = 10


class Counter:
    """A redis-server under callgrind, and its instruction count over a span of calls."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        wrapper = directory / "redis-under-callgrind"
        wrapper.write_text(
            "#!/bin/sh\n"
            f'exec valgrind --tool=callgrind -q --callgrind-out-file="{directory}/out.%p" '
            f'"{find_redis_server()}" "$@"\n'
        )
        wrapper.chmod(0o755)
        self.server = RedisServer(binary=str(wrapper))

    def __enter__(self) -> Counter:
        self.server.start(timeout=120)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def _control(self, option: str) -> None:
        subprocess.run(
            ["callgrind_control", option, str(self.server.pid)], check=True, capture_output=True
        )

    def dump(self, run: Callable[[], object]) -> Path:
        """callgrind's dump of what the server ran while ``run()`` ran (the caller
        deletes it)."""
        self._control("--zero")
        run()
        before = set(self.directory.glob("out.*"))
        self._control("--dump")
        (dump,) = set(self.directory.glob("out.*")) - before
        return dump

    def count(self, run: Callable[[], object]) -> int:
        """Instructions the server ran while ``run()`` ran."""
        dump = self.dump(run)
        match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
        dump.unlink()
        if match is None:
            raise RuntimeError(f"no instruction total in callgrind's dump {dump.name}")
        return int(match.group(1))

    def per_call(self, run: Callable[[], object], calls: int) -> float:
        """Instructions per call of ``run()``, which makes ``calls`` calls, less the idle
        server's over a span of no call."""
        idle = self.count(lambda: None)
        return (self.count(run) - idle) / calls


#: ``--queue``: the request queue of the cases, and the score its requests are queued at.
QUEUES: dict[str, tuple[type[PriorityQueue], float | str]] = {
    "levels": (PriorityQueue, 0.0),
    "slots": (SlotQueue, "0.0@books.example.com"),
}


def loaded_frontier(client: redis.Redis, queue: str = "levels") -> Frontier:
    """A :class:`Frontier` on a queue of :data:`QUEUES` whose scripts are loaded already:
    a load is not a call's cost."""
    cls, score = QUEUES[queue]
    frontier = Frontier(client, cls(client, "b:q", "b:seq"), score)
    for script in frontier.scripts.all():
        client.script_load(script.script)
    return frontier


def measure(
    counter: Counter, client: redis.Redis, calls: int, queue: str = "levels"
) -> dict[str, float]:
    """Instructions per call of each case (per page for "page")."""
    frontier = loaded_frontier(client, queue)
    trivial = client.script_load("return 1")

    def span(prepare: Callable[[], Any], make: Callable[[Any], Any]) -> float:
        state = prepare()
        made = [make(state) for _ in range(calls)]
        return counter.per_call(lambda: [call() for call in made], calls)

    def leases(n: int) -> Callable[[], list[str]]:
        return lambda: frontier.fresh(queued=n * calls + n, leased=n * calls)

    out: dict[str, float] = {}
    out["ping"] = span(lambda: None, lambda _: client.ping)
    out["return 1"] = span(lambda: None, lambda _: lambda: client.evalsha(trivial, 0))
    for n in (1, 5, 20):

        def queued(n: int = n) -> list[str]:
            return frontier.fresh(queued=n * calls)

        def reserve(_: object, n: int = n) -> Callable[[], Any]:
            call: ScriptCall = frontier.reserve(n)
            return call.run

        out[f"reserve {n}"] = span(queued, reserve)
    for n in (1, 5, 20):

        def settles(ids: list[str], n: int = n) -> Callable[[], Any]:
            chunk = ids[-n:]
            del ids[-n:]
            return frontier.settle(chunk).run

        out[f"settle {n}"] = span(leases(n), settles)
    for n in (1, 20):

        def enqueue(_: object, n: int = n) -> Callable[[], Any]:
            frontier.links += n
            call: ScriptCall = frontier.enqueue_links(frontier.links - n, n)
            return call.run

        out[f"enqueue {n}"] = span(frontier.fresh, enqueue)
    out["page"] = page(counter, frontier, calls)
    return out


def page(counter: Counter, frontier: Frontier, calls: int) -> float:
    """Instructions per page of a steady crawl's calls, ``calls`` rounds of
    :data:`PAGE_BATCH` pages each (:func:`page_rounds`)."""
    return counter.per_call(page_rounds(frontier, calls), calls * PAGE_BATCH)


def page_rounds(frontier: Frontier, calls: int) -> Callable[[], None]:
    """``calls`` rounds of a steady crawl's calls for :data:`PAGE_BATCH` pages: a reserve
    of that many leases, an enqueue of 12 links naming them (10 new, 2 the filter has
    seen), a settle of them, on a queue kept :data:`PAGE_BATCH` * 4 deep. (Only the
    server's instructions are counted: building the calls in Python between them adds
    none.)"""
    frontier.fresh(queued=PAGE_BATCH * 4)
    first = 10**6

    def rounds() -> None:
        nonlocal first
        for _ in range(calls):
            reply = frontier.reserve(PAGE_BATCH).run()
            ids = [i.decode() for i in reply[0::3]]
            frontier.enqueue_links(first - 2, PAGE_BATCH + 2, ids).run()
            first += PAGE_BATCH
            frontier.settle(ids).run()

    frontier.enqueue_links(first - 2, 2).run()  # the two seen links of the first round
    return rounds


#: ``--profile``: what the page case's instructions are spent under, by the server's
#: functions (inclusive: a row counts what the functions it names call; rows overlap).
PROFILE: dict[str, tuple[str, ...]] = {
    "the scripts' Lua code, all of it (lua_pcall)": ("lua_pcall",),
    "  redis.call and redis.pcall (luaRedisGenericCommand)": ("luaRedisGenericCommand",),
    "    the commands themselves (scriptCall)": ("scriptCall",),
    "    their replies made Lua values (parseReply)": ("parseReply",),
    "  Lua memory: allocation and freeing (luaM_realloc_)": ("luaM_realloc_",),
    "  Lua garbage collection (luaC_step)": ("luaC_step",),
    "  Lua tables: a key added, and the growth it causes (newkey)": ("newkey",),
    "  Lua strings made and interned (luaS_newlstr)": ("luaS_newlstr",),
    "  Lua concatenation (luaV_concat)": ("luaV_concat",),
    "  closures and their upvalues (luaF_newLclosure, luaF_findupval)": (
        "luaF_newLclosure",
        "luaF_findupval",
    ),
    "KEYS and ARGV made Lua tables (luaCreateArray)": ("luaCreateArray",),
    "the script's reply made a Redis reply (luaReplyToRedisReply)": ("luaReplyToRedisReply",),
    "reading requests (processMultibulkBuffer)": ("processMultibulkBuffer",),
}

#: A line of ``callgrind_annotate --inclusive=yes``: count, share, [file:]function.
_ANNOTATED = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(?:\S*:)?([\w.]+)(?:'\d+)?\s")


def profile(counter: Counter, frontier: Frontier, calls: int) -> dict[str, float]:
    """Instructions per page of the page case spent under each row of :data:`PROFILE`,
    and the total ("all"). Needs a redis-server whose functions have names (built from
    Redis's sources: Debian's is stripped); raises RuntimeError without them."""
    rounds = page_rounds(frontier, calls)
    dump = counter.dump(rounds)
    try:
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        dump.unlink()
    by_function: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        if "PROGRAM TOTALS" in line:
            total = int(line.split()[0].replace(",", ""))
        match = _ANNOTATED.match(line)
        if match:
            n, name = int(match.group(1).replace(",", "")), match.group(2)
            by_function[name] = max(n, by_function.get(name, 0))
    if "lua_pcall" not in by_function or "luaCreateArray" not in by_function:
        raise RuntimeError(
            "--profile: this redis-server's functions have no names (a stripped build); "
            "build one from Redis's sources ('make' keeps the symbols) and point "
            "REDIS_SERVER at it"
        )
    pages = calls * PAGE_BATCH
    out = {"all": total / pages}
    for label, names in PROFILE.items():
        out[label] = sum(by_function.get(name, 0) for name in names) / pages
    return out


#: What one operation of a script costs, for ``--ops``: a statement run OPS_REPEAT times
#: in a loop, with ``e`` a 106-byte entry, ``T`` 20 tokens (10 of them in set ``s``) and
#: ``ids`` 20 16-digit ids at hand; "loop" is the loop alone, subtracted from the rest.
OPS: dict[str, str] = {
    "loop": "",
    "table {e, '0'}": "local x = {e, '0'}",
    "string.sub (16 of 106 bytes)": "local x = string.sub(e, 1, 16)",
    "string.sub (90 of 106 bytes)": "local x = string.sub(e, 17)",
    "concat of 5 (a record)": "local x = 'q' .. '|' .. '0' .. '|' .. e",
    "string.find of 16 %d": "local x = string.find(e, P)",
    "string.find of %d+ (16 digits)": "local _, x = string.find(e, '^%d+')",
    "array grown by t[#t + 1], per value of 20": (
        "if i == 1 then local t = {} for j = 1, 20 do t[#t + 1] = j end end"
    ),
    "array of 20 made at once, per value": (
        "if i == 1 then local t = {unpack(E, 1, 20)} for j = 1, 20 do t[j] = j end end"
    ),
    "tonumber('12')": "local x = tonumber('12')",
    "tostring(12345)": "local x = tostring(12345)",
    "string.format('%.0f', id)": "local x = string.format('%.0f', 1764057600123456)",
    "call of a Lua function": "local x = f(e)",
    "redis.call EXISTS": "redis.call('EXISTS', 'nokey')",
    "redis.call EXISTS, a number": "redis.call('EXISTS', 12.5)",
    "redis.call TYPE": "redis.call('TYPE', 'nokey')",
    "redis.call HSET, 1 field": "redis.call('HSET', 'h', ids[i], e)",
    "redis.call RPUSH, 1 entry": "redis.call('RPUSH', 'l', e)",
    "SMISMEMBER, per token of 20": "if i == 1 then redis.call('SMISMEMBER', 's', unpack(T)) end",
    "LPUSH, per entry of 20": "if i == 1 then redis.call('LPUSH', 'l', unpack(E)) end",
}
#: Times each statement of :data:`OPS` runs per call.
OPS_REPEAT = 20


def ops(counter: Counter, client: redis.Redis, calls: int) -> dict[str, float]:
    """Instructions per run of each statement of :data:`OPS` (inside one script call)."""
    entry = b"0" * 6 + b"1764057600" + b'{"u":"' + url67(1).encode() + b'","c":"parse"}'
    tokens = [hashlib.sha1(str(i).encode()).digest() for i in range(OPS_REPEAT)]
    prologue = (
        "local e, P, T, E, ids = ARGV[1], '^' .. string.rep('%d', 16), {}, {}, {}\n"
        "local function f(a) return a end\n"
        f"for i = 1, {OPS_REPEAT} do T[i] = ARGV[i + 1]; E[i] = i .. e;"
        " ids[i] = string.format('%016d', i) end\n"
    )
    per_call: dict[str, float] = {}
    for name, statement in OPS.items():
        sha = client.script_load(f"{prologue}for i = 1, {OPS_REPEAT} do {statement} end\nreturn 1")
        client.flushall()
        client.sadd("s", *tokens[: OPS_REPEAT // 2])

        def run(sha: str = sha) -> None:
            for _ in range(calls):
                client.evalsha(sha, 0, entry, *tokens)
                client.unlink("l", "h")

        # the UNLINKs of the lists and hashes the statements fill are counted too: the
        # same in every row, so they cancel with the loop's row
        per_call[name] = counter.per_call(run, calls)
    loop = per_call.pop("loop")
    return {name: (n - loop) / OPS_REPEAT for name, n in per_call.items()}


def functions(counter: Counter, client: redis.Redis, calls: int) -> dict[str, dict[str, float]]:
    """Instructions per call of reserve, settle and enqueue (1 and 10 leases or links) run
    with ``EVALSHA`` and, loaded as a Redis function library (``bench_lua.library``), with
    ``FCALL``: what a library loaded once would save per call. Needs Redis >= 7."""
    frontier = loaded_frontier(client)
    for name in ("reserve", "settle", "enqueue"):
        client.function_load(library(name), replace=True)
    out: dict[str, dict[str, float]] = {}
    for n in (1, 10):
        for name in ("reserve", "settle", "enqueue"):
            row: dict[str, float] = {}
            for mode in ("evalsha", "fcall"):
                if name == "reserve":
                    frontier.fresh(queued=n * calls + n)
                    made = [frontier.reserve(n) for _ in range(calls)]
                elif name == "settle":
                    ids = frontier.fresh(queued=n * calls + n, leased=n * calls)
                    made = [frontier.settle(ids[i : i + n]) for i in range(0, n * calls, n)]
                else:
                    frontier.fresh()
                    made = [frontier.enqueue_links(n * i, n) for i in range(calls)]

                def run(made: list[ScriptCall] = made, mode: str = mode, name: str = name) -> None:
                    for call in made:
                        if mode == "evalsha":
                            call.run()
                        else:
                            client.fcall(f"bench_{name}", len(call.keys), *call.keys, *call.args)

                row[mode] = counter.per_call(run, calls)
            out[f"{name} {n}"] = row
    return out


def compare(before: Path, after: Path) -> None:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    print(f"instructions per call: {before.name} -> {after.name} (ratio)")
    for case, old in a["per_call"].items():
        new = b["per_call"].get(case)
        if new is not None:
            print(f"  {case:12} {old:12,.0f} -> {new:12,.0f}  ({new / old:.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per case (100)")
    parser.add_argument("--out", type=Path, help="JSON file (default: benchmarks/results/)")
    parser.add_argument(
        "--queue",
        choices=sorted(QUEUES),
        default="levels",
        help="levels: PriorityQueue (default); slots: SlotQueue, one slot",
    )
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--ops", action="store_true", help="also: what one Lua operation costs")
    parser.add_argument(
        "--functions", action="store_true", help="also: EVALSHA against FCALL (Redis >= 7)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also: the page case by the server's functions (a redis-server with symbols)",
    )
    args = parser.parse_args(argv)
    if args.compare:
        compare(*args.compare)
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="scrapy-dist-callgrind-"))
    try:
        with Counter(directory) as counter:
            client = counter.server.client(socket_timeout=120)
            version = str(client.info("server")["redis_version"])
            per_call = measure(counter, client, args.calls, args.queue)
            result: dict[str, Any] = {
                "redis_version": version,
                "queue": args.queue,
                "calls": args.calls,
                "per_call": per_call,
            }
            if args.ops:
                result["ops"] = ops(counter, client, args.calls)
            if args.functions:
                result["functions"] = functions(counter, client, args.calls)
            if args.profile:
                result["profile"] = profile(
                    counter, loaded_frontier(client, args.queue), args.calls
                )
            client.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"Instructions per call (redis-server {version} under callgrind, {args.calls} calls, "
        f"queue {args.queue})"
    )
    for case, n in per_call.items():
        print(f"  {case:12} {n:12,.0f}")
    if "ops" in result:
        print("Instructions per operation inside a script")
        for name, n in result["ops"].items():
            print(f"  {name:42} {n:8,.0f}")
    if "functions" in result:
        print("Instructions per call: EVALSHA -> FCALL (ratio)")
        for case, row in result["functions"].items():
            e, f = row["evalsha"], row["fcall"]
            print(f"  {case:12} {e:10,.0f} -> {f:10,.0f}  ({f / e:.2f})")
    if "profile" in result:
        rows = result["profile"]
        print(f"The page case by the server's functions ({rows['all']:,.0f} per page)")
        for label, n in rows.items():
            if label != "all":
                print(f"  {label:68} {n:8,.0f}  {n / rows['all']:4.0%}")
    print(f"wrote {write_result(result, args.out, 'instructions')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
