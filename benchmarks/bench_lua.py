"""Where a frontier script's server time goes, statement by statement, and what running
the same scripts as Redis functions (``FUNCTION LOAD`` once, then ``FCALL``) would save
(issue 15: Redis CPU per page).

Usage::

    python benchmarks/bench_lua.py                  # phases, then EVALSHA vs FCALL (~1 min)
    python benchmarks/bench_lua.py --calls 500 --skip-functions

**Phases**: for ``enqueue`` (20 new links into a priority queue with the exact set
dupefilter), ``reserve`` (5 leases) and ``settle`` (5 leases done), one variant of the
script per top-level statement of its body, ending just before it (``do return 0 end``
inserted there); each variant runs ``--calls`` times on the same fresh state, and the
server time per call (``INFO commandstats``, best of five rounds) gives what each
statement adds. "start" is the cost before the body's first statement: the round of
``EVALSHA`` itself, ``KEYS``/``ARGV`` turned into Lua strings, and the constants and
library functions every call defines anew.

**Functions**: the same scripts wrapped as one Redis function library each (the body a
function of the library, ``KEYS``/``ARGV`` set from the call's arguments), called with
``FCALL``, against ``EVALSHA`` of today's scripts, on the same states. Needs Redis >= 7;
skipped on 6.2. This is a measurement of an option, not how scrapy_dist calls its scripts.

Every run starts its own ``redis-server`` on a free port of 127.0.0.1 and stops it.
Writes ``benchmarks/results/lua-<timestamp>.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider

from scrapy_dist.frontier.wire import FROM_QUEUE
from scrapy_dist.keys import RedisKeys
from scrapy_dist.lua_source import constants, parts
from scrapy_dist.queue import PriorityQueue, RedisQueue
from scrapy_dist.scripts import ScriptCall, scripts_for
from scrapy_dist.serializers import JsonSerializer, RequestCodec
from scrapy_dist.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import redis

RESULTS = Path(__file__).resolve().parent / "results"
#: A column-0 line that starts a statement of a script's body (blocks are indented).
STATEMENT = re.compile(r"^(local |if |for |while |do\b|return\b|[A-Za-z_][\w.]*\()")
#: A library's top level sees no ``math`` when loaded as a function library (Redis 7).
LOAD_TIME_MATH = "local fmod, floor = math.fmod, math.floor"
LINKS, LEASES = 20, 5
#: Rounds per variant; the best is kept (this machine is shared and noisy).
ROUNDS = 5


class Spiderling(Spider):
    name = "bench"

    def parse(self, response: Any) -> None: ...


CODEC = RequestCodec(JsonSerializer(), Spiderling())


def url67(i: int) -> str:
    return f"https://books.example.com/catalogue/category/books/item-{i:010d}/index.html"


#: The keys of :class:`Frontier`'s crawl.
KEYS_OF_BENCH = RedisKeys(crawl="b", requests="b:q", dupefilter="b:df", start_urls="b:seeds")


class Frontier:
    """One crawl's keys on a scratch server, and one typed call per script."""

    def __init__(
        self, client: redis.Redis, queue: RedisQueue | None = None, score: float | str = 0.0
    ) -> None:
        self.client = client
        self.scripts = scripts_for(client)
        self.queue = queue or PriorityQueue(client, "b:q", "b:seq")
        #: Every request's score as its queue's enqueue reads it (a queue per slot's
        #: ``"<score>@<slot>"``).
        self.score = score
        self.links = 0

    def fresh(self, queued: int = 0, leased: int = 0) -> list[str]:
        """Empty the server, queue ``queued`` requests, lease ``leased`` of them (ids)."""
        self.client.flushall()
        self.client.set("b:epoch", "E")
        for start in range(0, queued, 500):
            self.queue.push(
                [
                    (CODEC.encode(Request(url67(i), callback=Spiderling().parse)), self.score, b"")
                    for i in range(start, min(start + 500, queued))
                ]
            )
        ids: list[str] = []
        while len(ids) < leased:
            reply = self.reserve(min(500, leased - len(ids))).run()
            ids += [i.decode() for i in reply[0::3]]
        return ids

    def reserve(self, count: int) -> ScriptCall:
        return self.scripts.reserve(
            holders="b:holders",
            holding="b:holders:w1",
            deliveries="b:deliveries",
            dead="b:dead",
            queue="b:q",
            seeds="b:seeds",
            seq="b:seq",
            progress="b:progress",
            epoch_key="b:epoch",
            previous=("b:leases", "b:leased"),
            origin=FROM_QUEUE,
            take=self.queue.take,
            queue_put_back=self.queue.put_back,
            seeds_put_back="lpush",
            count=count,
            duration=3600,
            worker="w1",
            max_deliveries=5,
            reclaim_limit=100,
            epoch="E",
            take_args=self.queue.take_args(),
            take_keys=self.queue.take_keys(KEYS_OF_BENCH),
        )

    def settle(self, ids: list[str]) -> ScriptCall:
        return self.scripts.settle(
            holding="b:holders:w1",
            deliveries="b:deliveries",
            dead="b:dead",
            queue="b:q",
            seeds="b:seeds",
            progress="b:progress",
            epoch_key="b:epoch",
            worker="w1",
            queue_put_back=self.queue.put_back,
            seeds_put_back="lpush",
            max_deliveries=5,
            epoch="E",
            outcomes=[(i, "") for i in ids],
        )

    def enqueue(self) -> ScriptCall:
        """An enqueue of the next :data:`LINKS` links."""
        first, self.links = self.links, self.links + LINKS
        return self.enqueue_links(first, LINKS)

    def enqueue_links(self, first: int, n: int, parents: Sequence[str] | None = None) -> ScriptCall:
        """An enqueue of the 67-character links ``first`` .. ``first + n - 1``, naming
        ``parents`` in turn (none: no parent)."""
        entries = [
            (
                hashlib.sha1(url67(i).encode()).digest(),
                self.score,
                CODEC.encode(Request(url67(i), callback=Spiderling().parse)),
            )
            for i in range(first, first + n)
        ]
        return self.scripts.enqueue(
            queue="b:q",
            seq="b:seq",
            epoch_key="b:epoch",
            queue_kind=self.queue.kind,
            filter_kind="set",
            filter_keys=["b:fp"],
            filter_args=[0],
            entries=entries,
            epoch="E",
            holding="b:holders:w1" if parents else "",
            parents=[parents[k % len(parents)] for k in range(n)] if parents else (),
        )


#: script -> (state before a round: queued, leased; the call to make, given the leases)
def cases(frontier: Frontier, calls: int) -> dict[str, tuple[Callable[[], list[str]], Any]]:
    def batches(ids: list[str]) -> Callable[[], ScriptCall]:
        chunks = [ids[i : i + LEASES] for i in range(0, len(ids), LEASES)]
        return lambda: frontier.settle(chunks.pop())

    return {
        "enqueue": (frontier.fresh, lambda _: frontier.enqueue),
        "reserve": (
            lambda: frontier.fresh(queued=LEASES * calls),
            lambda _: lambda: frontier.reserve(LEASES),
        ),
        "settle": (
            lambda: frontier.fresh(queued=LEASES * calls, leased=LEASES * calls),
            batches,
        ),
    }


def server_us(client: redis.Redis, command: str) -> float:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return float(stats.get("usec_per_call", 0.0))


def cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def timed(
    client: redis.Redis,
    *,
    prepare: Callable[[], list[str]],
    make: Any,
    calls: int,
    run: Callable[[ScriptCall], Any],
    command: str,
) -> dict[str, float]:
    """Best of :data:`ROUNDS`: server µs per call and server CPU µs per call."""
    best = {"us_per_call": float("inf"), "cpu_us_per_call": float("inf")}
    for _ in range(ROUNDS):
        next_call = make(prepare())
        client.config_resetstat()
        cpu0 = cpu(client)
        for _ in range(calls):
            run(next_call())
        spent = (cpu(client) - cpu0) * 1e6 / calls
        best["us_per_call"] = min(best["us_per_call"], server_us(client, command))
        best["cpu_us_per_call"] = min(best["cpu_us_per_call"], spent)
    return best


def body_with_stop(name: str, line: int | None) -> str:
    """The script's text with ``do return 0 end`` before body line ``line`` (1-based)."""
    libs, text = parts(name)
    body = text.split("\n")
    if line is not None:
        body = [*body[: line - 1], "do return 0 end", *body[line - 1 :]]
    return "\n".join([constants(), *libs, *body])


def phases(frontier: Frontier, calls: int) -> dict[str, list[dict[str, Any]]]:
    client = frontier.client
    result: dict[str, list[dict[str, Any]]] = {}
    for name, (prepare, make) in cases(frontier, calls).items():
        lines = parts(name)[1].split("\n")
        stops: list[int | None] = [n for n, text in enumerate(lines, 1) if STATEMENT.match(text)]
        stops.append(None)  # the whole script
        rows = []
        for stop in stops:
            sha = client.script_load(body_with_stop(name, stop))

            def run(call: ScriptCall, sha: str = sha) -> Any:
                return client.evalsha(sha, len(call.keys), *call.keys, *call.args)

            figures = timed(
                client, prepare=prepare, make=make, calls=calls, run=run, command="evalsha"
            )
            label = lines[stop - 1].strip()[:60] if stop else "(end of script)"
            rows.append({"line": stop, "statement": label, **figures})
        result[name] = rows
    return result


def library(name: str) -> str:
    """Script ``name`` as a Redis function library ``bench_<name>`` with one function of
    the same name: the body becomes a function, ``KEYS``/``ARGV`` upvalues set per call."""
    libs, body = parts(name)
    text = "\n".join([constants(), *libs])
    late = ""
    if LOAD_TIME_MATH in text:  # math is there when the function runs, not at load
        text = text.replace(LOAD_TIME_MATH, "local fmod, floor")
        late = "fmod, floor = math.fmod, math.floor; "
    return "\n".join(
        [
            f"#!lua name=bench_{name}",
            "local KEYS, ARGV",
            text,
            "local function main()",
            body,
            "end",
            f"redis.register_function('bench_{name}', function(keys, args) "
            f"KEYS, ARGV = keys, args; {late}return main() end)",
        ]
    )


def functions(frontier: Frontier, calls: int) -> dict[str, dict[str, Any]]:
    client = frontier.client
    result: dict[str, dict[str, Any]] = {}
    for name, (prepare, make) in cases(frontier, calls).items():
        client.function_load(library(name), replace=True)
        sha = client.script_load(body_with_stop(name, None))

        def evalsha(call: ScriptCall, sha: str = sha) -> Any:
            return client.evalsha(sha, len(call.keys), *call.keys, *call.args)

        def fcall(call: ScriptCall, name: str = name) -> Any:
            return client.fcall(f"bench_{name}", len(call.keys), *call.keys, *call.args)

        case = {"prepare": prepare, "make": make, "calls": calls}
        result[name] = {
            "evalsha": timed(client, **case, run=evalsha, command="evalsha"),
            "fcall": timed(client, **case, run=fcall, command="fcall"),
        }
    return result


def print_phases(result: dict[str, list[dict[str, Any]]]) -> None:
    for name, rows in result.items():
        print(f"\n{name}: server µs per call at each top-level statement (best of {ROUNDS})")
        print(f"  {'line':>5} {'µs':>7} {'+µs':>6}  statement")
        previous = 0.0
        for row in rows:
            us = row["us_per_call"]
            line = row["line"] or "end"
            print(f"  {line:>5} {us:7.1f} {us - previous:+6.1f}  {row['statement']}")
            previous = us


def print_functions(result: dict[str, dict[str, Any]]) -> None:
    print(f"\nEVALSHA vs FCALL of the same script (best of {ROUNDS}; server µs, CPU µs per call)")
    print(f"  {'script':10} {'evalsha':>8} {'fcall':>8} {'ratio':>6}   {'cpu e':>6} {'cpu f':>6}")
    for name, row in result.items():
        e, f = row["evalsha"], row["fcall"]
        print(
            f"  {name:10} {e['us_per_call']:8.1f} {f['us_per_call']:8.1f} "
            f"{f['us_per_call'] / e['us_per_call']:6.2f}   "
            f"{e['cpu_us_per_call']:6.1f} {f['cpu_us_per_call']:6.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per variant and round")
    parser.add_argument("--skip-functions", action="store_true", help="phases only")
    parser.add_argument("--out", type=Path, help="JSON file (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    server = RedisServer().start()
    try:
        client = server.client()
        frontier = Frontier(client)
        version = str(client.info("server")["redis_version"])
        result: dict[str, Any] = {"redis_version": version, "calls": args.calls}
        result["phases"] = phases(frontier, args.calls)
        print_phases(result["phases"])
        if not args.skip_functions and int(version.split(".", maxsplit=1)[0]) >= 7:
            result["functions"] = functions(frontier, args.calls)
            print_functions(result["functions"])
        client.close()
    finally:
        server.stop()
    print(f"\nwrote {write_result(result, args.out, 'lua')}")
    return 0


def write_result(result: dict[str, Any], out: Path | None, stem: str) -> Path:
    """Write ``result`` as JSON to ``out``, or ``benchmarks/results/<stem>-<time>.json``."""
    out = out or RESULTS / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out


if __name__ == "__main__":
    sys.exit(main())
