"""Whether the frontier's script calls cost the same with a small and a large crawl
(issue 36, "Scale": reserve and enqueue cost per call within 1.2x from 10,000 to
1,000,000 queued requests and from 10 to 100,000 slots; bytes per slot measured).

Usage::

    python benchmarks/bench_scale.py                          # ~1 min
    python benchmarks/bench_scale.py --sizes 10000,100000 --slots 10,1000 --calls 2000

**Queue size**: for each N of ``--sizes``, a fresh ``redis-server``; the default priority
queue (:class:`~scrapy_dist.queue.PriorityQueue`, one list per priority level) filled
with N compact entries as the scheduler writes them (67-character URLs, priorities 0 to
-3 with their ``depth`` in ``meta``, as depth priorities give them), pushed with the
queue's own ``lua/enqueue.lua`` in batches of 2,000, pipelined. Then ``--calls`` calls
each of: enqueue of 16 new entries (no dupefilter: the queue's own cost), reserve of 16
leases, settle of 16 leases (done), in rounds of ``--round`` calls per phase (enqueue,
reserve, settle), so that the queue stays within ``16 x round`` entries of N. Per call:
server time (``INFO commandstats`` of ``EVALSHA``, reset before each phase of each
round: the mean over all rounds, and the median of the rounds' figures) and the
client's wall time (one round trip per call, loopback). Memory per entry:
``used_memory`` after the fill less before / N.

Every size has its server running for the whole benchmark, filled first; the rounds
then go to each size in turn, so that a change of the machine's load weighs on every
size alike (on this shared machine, sizes measured one after the other differed by up
to 1.3x from one run to the next; in turn, by a few per cent). The slot counts likewise.

**Slots**: for each S of ``--slots``, a fresh ``redis-server``; ``lua/politeness.lua``
told of S download slots as a running crawl tells it: per slot a turn asked for
(concurrency 2, delay 1 ms), then confirmed sent and released, in batches of 500 slots,
which leaves each slot's next send time in ``<crawl>:polite:next``; one slot in ten (at
most 1,000) keeps its token in flight (``polite:tokens`` and ``polite:busy``). Bytes per
slot: ``used_memory`` after less before / S. Then ``--calls`` calls, each confirming and
releasing the turns the previous call was granted and asking for the next 16 slots in
turn over the S (each one a turn; with S < 16, the S slots: a worker asks for a slot
once per call). Server time per call as above, and per turn granted. The token timeout
is 600 s so that nothing expires during a run.

The commands the scripts run are counted in ``INFO commandstats`` too; their time per
call of the script is kept in the JSON (``inner``) and the largest are printed.

Every run starts its own ``redis-server`` on a free port of 127.0.0.1 and stops it.
Writes ``benchmarks/results/scale-<timestamp>.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import redis
from bench_lua import CODEC, Frontier, Spiderling, url67, write_result
from scrapy import Request

from scrapy_dist.keys import RedisKeys
from scrapy_dist.scripts import ScriptCall, scripts_for
from scrapy_dist.slot_queue import SlotQueue
from scrapy_dist.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from types import FrameType

#: Entries per call and calls per pipeline when filling the queue.
FILL_BATCH, FILL_PIPELINE = 2000, 10
#: Slots per call when telling the politeness script of S slots.
SLOT_BATCH = 500
#: Depths (priority -depth) of the queued requests, in turn.
DEPTHS = (0, 1, 2, 3)
PER_CALL = 16
PHASES = ("enqueue", "reserve", "settle")
KEYS = RedisKeys(crawl="b", requests="b:q", dupefilter="b:df", start_urls="b:start")
TIMEOUT_MS, RECOVER_MS, IDLE_MS = 600_000, 3_000, 3_600_000
LOOKAHEAD_MS = 100
#: How long a mark of a slot refused lasts (ms), as a worker sends it.
MARK_MS = 1_000
#: Slots with a token kept in flight: one in this many, at most MAX_IN_FLIGHT.
IN_FLIGHT_EVERY, MAX_IN_FLIGHT = 10, 1000


def templates() -> list[bytes]:
    """The encoded request of each depth for URL 0 (URLs all have the same length, so
    the entry of URL ``i`` is this with the URL replaced; checked in :func:`payload`)."""
    spider = Spiderling()
    return [
        CODEC.encode(
            Request(url67(0), callback=spider.parse, priority=-d, meta={"depth": d} if d else {})
        )
        for d in DEPTHS
    ]


TEMPLATES = templates()
URL0 = url67(0).encode()


def payload(i: int) -> tuple[float, bytes]:
    """(score, encoded request) of request ``i``."""
    d = DEPTHS[i % len(DEPTHS)]
    return float(d), TEMPLATES[d].replace(URL0, url67(i).encode())


def check_payloads() -> None:
    spider = Spiderling()
    for i in (1, 7, 123_456):
        d = DEPTHS[i % len(DEPTHS)]
        meta = {"depth": d} if d else {}
        real = CODEC.encode(Request(url67(i), callback=spider.parse, priority=-d, meta=meta))
        assert payload(i) == (float(d), real), (i, payload(i), real)


def start_server() -> RedisServer:
    """A server whose ``used_memory`` counts the keys: Redis 7 allocates a ~24 KB latency
    histogram at the first call of each command (turned off; absent from Redis 6.2)."""
    server = RedisServer(extra_args=["--maxmemory", "8gb"]).start()
    client = server.client()
    try:
        client.config_set("latency-tracking", "no")
    except redis.ResponseError:
        pass
    finally:
        client.close()
    return server


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def commandstats(client: redis.Redis) -> dict[str, tuple[int, float]]:
    """command -> (calls, usec) since the last ``CONFIG RESETSTAT``."""
    stats = cast("dict[str, dict[str, Any]]", client.info("commandstats"))
    return {
        name.removeprefix("cmdstat_"): (int(s["calls"]), float(s["usec"]))
        for name, s in stats.items()
    }


class Tally:
    """Script calls, their server time, client time and inner commands, over rounds."""

    def __init__(self) -> None:
        self.calls = 0
        self.usec = 0.0
        self.wall = 0.0
        self.inner: dict[str, list[float]] = {}
        #: Server µs per call of each round.
        self.rounds: list[float] = []

    def add(self, stats: dict[str, tuple[int, float]], wall: float) -> None:
        calls, usec = stats.get("evalsha", (0, 0.0))
        if calls:
            self.rounds.append(usec / calls)
        self.calls += calls
        self.usec += usec
        self.wall += wall
        for name, (n, us) in stats.items():
            if name not in ("evalsha", "info", "config|resetstat", "config", "script|load"):
                row = self.inner.setdefault(name, [0.0, 0.0])
                row[0] += n
                row[1] += us

    def figures(self) -> dict[str, Any]:
        calls = max(self.calls, 1)
        inner = {
            name: {"per_call": n / calls, "us_per_call": us / calls}
            for name, (n, us) in sorted(self.inner.items(), key=lambda kv: -kv[1][1])
        }
        return {
            "calls": self.calls,
            "us_per_call": self.usec / calls,
            "us_per_call_median": statistics.median(self.rounds) if self.rounds else 0.0,
            "us_per_call_rounds": self.rounds,
            "client_ms_per_call": self.wall * 1e3 / calls,
            "inner": inner,
        }


def timed(client: redis.Redis, tally: Tally, calls: Iterator[ScriptCall]) -> list[Any]:
    """Run ``calls`` one by one (built beforehand), stats reset before; add to ``tally``."""
    prepared = list(calls)
    client.config_resetstat()
    replies = []
    t0 = time.perf_counter()
    for call in prepared:
        replies.append(call.run())
    wall = time.perf_counter() - t0
    tally.add(commandstats(client), wall)
    return replies


class Queue(Frontier):
    """bench_lua's frontier (keys ``b:*``), entries as :func:`payload` makes them; with
    ``slots``, a queue per download slot (:class:`SlotQueue`) whose entries go to that
    many slots in turn (no delay: every slot ready)."""

    def __init__(self, client: redis.Redis, slots: int = 0) -> None:
        super().__init__(client, SlotQueue(client, "b:q", "b:seq") if slots else None)
        self.slots = slots
        self.next_request = 0

    def enqueue_next(self, n: int) -> ScriptCall:
        first, self.next_request = self.next_request, self.next_request + n
        entries: list[tuple[bytes, float | str, bytes]] = []
        for i in range(first, first + n):
            score, data = payload(i)
            entries.append(
                (b"", f"{score!r}@{slot_name(i % self.slots)}" if self.slots else score, data)
            )
        return self.scripts.enqueue(
            queue="b:q",
            seq="b:seq",
            epoch_key="b:epoch",
            queue_kind=self.queue.kind,
            entries=[(token, score, data) for token, score, data in entries],
            epoch="E",
        )

    def fill(self, n: int) -> None:
        left = n
        while left:
            with self.client.pipeline(transaction=False) as pipe:
                for _ in range(FILL_PIPELINE):
                    if not left:
                        break
                    batch = min(FILL_BATCH, left)
                    self.enqueue_next(batch).run(pipe)
                    left -= batch
                pipe.execute()


class SizeRun:
    """A queue of N entries on its own server (``slots``: a queue per slot over that
    many slots): :meth:`round` runs the three phases."""

    def __init__(self, n: int, slots: int = 0) -> None:
        self.n = n
        self.server = start_server()
        self.client = self.server.client(socket_timeout=120)
        self.queue = Queue(self.client, slots)
        self.tallies = {phase: Tally() for phase in PHASES}

    def fill(self) -> None:
        client, queue = self.client, self.queue
        client.set("b:epoch", "E")
        queue.enqueue_next(1).run()  # the script loaded, the levels created
        before = used_memory(client)
        t0 = time.perf_counter()
        queue.fill(self.n - 1)
        self.fill_s = time.perf_counter() - t0
        self.used_memory = used_memory(client)
        self.bytes_per_entry = (self.used_memory - before) / (self.n - 1)
        self.queued = len(queue.queue)
        queue.settle([i.decode() for i in queue.reserve(1).run()[0::3]]).run()  # loaded

    def round(self, k: int) -> None:
        client, queue, tallies = self.client, self.queue, self.tallies
        timed(client, tallies["enqueue"], (queue.enqueue_next(PER_CALL) for _ in range(k)))
        replies = timed(client, tallies["reserve"], (queue.reserve(PER_CALL) for _ in range(k)))
        leases = [[i.decode() for i in reply[0::3]] for reply in replies]
        timed(client, tallies["settle"], (queue.settle(ids) for ids in leases))

    def result(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "queued_after": len(self.queue.queue),
            "fill_s": self.fill_s,
            "bytes_per_entry": self.bytes_per_entry,
            "used_memory": self.used_memory,
            **{name: tally.figures() for name, tally in self.tallies.items()},
        }

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


def on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM as KeyboardInterrupt: every ``finally`` stops the servers it started."""
    raise KeyboardInterrupt


def slot_name(i: int) -> str:
    return f"www.host-{i:07d}.example.com"


def politeness(
    client: redis.Redis,
    prefix: str,
    *,
    confirms: Sequence[str] = (),
    releases: Sequence[str] = (),
    slots: Sequence[str] = (),
) -> ScriptCall:
    return scripts_for(client).politeness(
        tokens=KEYS.politeness_tokens,
        busy=KEYS.politeness_busy,
        next_send=KEYS.politeness_next,
        pauses=KEYS.slot_pauses,
        refused=KEYS.politeness_refused,
        prefix=prefix,
        lookahead_ms=LOOKAHEAD_MS,
        mark_ms=MARK_MS,
        confirms=[(member, 0.0, 1.0) for member in confirms],
        releases=releases,
        asks=[(slot, 1, 2, 1.0) for slot in slots],
        timeout_ms=TIMEOUT_MS,
        recover_ms=RECOVER_MS,
        idle_ms=IDLE_MS,
    )


def granted(prefix: str, slots: Sequence[str], reply: Any) -> list[str]:
    """The members of the turns a call with ``prefix`` asking for ``slots`` was granted."""
    grants, members, n = reply[0], [], 0
    for k, slot in enumerate(slots):
        if int(grants[3 * k]):
            members.append(f"{prefix}{n}|{slot}")
            n += 1
    return members


class SlotRun:
    """The politeness keys of S slots on their own server: :meth:`round` runs ``k``
    calls (confirm and release the previous call's turns, ask for the next 16 slots)."""

    def __init__(self, s: int) -> None:
        self.s = s
        self.server = start_server()
        self.client = self.server.client(socket_timeout=120)
        self.tally = Tally()
        self.held: list[str] = []
        self.calls = self.grants = 0

    def fill(self) -> None:
        client, s = self.client, self.s
        politeness(client, "x").run()  # the script loaded, nothing asked
        before = used_memory(client)
        self.in_flight = min(s // IN_FLIGHT_EVERY, MAX_IN_FLIGHT)
        t0 = time.perf_counter()
        for start in range(0, s, SLOT_BATCH):
            slots = [slot_name(i) for i in range(start, min(start + SLOT_BATCH, s))]
            prefix = f"f{start}-"
            members = granted(prefix, slots, politeness(client, prefix, slots=slots).run())
            assert len(members) == len(slots), (start, len(members))
            kept = {
                m
                for m, i in zip(members, range(start, start + len(slots)), strict=True)
                if i % IN_FLIGHT_EVERY == 0 and i // IN_FLIGHT_EVERY < self.in_flight
            }
            releases = [m for m in members if m not in kept]
            politeness(client, f"g{start}-", confirms=members, releases=releases).run()
        self.fill_s = time.perf_counter() - t0
        self.used_memory = used_memory(client)
        self.bytes_per_slot = (self.used_memory - before) / s
        keys = (KEYS.politeness_tokens, KEYS.politeness_busy, KEYS.politeness_next)
        self.zcard = {key: int(client.zcard(key)) for key in keys}
        self.memory_usage = {key: int(client.memory_usage(key, samples=0) or 0) for key in keys}
        self.encoding = {
            key: cast("bytes", client.object("encoding", key)).decode() for key in keys
        }

    def round(self, k: int) -> None:
        client = self.client
        client.config_resetstat()
        t0 = time.perf_counter()
        for c in range(self.calls, self.calls + k):
            asks = min(PER_CALL, self.s)
            slots = [slot_name((asks * c + j) % self.s) for j in range(asks)]
            prefix = f"m{c}-"
            call = politeness(client, prefix, confirms=self.held, releases=self.held, slots=slots)
            self.held = granted(prefix, slots, call.run())
            self.grants += len(self.held)
        self.tally.add(commandstats(client), time.perf_counter() - t0)
        self.calls += k

    def result(self) -> dict[str, Any]:
        return {
            "populate_s": self.fill_s,
            "in_flight": self.in_flight,
            "bytes_per_slot": self.bytes_per_slot,
            "used_memory": self.used_memory,
            "zcard": self.zcard,
            "memory_usage": self.memory_usage,
            "encoding": self.encoding,
            "asks_per_call": min(PER_CALL, self.s),
            "grants_per_call": self.grants / max(self.calls, 1),
            "politeness": self.tally.figures(),
            "us_per_grant": self.tally.usec / max(self.grants, 1),
        }

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


def interleaved(runs: Sequence[SizeRun | SlotRun], calls: int, per_round: int) -> None:
    """Fill each run, then rounds of ``per_round`` calls, each run in turn (a change of
    the machine's load during the benchmark then weighs on every size alike)."""
    for run in runs:
        run.fill()
    done = 0
    while done < calls:
        k = min(per_round, calls - done)
        for run in runs:
            run.round(k)
        done += k


def ratio(rows: dict[str, dict[str, Any]], *path: str) -> float:
    values = []
    for row in rows.values():
        value: Any = row
        for p in path:
            value = value[p]
        values.append(float(value))
    return values[-1] / values[0] if values and values[0] else float("nan")


def per_command(row: dict[str, float]) -> float:
    return row["us_per_call"] / row["per_call"] if row["per_call"] else 0.0


def top_inner(figures: dict[str, Any], n: int = 4) -> str:
    return ", ".join(
        f"{name} {row['us_per_call']:.1f} ({row['per_call']:.1f}x {per_command(row):.2f})"
        for name, row in list(figures["inner"].items())[:n]
    )


def mean_median(figures: dict[str, Any]) -> str:
    return f"{figures['us_per_call']:6.1f}/{figures['us_per_call_median']:<6.1f}"


def print_sizes(rows: dict[str, dict[str, Any]], what: str = "queued") -> None:
    print(
        "\nQueue size: per call of 16; server µs (commandstats EVALSHA, mean/median of the "
        "rounds), client ms (wall, mean)"
    )
    heads = " ".join(f"{p + ' µs':>13}" for p in PHASES)
    print(f"  {what:>9} {'B/entry':>8} {'fill s':>6}  {heads}   enq ms  res ms  set ms")
    for n, row in rows.items():
        print(
            f"  {n:>9} {row['bytes_per_entry']:8.1f} {row['fill_s']:6.1f}  "
            + " ".join(mean_median(row[p]) for p in PHASES)
            + "  "
            + " ".join(f"{row[p]['client_ms_per_call']:7.3f}" for p in PHASES)
        )
    ratios = " ".join(
        f"{ratio(rows, p, 'us_per_call'):6.2f}/{ratio(rows, p, 'us_per_call_median'):<6.2f}"
        for p in PHASES
    )
    clients = " ".join(f"{ratio(rows, p, 'client_ms_per_call'):7.2f}" for p in PHASES)
    print(f"  {'ratio':>9} {ratio(rows, 'bytes_per_entry'):8.2f} {'':>6}  {ratios}  {clients}")
    print("  (ratio: largest size / smallest)")
    print("  inner commands: µs per script call (commands per call x µs per command):")
    for n, row in rows.items():
        for p in PHASES:
            print(f"    {n:>9} {p:8} {top_inner(row[p])}")


def print_slots(rows: dict[str, dict[str, Any]]) -> None:
    print("\nSlots: politeness call (confirm + release the previous call's turns, ask 16)")
    print(
        f"  {'slots':>7} {'in flight':>9} {'B/slot':>7} {'keys B/slot':>11} "
        f"{'server µs':>13} {'µs/grant':>8} {'ms/call':>8} {'grants':>6}"
    )
    for s, row in rows.items():
        p = row["politeness"]
        keys = sum(row["memory_usage"].values()) / int(s)
        print(
            f"  {s:>7} {row['in_flight']:>9} {row['bytes_per_slot']:7.1f} {keys:11.1f} "
            f"{mean_median(p)} {row['us_per_grant']:8.1f} {p['client_ms_per_call']:8.3f} "
            f"{row['grants_per_call']:6.1f}"
        )
    print(
        f"  {'ratio':>7} {'':>9} {ratio(rows, 'bytes_per_slot'):7.2f} {'':>11} "
        f"{ratio(rows, 'politeness', 'us_per_call'):6.2f}/"
        f"{ratio(rows, 'politeness', 'us_per_call_median'):<6.2f} "
        f"{ratio(rows, 'us_per_grant'):8.2f} "
        f"{ratio(rows, 'politeness', 'client_ms_per_call'):8.2f}"
    )
    print("  (B/slot: used_memory delta / S; keys B/slot: MEMORY USAGE of the three keys / S)")
    print("  encodings (tokens, busy, next):")
    for s, row in rows.items():
        print(f"    {s:>7} {', '.join(row['encoding'].values())}")
    print("  inner commands: µs per script call (commands per call x µs per command):")
    for s, row in rows.items():
        print(f"    {s:>7} {top_inner(row['politeness'], 6)}")


def integers(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=integers,
        default=[10_000, 100_000, 1_000_000],
        help="queued requests, comma-separated ('' for none)",
    )
    parser.add_argument(
        "--slots",
        type=integers,
        default=[10, 1_000, 100_000],
        help="download slots, comma-separated ('' for none)",
    )
    parser.add_argument(
        "--queue-slots",
        type=integers,
        default=[10, 1_000, 100_000],
        help="download slots of the queue per slot (SlotQueue), comma-separated ('' for none)",
    )
    parser.add_argument(
        "--queue-slots-size",
        type=int,
        default=200_000,
        help="requests queued in the queue per slot (200000)",
    )
    parser.add_argument("--calls", type=int, default=10_000, help="calls per phase")
    parser.add_argument("--round", type=int, default=50, help="calls per phase and round")
    parser.add_argument("--out", type=Path, help="JSON file (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    check_payloads()
    result: dict[str, Any] = {"calls": args.calls, "round": args.round, "per_call": PER_CALL}
    sizes: dict[str, dict[str, Any]] = {}
    slots: dict[str, dict[str, Any]] = {}
    queue_slots: dict[str, dict[str, Any]] = {}
    for kind, counts, rows in (
        ("sizes", args.sizes, sizes),
        ("queue slots", args.queue_slots, queue_slots),
        ("slots", args.slots, slots),
    ):
        runs: list[Any] = []
        try:
            for n in counts:  # one by one: a start that fails leaves the others to stop
                if kind == "sizes":
                    runs.append(SizeRun(n))
                elif kind == "queue slots":
                    runs.append(SizeRun(args.queue_slots_size, slots=n))
                else:
                    runs.append(SlotRun(n))
            interleaved(runs, args.calls, args.round)
            for n, run in zip(counts, runs, strict=True):
                rows[str(n)] = run.result()
        finally:
            for run in runs:
                run.stop()
        print(f"{kind}: done", flush=True)
    result["sizes"], result["slots"] = sizes, slots
    result["queue_slots"] = queue_slots
    if sizes:
        print_sizes(sizes)
    if queue_slots:
        print(f"\nQueue per slot (SlotQueue), {args.queue_slots_size:,} requests queued:", end="")
        print_sizes(queue_slots, "slots")
    if slots:
        print_slots(slots)
    print(f"\nwrote {write_result(result, args.out, 'scale')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
