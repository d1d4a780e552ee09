"""``scrapy-dist push``: validate seed lines as the spider does and push the valid ones."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from scrapy_dist.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    Context,
    crawl_exists,
    err,
    out,
    report_absent,
)
from scrapy_dist.exceptions import InvalidSeed

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Sequence

    from scrapy import Spider

    from scrapy_dist.seeds import SeedQueue

#: Seeds per ``RPUSH``/``SADD``/``ZADD``, and commands per pipeline.
PUSH_CHUNK, PUSH_PIPELINE = 1_000, 10
#: Invalid seed lines reported one by one; the rest are counted.
MAX_REPORTED = 20
#: Inputs from this size on get a progress bar (when stderr is a terminal).
PROGRESS_BYTES = 1 << 20


class ProgressBar:
    """A one-line progress bar on a terminal, redrawn at most 10 times a second.

    Args:
        stream: the terminal.
        total: total bytes, or ``None`` if unknown (then only lines are counted).
    """

    WIDTH = 30

    def __init__(self, stream: IO[str], total: int | None) -> None:
        self.stream = stream
        self.total = total
        self._next = 0.0

    def update(self, lines: int, done: int, *, force: bool = False) -> None:
        """Show ``lines`` lines read, ``done`` bytes of :attr:`total`."""
        now = time.monotonic()
        if now < self._next and not force:
            return
        self._next = now + 0.1
        if self.total:
            share = min(1.0, done / self.total)
            bar = "#" * int(share * self.WIDTH)
            text = f"\r[{bar:<{self.WIDTH}}] {share:6.1%}  {lines:,} lines"
        else:
            text = f"\r{lines:,} lines"
        self.stream.write(text)
        self.stream.flush()

    def finish(self, lines: int, done: int) -> None:
        """Draw the final state and end the line."""
        self.update(lines, done, force=True)
        self.stream.write("\n")
        self.stream.flush()


def _input_lines(args: argparse.Namespace) -> Iterator[tuple[str, bytes, int]]:
    """``(label, raw line, bytes read so far)`` from the URL arguments, then the file."""
    for number, url in enumerate(args.urls, 1):
        yield f"argument {number}", os.fsencode(url), 0
    path = args.file
    if path is None and args.urls:
        return
    if path is None:
        if sys.stdin.isatty():
            raise CommandError("no seeds given: pass URLs, --file FILE, or lines on stdin")
        path = "-"
    stream = sys.stdin.buffer if path == "-" else _open_input(path)
    with contextlib.ExitStack() as stack:
        if stream is not sys.stdin.buffer:
            stack.enter_context(stream)
        done = 0
        for number, line in enumerate(stream, 1):
            done += len(line)
            yield f"line {number}", line, done


def _open_input(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as e:
        raise CommandError(f"cannot read {path}: {e.strerror}") from e


def _input_size(args: argparse.Namespace) -> int | None:
    """Bytes to read (0 for URL arguments only), or ``None`` if unknown (a pipe)."""
    try:
        if args.file not in (None, "-"):
            return os.path.getsize(args.file)
        if args.file is None and args.urls:
            return 0
        info = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@dataclass
class PushReport:
    """What ``push`` did: seeds pushed (``new``: not in the set or zset already),
    invalid lines, blank lines, and the first invalid lines' reports."""

    key: str
    kind: str
    pushed: int = 0
    new: int = 0
    invalid: int = 0
    blank: int = 0
    errors: list[str] = field(default_factory=list)


class SeedPusher:
    """Validates seed lines like the spider does and pushes the valid ones in input
    order, in pipelined batches.

    Args:
        seeds: the crawl's seeds key (``None`` for a dry run).
        report: where the counts go.
        encoding: ``REDIS_ENCODING``.
        spidercls: the spider class, to check callbacks (``None`` outside a project).
        score: the seeds' score in zset mode.
        extra_as_formdata: ``REDIS_START_URLS_EXTRA_FORMDATA``: a JSON seed's fields
            other than scrapy_dist's are form data (scrapy-redis's seeds), not errors.
        allowed_meta: ``SEED_ALLOWED_META``, connection-changing or private ``meta``
            keys a seed may still carry.
    """

    def __init__(
        self,
        seeds: SeedQueue | None,
        report: PushReport,
        *,
        encoding: str,
        spidercls: type[Spider] | None,
        score: float,
        extra_as_formdata: bool = True,
        allowed_meta: Sequence[str] = (),
        raw: bool = False,
    ) -> None:
        self.seeds = seeds
        self.allowed_meta = frozenset(allowed_meta)
        self.report = report
        self.encoding = encoding
        self.extra_as_formdata = extra_as_formdata
        self.spidercls = spidercls
        #: ``--raw``: lines are pushed as given (only blank ones skipped), for a spider
        #: whose own ``make_request_from_data`` reads another format and validates it.
        self.raw = raw
        self.score = score
        self._batch: list[bytes] = []
        #: Lines given to :meth:`add`, and how many of the first are dealt with (pushed,
        #: or blank or invalid) as of the last :meth:`flush`.
        self.lines = self.through = 0

    def add(self, label: str, raw: bytes) -> None:
        """Validate one line; batch it if valid, count (and keep the reason) if not."""
        from scrapy_dist.seeds import check_callbacks, parse_seed

        self.lines += 1
        data = raw.strip()
        if not data:
            self.report.blank += 1
            return
        if self.raw:
            self._batch.append(data)
            if len(self._batch) >= PUSH_CHUNK * PUSH_PIPELINE:
                self.flush()
            return
        try:
            seed = parse_seed(
                data,
                self.encoding,
                allowed_meta=self.allowed_meta,
                extra_as_formdata=self.extra_as_formdata,
            )
            if self.spidercls is not None:
                check_callbacks(seed, self.spidercls)
        except InvalidSeed as e:
            self.report.invalid += 1
            if len(self.report.errors) < MAX_REPORTED:
                self.report.errors.append(f"{label}: {e}")
            return
        self._batch.append(data)
        if len(self._batch) >= PUSH_CHUNK * PUSH_PIPELINE:
            self.flush()

    def flush(self) -> None:
        """Push the batch: one pipeline of commands of :data:`PUSH_CHUNK` seeds."""
        batch, self._batch = self._batch, []
        if self.seeds is not None and batch:
            with self.seeds.client.pipeline(transaction=False) as pipe:
                for start in range(0, len(batch), PUSH_CHUNK):
                    self.seeds.push(batch[start : start + PUSH_CHUNK], self.score, pipe=pipe)
                replies = pipe.execute()
            added = len(batch) if self.seeds.kind == "list" else sum(int(n) for n in replies)
            self.report.new += added
        self.report.pushed += len(batch)
        self.through = self.lines


def cmd_push(ctx: Context, args: argparse.Namespace) -> int:
    """Push the seeds; exit status 1 if some lines were invalid (the valid ones are
    pushed). Pushing to a crawl with no keys starts it; if the spider has other
    crawls (jobs), they are named on stderr, in case the job is not the intended one."""
    from scrapy_dist.seeds import SeedQueue

    layout, config, spidercls = ctx.layout(args.spider, connect=not args.dry_run)
    _warn_not_redis_spider(spidercls, layout.seeds)

    seeds = None
    if not args.dry_run:
        client = ctx.crawl_client(config, layout)
        if not crawl_exists(client, layout):  # this push starts it: fine, unless a job
            report_absent(client, layout, config, label="note", same_spider=True)
        seeds = SeedQueue(client, layout.seeds, layout.seeds_kind)
        seeds.check_type()
    report = PushReport(layout.seeds, layout.seeds_kind)
    pusher = SeedPusher(
        seeds,
        report,
        encoding=config.seeds.encoding,
        spidercls=spidercls,
        score=args.score,
        extra_as_formdata=config.seeds.extra_formdata,
        allowed_meta=sorted(config.seeds.allowed_meta),
        raw=args.raw,
    )
    size = _input_size(args)
    bar = None
    if sys.stderr.isatty() and not args.quiet and (size is None or size >= PROGRESS_BYTES):
        bar = ProgressBar(sys.stderr, size)
    lines = done = 0
    try:
        for label, raw, done in _input_lines(args):
            lines += 1
            pusher.add(label, raw)
            if bar is not None:
                bar.update(lines, done)
        pusher.flush()
    except KeyboardInterrupt:
        # the batches sent before stay pushed: say how far it got, so a re-run can
        # skip them instead of pushing them twice
        err(
            f"\ninterrupted: {report.pushed} seed(s) pushed to {report.key!r}, the valid ones "
            f"of the first {pusher.through} line(s); to resume, push from line "
            f"{pusher.through + 1} on (a batch being sent when interrupted may have arrived)"
        )
        raise
    if bar is not None:
        bar.finish(lines, done)
    _print_push(report, args)
    if report.invalid and _own_seed_format(spidercls):
        err(
            f"note: {args.spider!r} reads seeds with its own make_request_from_data: if its "
            "seeds are in another format, --raw pushes the lines as given (a seed it then "
            "refuses goes to the dead-letter list)"
        )
    return EXIT_FAILED if report.invalid else EXIT_OK


def _own_seed_format(spidercls: type[Spider] | None) -> bool:
    """Whether the spider overrides ``make_request_from_data`` (its seeds are then in
    its own format: page numbers, ids...)."""
    from scrapy_dist.spiders import RedisSpiderMixin

    return (
        spidercls is not None
        and issubclass(spidercls, RedisSpiderMixin)
        and spidercls.make_request_from_data is not RedisSpiderMixin.make_request_from_data
    )


def _warn_not_redis_spider(spidercls: type[Spider] | None, key: str) -> None:
    """Warn when the project's spider never reads seeds from Redis."""
    from scrapy_dist.spiders import RedisSpiderMixin

    if spidercls is None or issubclass(spidercls, RedisSpiderMixin):
        return
    err(
        f"scrapy-dist: warning: spider {spidercls.name!r} ({spidercls.__module__}."
        f"{spidercls.__qualname__}) is not a Redis spider, so its workers never read "
        f"{key!r}; make it a scrapy_dist.spiders.RedisSpider (or RedisCrawlSpider, "
        "RedisSpiderMixin) to crawl these seeds"
    )


def _print_push(report: PushReport, args: argparse.Namespace) -> None:
    for line in report.errors:
        err(line)
    if report.invalid > len(report.errors):
        err(f"... and {report.invalid - len(report.errors)} more invalid line(s)")
    if args.json:
        out(
            json.dumps(
                {
                    "key": report.key,
                    "type": report.kind,
                    "pushed": report.pushed,
                    "new": report.new,
                    "invalid": report.invalid,
                    "blank": report.blank,
                    "dry_run": args.dry_run,
                }
            )
        )
        return
    verb = "valid (dry run, nothing pushed)" if args.dry_run else "pushed"
    if args.raw:
        verb = "would push as given (dry run, --raw: not validated)" if args.dry_run else "pushed"
    text = f"{verb} {report.pushed} seed(s) to {report.key!r} ({report.kind})"
    if report.kind != "list" and not args.dry_run:
        text += f", {report.new} new"
    text += f"; invalid {report.invalid}"
    if report.blank:
        text += f"; {report.blank} blank line(s) skipped"
    out(text)


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``push`` to the subcommands."""
    push = commands.add_parser(
        "push",
        parents=[common],
        help="validate seeds and push the valid ones",
        description="Push seeds (plain URLs or JSON objects, one per line) to the crawl's "
        "seeds key, in input order and in the crawl's seed mode (list, set or zset). "
        "Lines are validated as the spider validates them; invalid lines are reported "
        "with their line numbers and not pushed (exit code 1). --raw pushes them as given "
        "(a spider whose own make_request_from_data reads another format).",
    )
    push.add_argument("spider", metavar="SPIDER")
    push.add_argument("urls", metavar="URL", nargs="*", help="seeds given as arguments")
    push.add_argument(
        "-f", "--file", metavar="FILE", help="read seeds from FILE ('-': stdin, the default)"
    )
    push.add_argument(
        "--score",
        type=float,
        default=0.0,
        help="score of the seeds in zset mode (the highest is read first)",
    )
    push.add_argument("--dry-run", action="store_true", help="validate only, push nothing")
    push.add_argument(
        "--raw",
        action="store_true",
        help="push lines as given, unvalidated (a spider whose own make_request_from_data "
        "reads another format)",
    )
    push.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    push.add_argument("--json", action="store_true", help="print the summary as JSON")
    push.set_defaults(func=cmd_push, writes=lambda args: not args.dry_run)
