"""``scrapy-dist dead list|requeue|purge``: inspect and repair a crawl's dead-letter list.

Records are read and put back only through :mod:`scrapy_dist.deadletter`, which owns
their format; this module checks what a worker would refuse again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy_dist import deadletter
from scrapy_dist.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    Context,
    check_key,
    confirm,
    err,
    iter_list,
    out,
    require_crawl,
    when,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    import redis
    from scrapy import Request, Spider

    from scrapy_dist.config.core import Config
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import RedisQueue
    from scrapy_dist.serializers import RequestPolicy, Serializer
    from scrapy_dist.status import CrawlLayout


def cmd_dead_list(ctx: Context, args: argparse.Namespace) -> int:
    """List the records (``--limit``, ``--kind``); exit 1 if the crawl has no keys."""
    layout, config, _ = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    if not require_crawl(client, layout, config):
        return EXIT_FAILED
    from scrapy_dist.frontier.shards import other_shards

    shown = total = 0
    lists = [(client, layout.keys.dead)]  # a sharded crawl has one per shard
    lists += [
        (node, keys.dead)
        for node, keys in other_shards(client, layout.keys, config.keys, config.frontier.shards)
    ]
    for node, key in lists:
        check_key(node, key, "list", "dead letters")
        count = int(node.llen(key))
        total += count
        if not args.json:
            out(f"{key}: {count} record(s)")
        for index, raw in iter_list(node, key, count):
            record = deadletter.parse(raw)
            if args.kind and record.get("kind") != args.kind:
                continue
            if args.limit and shown >= args.limit:
                break
            shown += 1
            if args.json:
                out(json_line({"index": index, **record}))
                continue
            stamp = when(record["time"]) if isinstance(record.get("time"), (int, float)) else ""
            out(f"#{index:<5} {record.get('kind', '?'):<8} {stamp}  {deadletter.url_of(record)}")
            out(f"       {record.get('reason', '')}")
    if not args.json and args.limit and shown >= args.limit and total > shown:
        out(f"(first {shown} shown; --limit 0 shows all)")
    return EXIT_OK


def json_line(value: Any) -> str:
    """``value`` as one line of JSON, non-ASCII text kept readable except U+2028, U+2029
    and U+0085, which are escaped: JSON allows them raw, but JavaScript (before ES2019)
    takes the first two for line ends, and line-splitting readers (Python's
    ``str.splitlines``) all three."""
    text = json.dumps(value, ensure_ascii=False)
    for char in _LINE_BREAKS:
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


#: Characters ``json.dumps`` leaves raw that some readers take for line ends.
_LINE_BREAKS = ("\u2028", "\u2029", "\x85")


class RecordChecks:
    """Whether a worker would dead-letter a requeued seed or request again.

    Args:
        spidercls: the spider class if known (to check callbacks).
        encoding: ``REDIS_ENCODING``, for seeds.
        extra_as_formdata: ``REDIS_START_URLS_EXTRA_FORMDATA``.
        allowed_meta: ``SEED_ALLOWED_META``.
        serializer: the ``SCHEDULER_SERIALIZER``, for requests.
        policy: the request classes and URL schemes workers accept.
        queue_score: the queue's score of a request (its priority).
    """

    def __init__(
        self,
        *,
        spidercls: type[Spider] | None,
        encoding: str,
        extra_as_formdata: bool,
        allowed_meta: frozenset[str],
        serializer: Serializer,
        policy: RequestPolicy,
        queue_score: Callable[[Request], float | str],
    ) -> None:
        self.spidercls = spidercls
        self.encoding = encoding
        self.extra_as_formdata = extra_as_formdata
        self.allowed_meta = allowed_meta
        self.serializer = serializer
        self.policy = policy
        self.queue_score = queue_score

    @classmethod
    def from_config(
        cls, config: Config, spidercls: type[Spider] | None, queue: RedisQueue
    ) -> RecordChecks:
        """The checks of a config, for a crawl with this spider class and queue."""
        from scrapy_dist.serializers import RequestPolicy, load_serializer

        return cls(
            spidercls=spidercls,
            encoding=config.seeds.encoding,
            extra_as_formdata=config.seeds.extra_formdata,
            allowed_meta=config.seeds.allowed_meta,
            serializer=load_serializer(config.requests.serializer),
            policy=RequestPolicy.build(config.requests.classes, config.requests.schemes),
            queue_score=queue.score,
        )

    def seed(self, data: bytes) -> None:
        """Raises :class:`~scrapy_dist.exceptions.InvalidSeed`: the seed is invalid."""
        from scrapy_dist.seeds import check_callbacks, parse_seed

        seed = parse_seed(
            data,
            self.encoding,
            allowed_meta=self.allowed_meta,
            extra_as_formdata=self.extra_as_formdata,
        )
        if self.spidercls is not None:
            check_callbacks(seed, self.spidercls)

    def request(self, data: bytes) -> float | str:
        """The queue score of a serialized request (a queue per slot's names its
        download slot: ``meta["download_slot"]``, else the host).

        Raises:
            ValueError: it is not one, or a worker would refuse it (the reason).
        """
        from scrapy import Request

        try:
            obj = self.serializer.loads(data)
            meta = obj.get("meta")
            slot = meta.get("download_slot") if isinstance(meta, dict) else None
            request = Request(
                str(obj["url"]),
                priority=int(obj.get("priority", 0)),
                meta={} if slot is None else {"download_slot": slot},
            )
        except (ValueError, TypeError, KeyError, OverflowError) as e:
            raise ValueError(f"not a serialized request ({e})") from e
        refusal = self._refusal(obj)
        if refusal:
            raise ValueError(f"request is still invalid: {refusal}")
        return self.queue_score(request)

    def _refusal(self, obj: dict[str, Any]) -> str | None:
        """Why a worker would dead-letter this request again (``None``: it would not)."""
        from scrapy_dist import callbacks
        from scrapy_dist.serializers import check_priority

        try:
            self.policy.request_class(obj.get("_class"))
            self.policy.check_url(obj.get("url"))
            check_priority(obj.get("priority", 0))
        except ValueError as e:
            return str(e)
        for name in ("callback", "errback"):
            if obj.get(name) and self.spidercls is not None:
                reason = callbacks.refusal(self.spidercls, obj[name], public_only=False)
                if reason:
                    return f"{name} {reason}"
        return None


def shard_requeuer(
    client: redis.Redis,
    node: redis.Redis,
    keys: RedisKeys,
    *,
    layout: CrawlLayout,
    config: Config,
    spidercls: type[Spider] | None,
    kind: str | None = None,
) -> deadletter.Requeuer:
    """The requeuer of one shard's dead letters (``keys`` on ``node``; ``client``: the
    crawl's, where its seeds and workers are), as ``requeue`` and ``scrapy-dist web``
    run it: the shard's dead-letter list and queue checked for their types, its queue
    opened (a previous version's priority queue moved into levels first, if none of the
    crawl's workers runs), each record checked (:class:`RecordChecks`).

    Raises:
        ConfigurationError: the list or the queue holds another type.
    """
    from scrapy_dist.frontier.registry import live_workers
    from scrapy_dist.seeds import SeedQueue

    check_key(node, keys.dead, "list", "dead letters")
    check_key(node, keys.requests, layout.queue_cls.key_types, "queue")
    queue = layout.queue_cls(node, keys.requests, keys.seq)
    queue.open(lambda: live_workers(client, layout.keys.workers, layout.worker_timeout))
    checks = RecordChecks.from_config(config, spidercls, queue)
    return deadletter.Requeuer(
        node,
        keys.dead,
        queue=queue,
        seeds=SeedQueue(client, layout.seeds, layout.seeds_kind),
        check_seed=checks.seed,
        check_request=checks.request,
        kind=kind,
    )


def cmd_dead_requeue(ctx: Context, args: argparse.Namespace) -> int:
    """Requeue records (``--all`` or ``--index``, of shard ``--shard``); exit 1 if some
    stay in the list or the crawl has no keys, 2 for an index past the end or a shard
    the crawl does not have. A sharded crawl's records go back to their own shard's
    queue (``--all``: every shard's)."""
    from scrapy_dist.frontier.shards import other_shards

    layout, config, spidercls = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    if not require_crawl(client, layout, config):
        return EXIT_FAILED
    shards = [
        (client, layout.keys),
        *other_shards(client, layout.keys, config.keys, config.frontier.shards),
    ]
    if args.shard is not None:
        if not 0 <= args.shard < len(shards):
            raise CommandError(f"--shard {args.shard}: the crawl has {len(shards)} shard(s)")
        shards = [shards[args.shard]]
    elif not args.all:
        shards = shards[:1]  # --index numbers shard 0's list unless --shard says
    check_key(client, layout.seeds, layout.seeds_kind, "seeds")
    requests = seeds = left = 0
    skipped: list[tuple[int, str]] = []
    for node, keys in shards:
        requeuer = shard_requeuer(
            client, node, keys, layout=layout, config=config, spidercls=spidercls, kind=args.kind
        )
        try:
            if args.all:
                requeuer.all()
            else:
                requeuer.indexes(args.index)
        except deadletter.NoSuchRecord as e:
            raise CommandError(str(e)) from None
        except deadletter.ListContended as e:
            # (batches moved before it stay moved: say how many)
            err(
                f"requeued {requests + requeuer.requests} request(s) and "
                f"{seeds + requeuer.seeds_done} seed(s) before stopping"
            )
            raise CommandError(str(e), EXIT_FAILED) from None
        shard_left = int(node.llen(keys.dead))
        for index, reason in requeuer.skipped:
            err(f"{keys.dead} #{index}: not requeued: {reason}")
        if not args.json:
            out(
                f"requeued {requeuer.requests} request(s) to {keys.requests!r} and "
                f"{requeuer.seeds_done} seed(s) to {layout.seeds!r}; "
                f"{len(requeuer.skipped)} skipped; {shard_left} record(s) left in "
                f"{keys.dead!r}"
            )
        requests += requeuer.requests
        seeds += requeuer.seeds_done
        skipped += requeuer.skipped
        left += shard_left
    if args.json:
        out(
            json.dumps(
                {"requests": requests, "seeds": seeds, "skipped": len(skipped), "left": left}
            )
        )
    return EXIT_FAILED if skipped else EXIT_OK


def cmd_dead_purge(ctx: Context, args: argparse.Namespace) -> int:
    """Delete the list, every shard's for a sharded crawl (asks unless ``--yes``); exit 1
    if refused or the crawl has no keys."""
    from scrapy_dist.frontier.shards import other_shards

    layout, config, _ = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    if not require_crawl(client, layout, config):
        return EXIT_FAILED
    lists = [(client, layout.keys.dead)]
    lists += [
        (node, keys.dead)
        for node, keys in other_shards(client, layout.keys, config.keys, config.frontier.shards)
    ]
    counts = []
    for node, key in lists:
        check_key(node, key, "list", "dead letters")
        counts.append(int(node.llen(key)))
    names = ", ".join(repr(key) for _, key in lists)
    if not sum(counts):
        out(f"{names}: empty")
        return EXIT_OK
    if not confirm(f"Delete the {sum(counts)} record(s) of {names}?", args.yes):
        err("not purged")
        return EXIT_FAILED
    for node, key in lists:
        with node.pipeline(transaction=True) as pipe:
            pipe.llen(key)
            pipe.delete(key)
            purged, _ = pipe.execute()
        if int(purged):
            out(f"purged {int(purged)} record(s) from {key!r}")
    return EXIT_OK


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``dead list|requeue|purge`` to the subcommands."""
    dead = commands.add_parser("dead", help="inspect and repair the dead-letter list")
    actions = dead.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("list", parents=[common], help="show records")
    show.add_argument("spider", metavar="SPIDER")
    show.add_argument("--limit", type=int, default=20, help="records shown (0: all)")
    show.add_argument("--kind", choices=("request", "seed"), help="only this kind")
    show.add_argument("--json", action="store_true", help="one JSON record per line")
    show.set_defaults(func=cmd_dead_list)

    requeue = actions.add_parser(
        "requeue",
        parents=[common],
        help="put records back in the queue or the seeds",
        description="Requests go back to the request queue with their priority, seeds "
        "to the seeds key; each record is removed from the list in the same transaction. "
        "Records that cannot be requeued (invalid seeds, unreadable requests) stay, are "
        "reported, and make the exit code 1.",
    )
    requeue.add_argument("spider", metavar="SPIDER")
    which = requeue.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every record")
    which.add_argument(
        "--index",
        type=int,
        nargs="+",
        metavar="I",
        help="records at these positions (as 'dead list' numbers them)",
    )
    requeue.add_argument("--kind", choices=("request", "seed"), help="only this kind")
    requeue.add_argument(
        "--shard",
        type=int,
        metavar="I",
        help="a sharded crawl's shard I only (default: every shard with --all, shard 0 "
        "with --index)",
    )
    requeue.add_argument("--json", action="store_true", help="print the summary as JSON")
    requeue.set_defaults(func=cmd_dead_requeue, writes=True)

    purge = actions.add_parser("purge", parents=[common], help="delete every record")
    purge.add_argument("spider", metavar="SPIDER")
    purge.add_argument("-y", "--yes", action="store_true", help="do not ask")
    purge.set_defaults(func=cmd_dead_purge, writes=True)
