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
    ``-- (the libraries' other definitions go here)`` uses is put at that line instead.

    The files are read with :mod:`importlib.resources`, so a copy of scrapy_dist inside
    a zipped egg (a scrapyd deployment that bundles it) works like an installed one.

    Raises:
        ConfigurationError: The script is not part of this copy of the package (an egg
            or zip built without scrapy_dist's package data).
    """
    libraries, body = parts(name)
    later = _LATER.search(body)
    head = body if later is None else body[: later.start()]
    texts = [_INLINED, *used_definitions(libraries, head), head]
    if later is not None:
        # a script whose common path returns early (settle's "all done"): the
        # definitions only the rest of it reaches come after that path, so a call that
        # returns there does not build them (their closures, upvalues, and the garbage
        # collection of both)
        units = [text for library in libraries for _, text in _definitions(library)]
        first, every = _kept(libraries, head), _kept(libraries, body)
        texts += [text for text, f, e in zip(units, first, every, strict=True) if e and not f]
        texts.append(body[later.end() :])
    return inline_constants("\n".join(texts))


#: A line of a script's body after which the definitions of its libraries that only the
#: text after it reaches are put (:func:`source`): its text before returns early on its
#: common path, and that path does not build them.
_LATER = re.compile(r"^-- \(the libraries' other definitions go here\)\n", re.MULTILINE)


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
