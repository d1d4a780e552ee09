"""``scrapy-dist reset`` and ``scrapy-dist export``: delete one crawl's keys; write its
items out."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
from typing import IO, TYPE_CHECKING, Any, cast

from redis.exceptions import WatchError

from scrapy_dist.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    READ_CHUNK,
    CommandError,
    Context,
    check_key,
    confirm,
    describe,
    drop_stdout,
    err,
    iter_list,
    out,
    report_absent,
    require_crawl,
)
from scrapy_dist.cli._crawls import scan_owned
from scrapy_dist.frontier.registry import live_workers

if TYPE_CHECKING:
    import argparse

    import redis

    from scrapy_dist.config.core import Config
    from scrapy_dist.status import CrawlLayout


def cmd_reset(ctx: Context, args: argparse.Namespace) -> int:
    """Delete the crawl's keys (asks unless ``--yes``); exit 1 if refused (live workers,
    no confirmation) or the crawl has no keys of its own.

    A key whose name does not contain the crawl's name (:func:`shared_keys`: a literal
    ``redis_key`` or key setting, which every job of the spider uses) is kept and named,
    unless ``--include-shared``."""
    from scrapy_dist.filters import backend_from_config

    layout, config, _ = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    crawl = layout.keys.crawl
    backend_keys = backend_from_config(config.dupefilter, client, layout.keys).keys()
    groups = [(client, scan_owned(client, layout, backend_keys))]
    groups += _shards_present(client, layout, config)  # a sharded crawl's other shards
    shared = [key for _, keys in groups for key in shared_keys(crawl, keys)]
    if not args.include_shared:
        groups = [(node, [k for k in keys if k not in shared]) for node, keys in groups]
    present = [key for _, keys in groups for key in keys]
    kept = [] if args.include_shared else shared
    if not present:
        if kept:
            _report_kept(crawl, kept)
        else:
            report_absent(client, layout, config)
        return EXIT_FAILED
    if not args.force:
        _refuse_live_workers(client, layout, crawl)
    err(f"crawl {crawl!r} at {describe(client)}: {len(present)} key(s)")
    for key in present[:30]:
        err(f"  {key}")
    if len(present) > 30:
        err(f"  ... and {len(present) - 30} more")
    if kept:
        _report_kept(crawl, kept)
    if not confirm(f"Delete these {len(present)} key(s)?", args.yes):
        err("nothing deleted")
        return EXIT_FAILED
    if not args.yes and not args.force:
        # a worker may have started while the question was open
        _refuse_live_workers(client, layout, crawl)
    deleted = 0
    for node, keys in groups:
        for start in range(0, len(keys), READ_CHUNK):
            deleted += int(node.unlink(*keys[start : start + READ_CHUNK]))
    out(f"deleted {deleted} key(s) of crawl {crawl!r}")
    return EXIT_OK


def shared_keys(crawl: str, keys: list[str]) -> list[str]:
    """The keys among ``keys`` that do not name crawl ``crawl`` (hash tag aside): its
    name followed by the end, ``:``, ``#`` (a shard) or ``}`` (a hash tag). They come
    from a literal template (``redis_key = "books:start_urls"``, a
    ``SCHEDULER_DUPEFILTER_KEY`` without ``%(spider)s``), so every job of the spider, and
    the crawl without a job, uses the same key. ``reset --job`` keeps them. (Crawl
    ``books:start``, a job named ``start``, does not name ``books:start_urls``.)"""
    plain = crawl[1:-1] if crawl.startswith("{") and crawl.endswith("}") else crawl
    named = re.compile(re.escape(plain) + r"(?=$|[:#}])")
    return [key for key in keys if not named.search(key)]


def _report_kept(crawl: str, kept: list[str]) -> None:
    err(
        f"kept {len(kept)} key(s) whose name does not contain {crawl!r}: a literal "
        "redis_key or key setting names them, so other jobs of the spider use them too "
        "(--include-shared deletes them with the crawl)"
    )
    for key in kept[:30]:
        err(f"  {key}")
    if len(kept) > 30:
        err(f"  ... and {len(kept) - 30} more")


def _shards_present(
    client: redis.Redis, layout: CrawlLayout, config: Config
) -> list[tuple[redis.Redis, list[str]]]:
    """The keys that exist of each shard ``1..N-1`` of a sharded crawl, with a client
    for them (``SCAN``, never ``KEYS``)."""
    from dataclasses import replace

    from scrapy_dist.filters import backend_from_config
    from scrapy_dist.frontier.shards import other_shards

    found = []
    for node, keys in other_shards(client, layout.keys, config.keys, config.frontier.shards):
        shard = replace(layout, keys=keys, seeds=keys.start_urls, items=keys.items)
        backend_keys = backend_from_config(config.dupefilter, node, keys).keys()
        found.append((node, scan_owned(node, shard, backend_keys)))
    return found


def _refuse_live_workers(client: redis.Redis, layout: CrawlLayout, crawl: str) -> None:
    """Raise :class:`CommandError` (exit 1) if the crawl has live workers."""
    live = _live_workers(client, layout)
    if live:
        raise CommandError(
            f"crawl {crawl!r} has {len(live)} live worker(s) ({', '.join(live[:3])}): stop "
            "them first, or pass --force to delete their crawl under them",
            EXIT_FAILED,
        )


def _live_workers(client: redis.Redis, layout: CrawlLayout) -> list[str]:
    """Workers of the crawl with a recent heartbeat (none if the key is not a hash)."""
    return live_workers(client, layout.keys.workers, layout.worker_timeout)


def cmd_export(ctx: Context, args: argparse.Namespace) -> int:
    """Copy (or move, ``--delete``) the items list to a file; exit 1 if the crawl has no
    keys (no file is written then)."""
    layout, config, _ = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    if not require_crawl(client, layout, config):
        return EXIT_FAILED
    key = layout.items
    check_key(client, key, "list", "items")
    to_stdout = args.output == "-"
    if args.delete and (to_stdout or not _regular_or_absent(args.output)):
        target = "stdout" if to_stdout else args.output
        raise CommandError(
            f"--delete writes to a regular file only, not {target}: "
            "a pipe or a device cannot be synced to disk, so items removed from Redis after "
            "a write to it would be lost if its reader stopped (export to a file, then read it)"
        )
    if not to_stdout and not (args.append or args.overwrite) and _non_empty(args.output):
        raise CommandError(
            f"{args.output} exists and is not empty: pass --append to add to it, or "
            "--overwrite to replace it (it may hold the only copy of items an earlier "
            "'export --delete' removed from Redis)"
        )
    total = int(client.llen(key))
    target = "stdout" if to_stdout else args.output
    written = _Written(own_file=not to_stdout)
    try:
        with contextlib.ExitStack() as stack:
            if to_stdout:
                stream: IO[bytes] = sys.stdout.buffer
            else:
                try:
                    # unbuffered: what write() returned is in the file, nothing waits
                    stream = stack.enter_context(
                        open(args.output, "ab" if args.append else "wb", buffering=0)
                    )
                except OSError as e:
                    raise CommandError(f"cannot write {args.output}: {e.strerror}") from e
            move = _export_delete if args.delete else _export_copy
            move(client, key, total, stream, written)
    except OSError as e:
        if to_stdout:
            drop_stdout()
        message = _write_failed(e, target, key, total, written, delete=args.delete)
        raise CommandError(message, EXIT_FAILED) from e
    verb = "moved" if args.delete else "copied"
    err(f"{verb} {written.items} item(s) from {key!r} to {target}")
    return EXIT_OK


class _Written:
    """How far an export got: items written whole, and whether a failed write may have
    left a partial line at the end of the output (one that could not be cut off)."""

    def __init__(self, *, own_file: bool) -> None:
        self.items = 0
        self.partial = False
        #: Whether the output is a file this command opened (not stdout).
        self.own_file = own_file


def _write_failed(
    error: OSError, target: str, key: str, total: int, written: _Written, *, delete: bool
) -> str:
    """The one line that says where an export stopped and where the items are."""
    why = error.strerror or str(error)
    if delete:
        where = (
            f"the {written.items} written were removed from {key!r}, the other "
            f"{total - written.items} are still there (export them again with --append)"
        )
    else:
        where = f"nothing was removed from {key!r}"
    tail = f"; {target} may end with a partial line" if written.partial else ""
    return f"writing {target} failed after {written.items} item(s) ({why}): {where}{tail}"


def _write_lines(stream: IO[bytes], lines: list[bytes], written: _Written, *, sync: bool) -> None:
    """Write ``lines`` (each with a newline) whole, and ``fsync`` them with ``sync``; or
    raise :class:`OSError` having cut off again what the failed write or sync left of
    them in a regular file this command opened (so it ends with whole lines only).
    Written to stdout, a pipe or a device, they cannot be cut off:
    :attr:`_Written.partial` then says a line may be cut short."""
    data = memoryview(b"".join(raw + b"\n" for raw in lines))
    try:
        info: os.stat_result | None = os.fstat(stream.fileno())
    except (OSError, ValueError):  # a stream with no file (a caller's capture of stdout)
        info = None
    own = written.own_file and info is not None and stat.S_ISREG(info.st_mode)
    start = info.st_size if info is not None else 0
    try:
        while data:
            count = stream.write(data)
            data = data[count if count is not None else 0 :]
        stream.flush()
        if sync:
            _sync(stream)
    except OSError:
        try:
            if not own:
                raise
            os.ftruncate(stream.fileno(), start)
        except OSError:  # (a terminal or a device: no line to speak of)
            written.partial = info is None or not stat.S_ISCHR(info.st_mode)
        raise


def _sync(stream: IO[bytes]) -> None:
    """``fsync`` the file; a file system that cannot sync (``EINVAL``, ``ENOTSUP``) is
    taken as it is, any other failure (``EIO``, ``ENOSPC``) raises :class:`OSError`."""
    try:
        os.fsync(stream.fileno())
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise


def _non_empty(path: str) -> bool:
    """Whether ``path`` is a regular file with something in it."""
    try:
        return os.path.isfile(path) and os.path.getsize(path) > 0
    except OSError:
        return False


def _regular_or_absent(path: str) -> bool:
    """Whether ``path`` is a regular file, or nothing yet (it will be one)."""
    return os.path.isfile(path) or not os.path.exists(path)


def _export_copy(
    client: redis.Redis, key: str, total: int, stream: IO[bytes], written: _Written
) -> None:
    """Write the first ``total`` items, :data:`READ_CHUNK` per write.

    Raises:
        OSError: a write failed (:attr:`_Written.items` were written whole).
    """
    chunk: list[bytes] = []
    for _, raw in iter_list(client, key, total):
        chunk.append(raw)
        if len(chunk) == READ_CHUNK:
            _write_lines(stream, chunk, written, sync=False)
            written.items += len(chunk)
            chunk = []
    if chunk:
        _write_lines(stream, chunk, written, sync=False)
        written.items += len(chunk)


def _export_delete(
    client: redis.Redis, key: str, total: int, stream: IO[bytes], written: _Written
) -> None:
    """Write the first ``total`` items, removing each chunk from Redis only once it is
    written whole and synced to disk: a crash can repeat a chunk in the file, never lose
    one; a failed write leaves its chunk in Redis (and cuts it off the file again).

    Raises:
        OSError: a write or the sync failed (:attr:`_Written.items` were moved).
    """
    while written.items < total:
        count = min(READ_CHUNK, total - written.items)
        chunk = cast("list[bytes]", client.lrange(key, 0, count - 1))
        if not chunk:
            break
        start = os.fstat(stream.fileno()).st_size
        _write_lines(stream, chunk, written, sync=True)
        if not _remove_head(client, key, chunk):
            os.ftruncate(stream.fileno(), start)
            raise CommandError(
                f"another reader (an export --delete?) removed items of {key!r} while this "
                f"export wrote them: stopped after moving {written.items} item(s); the "
                "chunk it took is cut off this file again (run one export --delete of a "
                "key at a time)",
                EXIT_FAILED,
            )
        written.items += len(chunk)


def _remove_head(client: redis.Redis, key: str, chunk: list[bytes]) -> bool:
    """Remove ``chunk`` from the head of ``key`` if it is still there, atomically
    (``WATCH``: items pushed meanwhile are kept); ``False`` if another reader removed it."""
    with client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]
                if pipe.lrange(key, 0, len(chunk) - 1) != chunk:
                    return False
                pipe.multi()
                pipe.ltrim(key, len(chunk), -1)
                pipe.execute()
                return True
            except WatchError:
                continue


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``reset`` and ``export`` to the subcommands."""
    reset = commands.add_parser(
        "reset",
        parents=[common],
        help="delete one crawl's (or job's) keys",
        description="Delete every key of one crawl: queue, seeds, dupefilter (Bloom "
        "segments included), leases, workers, progress, dead letters, items, stats. "
        "Other crawls, including other jobs of the same spider, are untouched: a key "
        "whose name lacks the crawl's (a literal redis_key) is kept unless "
        "--include-shared. Refused "
        "while workers of the crawl are alive, unless --force.",
    )
    reset.add_argument("spider", metavar="SPIDER")
    reset.add_argument("-y", "--yes", action="store_true", help="do not ask")
    reset.add_argument("--force", action="store_true", help="even with live workers")
    reset.add_argument(
        "--include-shared",
        action="store_true",
        help="also delete keys named without the crawl's name (a literal redis_key or key "
        "setting), which other jobs of the spider use too",
    )
    reset.set_defaults(func=cmd_reset, writes=True)

    export = commands.add_parser(
        "export",
        parents=[common],
        help="write the items list as JSON lines",
        description="Write the items stored by RedisPipeline, oldest first, one per line. "
        "With --delete (to a regular file only), each chunk is removed from Redis once it "
        "is written and synced. A non-empty FILE needs --append or --overwrite.",
    )
    export.add_argument("spider", metavar="SPIDER")
    export.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="file to write ('-': stdout)"
    )
    export.add_argument("--delete", action="store_true", help="remove exported items")
    written = export.add_mutually_exclusive_group()
    written.add_argument("--append", action="store_true", help="append to FILE")
    written.add_argument("--overwrite", action="store_true", help="replace a non-empty FILE")
    export.set_defaults(func=cmd_export, writes=lambda args: args.delete)
