"""The text of each Lua script as Redis runs it, assembled from ``scrapy_dist/lua/``.

:func:`source` returns a script's text: the file ``lua/<name>.lua`` shipped with the
package (read with :mod:`importlib.resources`, so from a zipped egg too), preceded by
the libraries its header names on a line ``-- uses: _name`` (files ``_name.lua``,
functions only; a library's own libraries first, each once), of which only the
definitions the script reaches are kept (:func:`used_definitions`: Redis runs the
whole text on every call, so nothing unused is built), and with the constants Python
and Lua share (:data:`~scrapy_dist.frontier.wire.LUA_CONSTANTS`) written in as values
where the code names them (:func:`inline_constants`). :data:`NAMES` lists every script.
No I/O but reading the package's files; no Redis: registering and calling the scripts
is :mod:`scrapy_dist.scripts`'s.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from itertools import pairwise
from typing import TYPE_CHECKING

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.wire import LUA_CONSTANTS

if TYPE_CHECKING:
    from collections.abc import Sequence

#: The header line naming the libraries a script uses.
_USES = re.compile(r"^-- uses: (.+)$", re.MULTILINE)

#: Where a copy of scrapy_dist keeps its scripts (package data, also read from a zip or egg).
LUA_PACKAGE = "scrapy_dist.lua"

#: Every script of the package (``lua/<name>.lua``), registered by
#: :class:`scrapy_dist.scripts.Scripts`.
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
    "to_slots",
    "slot_leases",
    "release",
    "dupefilter",
    "stats",
    "item_stream",
    "politeness",
    "slot_pauses",
    "slot_counts",
    "crawl_delays",
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
    their values (:func:`inline_constants`). What only the text after a line
    ``-- (the libraries' other definitions go here)`` uses is put at that line instead,
    and what only one block of the script reaches (:data:`_HERE`) inside that block.

    The files are read with :mod:`importlib.resources`, so a copy of scrapy_dist inside
    a zipped egg (a scrapyd deployment that bundles it) works like an installed one.

    Raises:
        ConfigurationError: The script is not part of this copy of the package (an egg
            or zip built without scrapy_dist's package data).
        ValueError: A line :data:`_HERE` is not inside a block, or is inside another
            such block, or the script declares a local of a name that a definition put
            in the block reads (it would read the script's local instead).
    """
    libraries, body = parts(name)
    # a script whose common path returns early (settle's "all done"), or skips a block
    # (reserve's reclaim of expired leases, the branch of another kind of queue): the
    # definitions only the rest or that block reaches are put there, so that a call
    # that does not run it does not build them (their closures, upvalues, and the
    # garbage collection of both)
    blocks = _blocks(body)
    units = [text for library in libraries for _, text in _definitions(library)]
    # (a library's opening comment, which defines nothing, stays before the body)
    named = [bool(names) for library in libraries for names, _ in _definitions(library)]
    bounds = [0, *(k for block in blocks for k in block), len(body)]
    outside = "".join(body[bounds[i] : bounds[i + 1]] for i in range(0, len(bounds), 2))
    reached = [_kept(libraries, body[start:end]) for start, end in blocks]
    # a definition that two blocks reach is made once, before the body, unless it is one
    # function alone (each block then makes its own: no state is shared)
    shared = {
        k
        for k in range(len(units))
        if sum(r[k] for r in reached) > 1 and not _function_alone(units[k])
    }
    top = _kept(libraries, "\n".join([outside, *(units[k] for k in sorted(shared))]))
    names = {n for library in libraries for names, _ in _definitions(library) for n in names}
    texts, done = [_INLINED, *(text for text, t in zip(units, top, strict=True) if t)], 0
    for (start, _), r in zip(blocks, reached, strict=True):
        # (without the comments above them: the first of a library's carries its
        # opening comment, which two blocks would repeat)
        here = [
            _LEADING_COMMENTS.sub("", text)
            for text, t, b, n in zip(units, top, r, named, strict=True)
            if b and n and not t
        ]
        shadowed = _names_in("\n".join(here)) & (names | LUA_GLOBALS) & _locals_in(body[:start])
        if shadowed:
            raise ValueError(
                f"lua/{name}.lua declares {sorted(shadowed)} before a block its libraries' "
                f"definitions are put in, which read these names: rename its locals"
            )
        # (the marking line gives way to them)
        texts += [body[done:start], *here]
        done = body.index("\n", start) + 1
    texts.append(body[done:])
    return inline_constants("\n".join(texts))


#: A line of a script's body after which the definitions of its libraries that only the
#: text after it reaches are put (:func:`source`): its text before returns early on its
#: common path, and that path does not build them.
_LATER = re.compile(r"^-- \(the libraries' other definitions go here\)\n", re.MULTILINE)
#: A line inside a block of a script's body (a branch of an ``if``, not inside a loop:
#: the block would build them on every turn), where the definitions of its libraries
#: that only this block reaches are put (:func:`source`): a call that does not run the
#: block does not build them. The block ends at the first line indented less than this
#: one (its ``end``, ``else`` or ``elseif``).
_HERE = re.compile(
    r"^( +)-- \(the libraries' definitions only this block uses go here\)\n", re.MULTILINE
)
#: The comment lines (and blank lines) that open a library's unit.
_LEADING_COMMENTS = re.compile(r"\A(?:--[^\n]*\n|\n)*")
#: The line that closes a block :data:`_HERE` marks.
_CLOSING = re.compile(r"(end|else|elseif)\b")

#: Globals a script may read (Lua 5.1's and Redis's): a script's local of one of these
#: names before a block would change what a library definition put in it reads.
LUA_GLOBALS = frozenset(
    {
        "assert", "collectgarbage", "error", "getmetatable", "ipairs", "loadstring", "next",
        "pairs", "pcall", "rawequal", "rawget", "rawset", "select", "setmetatable",
        "tonumber", "tostring", "type", "unpack", "xpcall", "string", "table", "math", "bit",
        "cjson", "cmsgpack", "struct", "redis", "KEYS", "ARGV", "_G", "_VERSION",
    }
)  # fmt: skip


def _blocks(body: str) -> list[tuple[int, int]]:
    """The blocks of ``body`` that a line :data:`_HERE` (or :data:`_LATER`, whose block
    is the rest of the text) marks: (offset of the marking line, offset of the line that
    closes the block), in order. Raises ValueError for a marking line outside a block or
    inside another's."""
    blocks = []
    for match in _HERE.finditer(body):
        indent = len(match.group(1))
        offset = match.end()
        for line in body[match.end() :].split("\n"):
            stripped = line.lstrip(" ")
            if stripped and len(line) - len(stripped) < indent:
                if not _CLOSING.match(stripped):
                    raise ValueError(f"a line {match.group(0).strip()!r} outside a block")
                break
            offset += len(line) + 1
        else:
            raise ValueError(f"a line {match.group(0).strip()!r} outside a block")
        blocks.append((match.start(), offset))
    later = _LATER.search(body)
    if later is not None:
        blocks.append((later.start(), len(body)))
    blocks.sort()
    for (_, end), (start, _) in pairwise(blocks):
        if start < end:
            raise ValueError("a block of definitions inside another")
    return blocks


def _function_alone(unit: str) -> bool:
    """Whether a library's unit (:func:`_definitions`) is one ``local function`` and
    nothing else: it can be defined in two places without two copies of any state."""
    code = [line for line in _NOT_CODE.sub("", unit).split("\n") if line.strip()]
    top_level = [line for line in code if not line[0].isspace()]
    return (
        len(top_level) == 2
        and top_level[0].startswith("local function ")
        and top_level[1].rstrip() == "end"
    )


#: A local a script declares: ``local function NAME``, ``local A, B``, a loop's names.
_LOCAL = re.compile(
    r"\blocal\s+function\s+(\w+)|\blocal\s+([\w\s,]+?)\s*(?:=|\n)|\bfor\s+([\w\s,]+?)\s*(?:=|\bin\b)"
)


def _locals_in(code: str) -> set[str]:
    """The names ``code`` declares as locals (anywhere in it: a superset of those in
    scope at its end)."""
    found: set[str] = set()
    for match in _LOCAL.finditer(_NOT_CODE.sub(" ", code)):
        found.update(_NAME.findall(next(g for g in match.groups() if g)))
    return found


#: The first line of every script :func:`source` assembles.
_INLINED = "-- The constants shared with Python are written as values (scrapy_dist/lua_source.py)."
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
    keep = _kept(libraries, body)
    return [text for k, (_, text) in enumerate(units) if keep[k]]


def _kept(libraries: Sequence[str], body: str) -> list[bool]:
    """For each top-level unit of ``libraries`` in order, whether ``body`` reaches it
    (:func:`used_definitions`)."""
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
    return keep


def parts(name: str) -> tuple[list[str], str]:
    """The texts of the libraries ``lua/<name>.lua`` uses (in the order :func:`source`
    puts them) and its own text (what :func:`source` joins after :func:`constants`)."""
    text = _read(name)
    return [_read(lib) for lib in _libraries(text, [])], text
