"""The Lua scripts in ``scrapy_dist/lua/``, registered once per client.

Each ``.lua`` file opens with a header naming its ``KEYS`` and ``ARGV``. Every key a
script touches is passed in ``KEYS``; no script derives key names. Redis scripts cannot
import each other, so code two scripts share lives in a library file (``_name.lua``,
functions only) that :func:`source` prepends to every script whose header has a line
``-- uses: _name``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

_registered: WeakKeyDictionary[redis.Redis, Scripts] = WeakKeyDictionary()


#: The header line naming the libraries a script uses.
_USES = re.compile(r"^-- uses: (.+)$", re.MULTILINE)


#: Where a copy of scrapy_dist keeps its scripts (package data, also read from a zip or egg).
LUA_PACKAGE = "scrapy_dist.lua"


@cache
def source(name: str) -> str:
    """Return the text of ``lua/<name>.lua`` shipped with the package, preceded by the
    libraries its ``-- uses:`` line names.

    The files are read with :mod:`importlib.resources`, so a copy of scrapy_dist inside
    a zipped egg (a scrapyd deployment that bundles it) works like an installed one.

    Raises:
        ConfigurationError: The script is not part of this copy of the package (an egg
            or zip built without scrapy_dist's package data).
    """
    resource = files(LUA_PACKAGE) / f"{name}.lua"
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigurationError(
            f"scrapy_dist's Lua script {name}.lua is missing from {files(LUA_PACKAGE)}: a copy "
            f"of scrapy_dist bundled in an egg or zip must include its package data "
            f"(setup.py: package_data={{'{LUA_PACKAGE}': ['*.lua']}}), or install "
            f"scrapy-dist with pip where the crawl runs"
        ) from e
    uses = _USES.search(text)
    libraries = [lib.strip() for lib in uses.group(1).split(",")] if uses else []
    return "\n".join([*(source(lib) for lib in libraries), text])


@dataclass(frozen=True)
class Scripts:
    """The package's scripts bound to one client (``EVALSHA``, reloaded on ``NOSCRIPT``)."""

    enqueue: Script
    join: Script
    leave: Script
    heartbeat: Script
    reserve: Script
    settle: Script
    renew: Script
    progress: Script
    release: Script
    dupefilter: Script
    stats: Script

    def all(self) -> list[Script]:
        """Every script, e.g. to load them all after the server lost its script cache."""
        return [getattr(self, f.name) for f in fields(self)]


def scripts_for(client: redis.Redis) -> Scripts:
    """Return the scripts registered on ``client``, registering them on first use (no I/O)."""
    try:
        return _registered[client]
    except KeyError:
        scripts = _registered[client] = Scripts(
            enqueue=client.register_script(source("enqueue")),
            join=client.register_script(source("join")),
            leave=client.register_script(source("leave")),
            heartbeat=client.register_script(source("heartbeat")),
            reserve=client.register_script(source("reserve")),
            settle=client.register_script(source("settle")),
            renew=client.register_script(source("renew")),
            progress=client.register_script(source("progress")),
            release=client.register_script(source("release")),
            dupefilter=client.register_script(source("dupefilter")),
            stats=client.register_script(source("stats")),
        )
        return scripts
