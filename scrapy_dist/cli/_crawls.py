"""Which crawls, and which keys of a crawl, exist in Redis: found with ``SCAN`` (never
``KEYS``), from the same key templates the workers use (:mod:`scrapy_dist.keys`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from scrapy_dist.connection import primaries
from scrapy_dist.keys import (
    HOLDERS_SUFFIX,
    SET_ASIDE_SUFFIX,
    RedisKeys,
    has_hash_tag,
    hash_tag_on,
    is_shard_crawl,
    level_key,
    slot_queue_key,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import redis

    from scrapy_dist.config.core import Config
    from scrapy_dist.status import CrawlLayout

#: Stand-in crawl name used to turn key templates into ``SCAN`` patterns.
_PROBE = "\x00"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def crawl_patterns(config: Config) -> list[tuple[str, str]]:
    """``(prefix, suffix)`` of the keys that reveal a crawl: queue, seeds, workers,
    progress, dead letters, stats and items, from the settings' key templates."""
    probe = RedisKeys.build(
        _PROBE,
        requests=config.keys.requests,
        dupefilter=config.keys.dupefilter,
        start_urls=config.keys.start_urls,
        hash_tag=hash_tag_on(config),
    )
    names = [
        probe.requests,
        probe.start_urls,
        probe.workers,
        probe.progress,
        probe.dead,
        probe.stats,
        probe.custom(config.keys.items, "REDIS_ITEMS_KEY"),
        probe.custom(config.items.stream_key, "REDIS_ITEMS_STREAM_KEY"),
    ]
    patterns = []
    for name in names:
        prefix, sep, suffix = name.partition(_PROBE)
        if sep and (prefix or suffix) and (prefix, suffix) not in patterns:
            patterns.append((prefix, suffix))
    return patterns


def find_crawls(
    client: redis.Redis,
    config: Config,
    count: int = 1000,
    *,
    redis_keys: Mapping[str, str] | None = None,
) -> list[str]:
    """The crawls present in Redis, found with ``SCAN`` (never ``KEYS``), sorted.

    A crawl is any name ``<crawl>`` for which one of the keys named by
    :func:`crawl_patterns` exists; a job's crawl is ``<spider>:<job>``. Under Redis
    Cluster every primary is scanned, and names are given without their hash tag
    (``books`` for ``{books}:requests``).

    ``redis_keys`` (spider -> its ``redis_key``) names the spiders' seeds keys: a literal
    one (``"books:start_urls"``, read by every job of the spider) reveals no crawl of its
    own name (``books`` for ``books:start_urls``) unless that is the spider's, and the
    spider has no job in Redis.
    """
    literal = {
        template: spider for spider, template in (redis_keys or {}).items() if "%(" not in template
    }
    found: set[str] = set()
    seeds_only: dict[str, str] = {}  # crawl -> spider, found by its literal seeds key only
    nodes = primaries(client)  # under Redis Cluster, SCAN every primary
    for prefix, suffix in crawl_patterns(config):
        pattern = f"{_glob_escape(prefix)}*{_glob_escape(suffix)}"
        keys = (raw for node in nodes for raw in node.scan_iter(match=pattern, count=count))
        for raw in keys:
            key = _text(raw)
            crawl = key[len(prefix) : len(key) - len(suffix)]
            # (a sharded crawl's other shards are its own, not crawls)
            if not crawl or not key.startswith(prefix) or not key.endswith(suffix):
                continue
            if key in literal:
                seeds_only[crawl] = literal[key]
            elif not is_shard_crawl(crawl):
                found.add(crawl)
    jobs = {crawl.partition(":")[0] for crawl in found if ":" in crawl}
    found.update(
        crawl for crawl, spider in seeds_only.items() if crawl == spider and spider not in jobs
    )
    return sorted(found)


def scan_owned(client: redis.Redis, layout: CrawlLayout, backend_keys: Sequence[str]) -> list[str]:
    """The keys of this crawl that exist: those its layout and its dupefilter backend
    name, plus Bloom segments and dupefilter buckets (both ``<dupefilter>:<n>:<n>``,
    :func:`scrapy_dist.keys.bucket_key`) and a recrawl window's generations
    (:func:`scrapy_dist.keys.window_generation_key` and the keys named after it) of any
    number, found under the dupefilter key with ``SCAN``, and a priority queue's levels
    (:func:`scrapy_dist.keys.level_key`, found with ``SCAN``; their index is named), and
    every worker's holding, whether the holders zset names it or not, and holdings set
    aside (``<holding>:wrongtype``): ``<crawl>:holders:*``, found with ``SCAN``; and the
    other keys scripts set aside (``<key>:wrongtype[:<n>]`` of
    :meth:`~scrapy_dist.status.CrawlLayout.settable_aside`), found with ``SCAN``.
    Another crawl's keys never match, even a job's whose name starts with this crawl's
    (``books:20261122:requests`` is not a key of crawl ``books``)."""
    named = list(dict.fromkeys([*layout.owned(), *backend_keys]))
    # <dupefilter>:<n>:<n> (Bloom segments, buckets); with a recrawl window also
    # <dupefilter>:<run>:<g>[:<stage>:<n>] and <dupefilter>:<gen>-<g>:<n>|n
    segments = re.compile(rf"^{re.escape(layout.keys.dupefilter)}:\d+(?:-\d+)?(?::(?:\d+|n))+$")
    with client.pipeline(transaction=False) as pipe:
        for key in named:
            pipe.exists(key)
        present = [key for key, n in zip(named, pipe.execute(), strict=True) if n]
    glob = _glob_escape(layout.keys.dupefilter) + ":*"
    for raw in client.scan_iter(match=glob, count=1000):
        key = _text(raw)
        if segments.match(key) and key not in present:
            present.append(key)
    # a priority queue's levels: <requests>:level:<name> (scrapy_dist.keys.level_key), and
    # a queue per slot's slots: <requests>:slot:<slot>:... (scrapy_dist.keys.slot_queue_key)
    for prefix in (level_key(layout.keys.requests, ""), slot_queue_key(layout.keys.requests, "")):
        for raw in client.scan_iter(match=_glob_escape(prefix) + "*", count=1000):
            key = _text(raw)
            if key not in present:
                present.append(key)
    # keys scripts set aside: <key>:wrongtype[:<n>] (scrapy_dist.keys.set_aside_key), of
    # any number (status probes the first few names only)
    aside = "|".join(re.escape(key) for key in layout.settable_aside())
    set_aside = re.compile(rf"^(?:{aside}){re.escape(SET_ASIDE_SUFFIX)}(?::\d+)?$")
    for raw in client.scan_iter(match="*" + SET_ASIDE_SUFFIX + "*", count=1000):
        key = _text(raw)
        if set_aside.match(key) and key not in present:
            present.append(key)
    # every worker's holding: <crawl>:holders:<worker> (scrapy_dist.keys.RedisKeys.holding)
    glob = _glob_escape(layout.keys.holding("")) + "*"
    holdings = [_text(raw) for raw in client.scan_iter(match=glob, count=1000)]
    own = _own_holdings(client, layout, backend_keys, holdings)
    present += [key for key in own if key not in present]
    return present


def _own_holdings(
    client: redis.Redis, layout: CrawlLayout, backend_keys: Sequence[str], found: list[str]
) -> list[str]:
    """The keys among ``found`` (``<crawl>:holders:*``) that are the crawl's holdings,
    not keys of the job named ``holders`` (crawl ``<crawl>:holders``, whose queue is
    ``<crawl>:holders:requests``): those of a worker the holders zset names, and of the
    others those the job's own layout does not name."""
    prefix = layout.keys.holding("")
    with client.pipeline(transaction=False) as pipe:
        pipe.zrange(layout.keys.holders, 0, -1)
        (named,) = pipe.execute(raise_on_error=False)
    workers = {_text(w) for w in named} if isinstance(named, list) else set()
    unnamed = [k for k in found if k[len(prefix) :].partition(SET_ASIDE_SUFFIX)[0] not in workers]
    if not unnamed or has_hash_tag(layout.keys.crawl):  # (a job's crawl has its own tag)
        return found
    job = _job_layout(layout, HOLDERS_SUFFIX[1:])
    renamed = [_renamed(key, layout.keys.crawl, job.keys.crawl) for key in backend_keys]
    job_keys = set(scan_owned(client, job, renamed))
    return [key for key in found if key not in job_keys]


def _renamed(key: str, crawl: str, other: str) -> str:
    """``key`` of crawl ``crawl`` as crawl ``other`` names it: the crawl name that starts
    it replaced (a literal key, which does not start with it, stays)."""
    return other + key[len(crawl) :] if key.startswith(crawl) else key


def _job_layout(layout: CrawlLayout, job: str) -> CrawlLayout:
    """The layout of crawl ``<crawl>:<job>``, made from this crawl's: the keys that
    start with the crawl name, as their templates do, start with the job's crawl name."""
    from dataclasses import replace

    crawl, keys = layout.keys.crawl, layout.keys
    other = f"{crawl}:{job}"
    return replace(
        layout,
        keys=RedisKeys(
            crawl=other,
            requests=_renamed(keys.requests, crawl, other),
            dupefilter=_renamed(keys.dupefilter, crawl, other),
            start_urls=_renamed(keys.start_urls, crawl, other),
        ),
        seeds=_renamed(layout.seeds, crawl, other),
        items=_renamed(layout.items, crawl, other),
        items_stream=_renamed(layout.items_stream, crawl, other) if layout.items_stream else "",
    )
