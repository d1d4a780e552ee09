"""The Lua scripts in ``scrapy_dist/lua/``: their text, the constants written into them,
and one typed call per script.

Each ``.lua`` file opens with a header naming its ``KEYS`` and ``ARGV``; the method of
:class:`Scripts` named after the script is the one place in Python that builds them, in
that order, from named parameters. Every key a script touches is passed in ``KEYS``,
except those a script can only find out inside itself, built by the Lua twins of
:mod:`scrapy_dist.keys`'s functions with the hash tag of a key passed in: a priority
queue's levels (``lua/_levels.lua``) and a dupefilter's buckets and generations
(``lua/_filters.lua``).

Redis scripts cannot import each other, so code two scripts share lives in a library
file (``_name.lua``, functions only) that :func:`source` prepends to every script whose
header has a line ``-- uses: _name`` (the definitions the script reaches, only: Lua
builds each anew on every call). Values both sides must agree on (the entry id
length, the settlement outcomes, the origins of a leased entry) are defined once, in
:mod:`scrapy_dist.frontier.wire`, and :func:`source` writes their values into every
script where it names them (:data:`~scrapy_dist.frontier.wire.LUA_CONSTANTS`).
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any, NamedTuple
from weakref import WeakKeyDictionary

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.wire import LUA_CONSTANTS

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import redis
    from redis.client import Pipeline
    from redis.commands.core import Script

#: A script argument.
Arg = bytes | str | int | float

#: The header line naming the libraries a script uses.
_USES = re.compile(r"^-- uses: (.+)$", re.MULTILINE)

#: Where a copy of scrapy_dist keeps its scripts (package data, also read from a zip or egg).
LUA_PACKAGE = "scrapy_dist.lua"

#: Every script of the package (``lua/<name>.lua``), registered by :class:`Scripts`.
NAMES = (
    "enqueue",
    "join",
    "leave",
    "heartbeat",
    "reserve",
    "settle",
    "renew",
    "progress",
    "census",
    "queued",
    "leased",
    "pop",
    "migrate",
    "release",
    "dupefilter",
    "stats",
    "item_stream",
    "politeness",
)


def _lua_literal(value: int | str) -> str:
    if isinstance(value, int):
        return str(value)
    if not all(c.isprintable() and c not in '"\\' for c in value):
        raise ValueError(f"Lua constant {value!r} needs escaping")
    return f'"{value}"'


def constants() -> str:
    """The Lua text that defines :data:`LUA_CONSTANTS` as locals of the same names (for a
    script assembled by hand; :func:`source` writes the values in instead)."""
    lines = ["-- Constants shared with Python (scrapy_dist/frontier/wire.py, LUA_CONSTANTS)."]
    lines += [f"local {name} = {_lua_literal(v)}" for name, v in LUA_CONSTANTS.items()]
    return "\n".join(lines)


def _read(name: str) -> str:
    """The text of ``lua/<name>.lua`` as shipped with the package."""
    resource = files(LUA_PACKAGE) / f"{name}.lua"
    try:
        return resource.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigurationError(
            f"scrapy_dist's Lua script {name}.lua is missing from {files(LUA_PACKAGE)}: a copy "
            f"of scrapy_dist bundled in an egg or zip must include its package data "
            f"(setup.py: package_data={{'{LUA_PACKAGE}': ['*.lua']}}), or install "
            f"scrapy-dist with pip where the crawl runs"
        ) from e


def _libraries(text: str, into: list[str]) -> list[str]:
    """The libraries ``text`` uses, after the ones they use, each once, into ``into``."""
    uses = _USES.search(text)
    for lib in (lib.strip() for lib in uses.group(1).split(",")) if uses else ():
        if lib not in into:
            _libraries(_read(lib), into)
            if lib not in into:
                into.append(lib)
    return into


@cache
def source(name: str) -> str:
    """Return the text of ``lua/<name>.lua`` shipped with the package, preceded by what
    it uses of the libraries its ``-- uses:`` line names (each once, a library's own
    libraries first; :func:`used_definitions`), with the shared constants written as
    their values (:func:`inline_constants`).

    The files are read with :mod:`importlib.resources`, so a copy of scrapy_dist inside
    a zipped egg (a scrapyd deployment that bundles it) works like an installed one.

    Raises:
        ConfigurationError: The script is not part of this copy of the package (an egg
            or zip built without scrapy_dist's package data).
    """
    libraries, body = parts(name)
    return inline_constants("\n".join([_INLINED, *used_definitions(libraries, body), body]))


#: The first line of every script :func:`source` assembles.
_INLINED = "-- The constants shared with Python are written as values (scrapy_dist/scripts.py)."
#: A name of :data:`LUA_CONSTANTS` used as a variable: not a field (``t.NAME``, ``t:NAME``;
#: ``a..NAME`` is a use) and not followed by ``=`` (an assignment, or a table key).
_CONSTANT_USE = re.compile(
    r"(?<![\w:])(?<!(?<!\.)\.)\b(" + "|".join(LUA_CONSTANTS) + r")\b(?!\s*=(?!=))"
)


def inline_constants(text: str) -> str:
    """``text`` with each use of a constant of :data:`LUA_CONSTANTS` outside comments and
    strings replaced by its Lua literal.

    A constant defined as a local (:func:`constants`) is an upvalue of every function
    that reads it, and Lua makes each upvalue anew on every call of a script: written as
    a literal, it costs nothing at run time.
    """
    out, end = [], 0
    for match in _NOT_CODE.finditer(text):
        out.append(_CONSTANT_USE.sub(_literal_of, text[end : match.start()]))
        out.append(match.group(0))
        end = match.end()
    out.append(_CONSTANT_USE.sub(_literal_of, text[end:]))
    return "".join(out)


def _literal_of(match: re.Match[str]) -> str:
    return _lua_literal(LUA_CONSTANTS[match.group(1)])


#: A top-level definition of a library: ``local function NAME(`` or ``local A, B =``.
_DEFINITION = re.compile(r"^local (?:function ([A-Za-z_]\w*)|([A-Za-z_][\w, ]*?)\s*(?:=|$))")
#: A Lua identifier.
_NAME = re.compile(r"[A-Za-z_]\w*")
#: What is not code: a comment (``--[[ ]]`` or to the end of the line), a long string
#: (``[[ ]]``, ``[==[ ]==]``) or a quoted one (escapes included).
_NOT_CODE = re.compile(
    r"""--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""",
    re.DOTALL,
)


def _names_in(code: str) -> set[str]:
    """The identifiers ``code`` mentions outside comments and strings (field names
    included: a superset of the locals it reads)."""
    return set(_NAME.findall(_NOT_CODE.sub(" ", code)))


def _definitions(library: str) -> list[tuple[set[str], str]]:
    """``library``'s text cut into top-level units, in order: each a definition (the
    comment lines above it, its lines up to the next unit) with the names it defines.
    Text that defines nothing (a file's opening comment) is a unit defining no name."""
    units: list[tuple[set[str], list[str]]] = [(set(), [])]
    comment: list[str] = []
    for line in library.split("\n"):
        match = _DEFINITION.match(line)
        if match:
            names = {match.group(1)} if match.group(1) else set(_NAME.findall(match.group(2)))
            units.append((names, [*comment, line]))
            comment = []
        elif line.startswith("--") or not line:
            comment.append(line)
        else:
            units[-1][1].extend([*comment, line])
            comment = []
    units[-1][1].extend(comment)
    return [(names, "\n".join(lines)) for names, lines in units]


def used_definitions(libraries: Sequence[str], body: str) -> list[str]:
    """The parts of ``libraries`` that ``body`` needs: each top-level definition it
    names, and those these name, transitively, in the libraries' order.

    A script's libraries are run again on every call (Redis keeps no state between
    ``EVALSHA`` calls): each ``local function`` builds a closure, which the call pays
    for and Lua's garbage collector then collects. A script keeps only what it can
    reach. A name is matched as a word outside comments and strings, so a field or a
    local of the same name keeps a definition it does not need, never the reverse.
    """
    units = [unit for library in libraries for unit in _definitions(library)]
    wanted = _names_in(body)
    keep = [False] * len(units)
    changed = True
    while changed:
        changed = False
        for k, (names, text) in enumerate(units):
            if not keep[k] and (not names or names & wanted):
                keep[k] = changed = True
                wanted |= _names_in(text)
    return [text for k, (_, text) in enumerate(units) if keep[k]]


def parts(name: str) -> tuple[list[str], str]:
    """The texts of the libraries ``lua/<name>.lua`` uses (in the order :func:`source`
    puts them) and its own text (what :func:`source` joins after :func:`constants`)."""
    text = _read(name)
    return [_read(lib) for lib in _libraries(text, [])], text


class Fence(NamedTuple):
    """What a worker's enqueue depends on (``lua/enqueue.lua``): the crawl's epoch it
    joined and, per request, the lease of the request whose callback produced it."""

    epoch_key: str
    #: ``""``: unfenced (a command-line tool).
    epoch: str
    #: The worker's holding hash (``""``: no request names a parent).
    holding: str = ""
    #: The parent lease id of each request (``""``: none).
    parents: Sequence[str] = ()

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`Scripts.enqueue` this fence sets."""
        return self._asdict()


class OtherShards(NamedTuple):
    """What shards of a sharded crawl hold and counted (``lua/census.lua``): one
    shard's (``Frontier.census``), or shards ``1..N-1`` together, for shard 0's
    ``lua/progress.lua``."""

    #: Entries queued or leased.
    busy: int
    #: Their counters: settled (``done`` + ``dead``), and ``retried``.
    done: int
    dead: int
    retried: int


class ScriptCall(NamedTuple):
    """One call of a script: its ``KEYS`` and ``ARGV`` in the order its header gives."""

    script: Script
    keys: list[str]
    args: list[Arg]

    def run(self, client: redis.Redis | Pipeline | None = None) -> Any:
        """Run it with ``EVALSHA`` on the client the script was registered on, or queue
        it on ``client`` (a pipeline); a script missing from the server is loaded."""
        return self.script(keys=self.keys, args=self.args, client=client)


_registered: WeakKeyDictionary[redis.Redis, Scripts] = WeakKeyDictionary()


class Scripts:
    """The package's scripts bound to one client, one typed call per script.

    Each method returns the :class:`ScriptCall` of its script (run it, or send it in a
    pipeline); its parameters are the script's ``KEYS`` and ``ARGV``, named as in the
    script's header.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._scripts = {name: client.register_script(source(name)) for name in NAMES}

    def all(self) -> list[Script]:
        """Every script, e.g. to load them all after the server lost its script cache."""
        return list(self._scripts.values())

    def _call(self, name: str, keys: Iterable[str], args: Iterable[Arg]) -> ScriptCall:
        return ScriptCall(self._scripts[name], list(keys), list(args))

    # -- the frontier (lua/enqueue, reserve, settle, renew, release, progress) -----------

    def enqueue(
        self,
        *,
        queue: str,
        seq: str,
        epoch_key: str,
        queue_kind: str,
        filter_kind: str = "none",
        filter_keys: Sequence[str] = (),
        filter_args: Sequence[Arg] = (),
        entries: Iterable[tuple[bytes, float, bytes]],
        epoch: str = "",
        holding: str = "",
        parents: Sequence[str] = (),
    ) -> ScriptCall:
        """``lua/enqueue.lua``: dedupe and push ``(token, score, payload)`` entries.

        Args:
            queue: the request queue; ``queue_kind`` its kind (``"list"``, ``"levels"``).
            seq: the sequence counter giving entries their ids.
            epoch_key: the crawl's epoch key (not read when ``epoch`` is ``""``).
            filter_kind: the dupefilter backend's kind, ``"none"`` for no dedupe.
            filter_keys: the backend's keys; ``filter_args`` its arguments.
            entries: the token (``b""``: not filtered), score and payload of each request.
            epoch: the crawl epoch the caller joined (``""``: unfenced).
            holding: the calling worker's holding hash (read only for entries with a
                parent; ``""``: the sequence key stands in, never read).
            parents: the lease id of each entry's parent, aligned with ``entries``
                (``""`` or missing: none, e.g. a seed's or a start request's); an entry
                whose parent lease is not in ``holding`` is refused.
        """
        args: list[Arg] = [queue_kind, filter_kind, len(filter_args), *filter_args]
        for i, (token, score, payload) in enumerate(entries):
            args += (token, score, payload, parents[i] if i < len(parents) else "")
        args.append(epoch)
        return self._call("enqueue", [queue, seq, epoch_key, holding or seq, *filter_keys], args)

    def reserve(
        self,
        *,
        holders: str,
        holding: str,
        deliveries: str,
        dead: str,
        queue: str,
        seeds: str,
        seq: str,
        progress: str,
        epoch_key: str,
        previous: tuple[str, str],
        origin: str,
        take: str,
        queue_put_back: str,
        seeds_put_back: str,
        count: int,
        duration: float,
        worker: str,
        max_deliveries: int,
        reclaim_limit: int,
        epoch: str,
    ) -> ScriptCall:
        """``lua/reserve.lua``: reclaim expired leases (``previous``: the previous
        version's leases zset and leased hash too), then lease up to ``count`` entries
        taken from the queue (``origin`` :data:`FROM_QUEUE`) or the seeds key
        (:data:`FROM_SEEDS`) with the command ``take`` into ``holding``."""
        keys = [holders, holding, deliveries, dead, queue, seeds, seq, progress, epoch_key]
        keys += previous
        args: list[Arg] = [
            origin,
            take,
            queue_put_back,
            seeds_put_back,
            count,
            duration,
            worker,
            max_deliveries,
            reclaim_limit,
            epoch,
        ]
        return self._call("reserve", keys, args)

    def settle(
        self,
        *,
        holding: str,
        deliveries: str,
        dead: str,
        queue: str,
        seeds: str,
        progress: str,
        epoch_key: str,
        worker: str,
        queue_put_back: str,
        seeds_put_back: str,
        max_deliveries: int,
        epoch: str,
        outcomes: Iterable[tuple[str, str]],
    ) -> ScriptCall:
        """``lua/settle.lua``: settle ``(lease id, outcome)`` pairs (outcomes
        :data:`DONE`, :data:`HAND_BACK`, :data:`DEAD_NOW` + a record,
        :data:`DEAD_BECAUSE` + a reason, or a reason)."""
        keys = [holding, deliveries, dead, queue, seeds, progress, epoch_key]
        args: list[Arg] = [worker, queue_put_back, seeds_put_back, max_deliveries, epoch]
        for lease_id, outcome in outcomes:
            args += (lease_id, outcome)
        return self._call("settle", keys, args)

    def renew(
        self,
        *,
        holders: str,
        holding: str,
        epoch_key: str,
        worker: str,
        duration: float,
        epoch: str,
        lease_ids: Iterable[str],
    ) -> ScriptCall:
        """``lua/renew.lua``: extend the deadline of the worker's leases by
        ``duration``; the reply names those of ``lease_ids`` it no longer holds."""
        keys = [holders, holding, epoch_key]
        return self._call("renew", keys, [worker, duration, epoch, *lease_ids])

    def release(
        self,
        *,
        holding: str,
        deliveries: str,
        queue: str,
        seeds: str,
        epoch_key: str,
        dead: str,
        progress: str,
        queue_put_back: str,
        seeds_put_back: str,
        epoch: str,
        worker: str,
        known: Iterable[str],
    ) -> ScriptCall:
        """``lua/release.lua``: hand back the leases of ``holding`` other than ``known``
        (a record it cannot read, and a level set aside, go to ``dead``, counted in
        ``progress``)."""
        keys = [holding, deliveries, queue, seeds, epoch_key, dead, progress]
        args: list[Arg] = [queue_put_back, seeds_put_back, epoch, worker, *known]
        return self._call("release", keys, args)

    def progress(
        self,
        *,
        queue: str,
        seeds: str,
        holders: str,
        previous: str,
        progress: str,
        epoch_key: str,
        clear_keys: Iterable[str],
        queue_kind: str,
        seeds_kind: str,
        grace: float,
        clear: bool,
        keep_for: int,
        epoch: str,
        others: OtherShards | None = None,
    ) -> ScriptCall:
        """``lua/progress.lua``: where the crawl stands; mark it finished after
        ``grace`` seconds of emptiness, then (``clear``) delete ``clear_keys``.
        ``previous``: the previous version's leases zset (counted as leased);
        ``others``: what a sharded crawl's other shards hold and counted."""
        keys = [queue, seeds, holders, progress, epoch_key, previous, *clear_keys]
        args: list[Arg] = [queue_kind, seeds_kind, grace, int(clear), keep_for, epoch]
        if others is not None:
            args += [others.busy, others.done + others.dead, others.done, others.dead]
            args.append(others.retried)
        return self._call("progress", keys, args)

    def census(
        self,
        *,
        queue: str,
        holders: str,
        previous: str,
        progress: str,
        epoch_key: str,
        queue_kind: str,
        epoch: str,
    ) -> ScriptCall:
        """``lua/census.lua``: ``(queued, leased, done, dead, retried)`` of one shard, fenced
        (``previous``: the previous version's leases zset, counted as leased)."""
        keys = [queue, holders, progress, epoch_key, previous]
        return self._call("census", keys, [queue_kind, epoch])

    def leased(self, *, holders: str, previous: str) -> ScriptCall:
        """``lua/leased.lua``: the number of leases held (``previous``: the previous
        version's leases zset, counted too)."""
        return self._call("leased", [holders, previous], [])

    def queued(self, *, queue: str, queue_kind: str) -> ScriptCall:
        """``lua/queued.lua``: the number of entries of ``queue`` (every level's)."""
        return self._call("queued", [queue], [queue_kind])

    def pop(self, *, queue: str, count: int) -> ScriptCall:
        """``lua/pop.lua``: pop up to ``count`` entries of priority queue ``queue``."""
        return self._call("pop", [queue], [count])

    def migrate(self, *, queue: str, count: int) -> ScriptCall:
        """``lua/migrate.lua``: move up to ``count`` entries of a previous version's
        zset at ``queue`` into levels; returns ``[moved, left]``."""
        return self._call("migrate", [queue], [count])

    # -- the worker registry (lua/join, heartbeat, leave) --------------------------------

    def join(
        self,
        *,
        workers: str,
        progress: str,
        starts: str,
        flush_keys: Iterable[str],
        worker: str,
        timeout: float,
        flush: bool,
        age: float,
    ) -> ScriptCall:
        """``lua/join.lua``: register ``worker``; with ``flush``, delete ``flush_keys``
        if no other worker is alive; delete ``starts`` when this worker starts a new run
        or no other worker is alive."""
        keys = [workers, progress, starts, *flush_keys]
        return self._call("join", keys, [worker, timeout, int(flush), age])

    def heartbeat(self, *, workers: str, worker: str) -> ScriptCall:
        """``lua/heartbeat.lua``: stamp ``worker`` alive with the server's clock."""
        return self._call("heartbeat", [workers], [worker])

    def leave(self, *, workers: str, worker: str, timeout: float) -> ScriptCall:
        """``lua/leave.lua``: unregister ``worker``, pruning stale workers."""
        return self._call("leave", [workers], [worker, timeout])

    # -- the dupefilter and stats (lua/dupefilter, stats) --------------------------------

    def dupefilter(
        self,
        *,
        filter_keys: Sequence[str],
        op: str,
        filter_kind: str,
        filter_args: Sequence[Arg],
        tokens: Iterable[bytes],
    ) -> ScriptCall:
        """``lua/dupefilter.lua``: ``op`` ``"add"`` or ``"check"`` these tokens."""
        args: list[Arg] = [op, filter_kind, len(filter_args), *filter_args, *tokens]
        return self._call("dupefilter", filter_keys, args)

    def dupefilter_prepare(
        self, *, chain: str, segment: str, bits: int, expire_at: int | None = None
    ) -> ScriptCall:
        """``lua/dupefilter.lua`` ``"prepare"``: create a Bloom segment at full size
        (expiring at server time ``expire_at`` ms if given, a windowed generation's)."""
        args: list[Arg] = ["prepare", bits]
        if expire_at is not None:
            args.append(expire_at)
        return self._call("dupefilter", [chain, segment], args)

    def stats(
        self,
        *,
        stats: str,
        timeline: str,
        pages_stat: str,
        items_stat: str,
        window: int,
        ops: Iterable[Sequence[Arg]],
    ) -> ScriptCall:
        """``lua/stats.lua``: apply a batch of stats operations (4 arguments each)."""
        args: list[Arg] = [pages_stat, items_stat, window]
        for op in ops:
            args += op
        return self._call("stats", [stats, timeline], args)

    # -- the items stream (lua/item_stream) -----------------------------------------------

    def item_stream_dead(
        self,
        *,
        stream: str,
        dead: str,
        group: str,
        entry_id: str,
        reason: str,
        consumer: str,
        max_deliveries: int = 0,
    ) -> ScriptCall:
        """``lua/item_stream.lua`` ``"dead"`` (``max_deliveries`` 0) or ``"reject"``:
        move a pending entry to the dead stream and acknowledge it, in one step."""
        op = "reject" if max_deliveries else "dead"
        args: list[Arg] = [op, group, entry_id, reason, consumer, max_deliveries]
        return self._call("item_stream", [stream, dead], args)

    def item_stream_requeue(
        self, *, stream: str, dead: str, dead_id: str, maxlen: int = 0
    ) -> ScriptCall:
        """``lua/item_stream.lua`` ``"requeue"``: a dead entry back to the stream."""
        return self._call("item_stream", [stream, dead], ["requeue", dead_id, maxlen])

    # -- cluster-wide politeness (lua/politeness) ---------------------------------------

    def politeness(
        self,
        *,
        tokens: str,
        busy: str,
        next_send: str,
        prefix: str,
        timeout_ms: int,
        recover_ms: int,
        idle_ms: int,
        lookahead_ms: int,
        confirms: Iterable[tuple[str, float, float]] = (),
        releases: Sequence[str] = (),
        turns: Sequence[str] = (),
        waiting: Sequence[str] = (),
        holding: Sequence[str] = (),
        asks: Iterable[tuple[str, int, int, float]] = (),
    ) -> ScriptCall:
        """``lua/politeness.lua``: confirm, release and renew download tokens, then grant
        more. ``confirms`` holds ``(token, ms since it was sent, the slot's delay in ms)``
        per turn sent;
        ``turns``, ``waiting`` and ``holding`` the tokens held (turns in the engine not
        sent yet, granted and not used, sent); ``asks`` holds ``(slot, requests waiting,
        concurrency, delay in ms)`` per slot."""
        confirmed = list(confirms)
        args: list[Arg] = [prefix, timeout_ms, recover_ms, idle_ms, lookahead_ms]
        args.append(len(confirmed))
        for member, ago_ms, delay_ms in confirmed:
            args += (member, ago_ms, delay_ms)
        for members in (releases, turns, waiting, holding):
            args += [len(members), *members]
        for slot, want, concurrency, delay_ms in asks:
            args += (slot, want, concurrency, delay_ms)
        return self._call("politeness", [tokens, busy, next_send], args)


def scripts_for(client: redis.Redis) -> Scripts:
    """Return the scripts registered on ``client``, registering them on first use (no I/O)."""
    try:
        return _registered[client]
    except KeyError:
        scripts = _registered[client] = Scripts(client)
        return scripts
