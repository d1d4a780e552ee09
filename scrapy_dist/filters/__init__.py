"""Where the dupefilter keeps fingerprints in Redis: one module per backend.

``DUPEFILTER_BACKEND`` names one:

* :class:`SetBackend` (``"set"``, :mod:`.exact`): the raw digests in a Redis set.
  Exact, about 70 bytes each.
* :class:`WindowSetBackend` (``"set"`` with ``DUPEFILTER_RECRAWL_AFTER``,
  :mod:`.exact`): exact with a recrawl window, a zset of digest -> time recorded. The
  other backends take the window themselves (rotating generations, :mod:`.window`).
* :class:`BucketsBackend` (``"buckets"``, :mod:`.buckets`): exact, in many small
  Redis lists kept as listpacks; about 25 bytes each at 10 million.
* :class:`BitmapBloomBackend` (``"bitmap"``, :mod:`.bitmap`): a scalable chain of Bloom
  filters in plain Redis strings (any server). Offsets come from MurmurHash3 with
  enhanced double hashing (:mod:`scrapy_dist.bloom`); one Lua call tests and sets all
  of them, so two workers adding the same new fingerprint get exactly one "new".
  Bitmaps over 512 MiB are cut into several keys.
* :class:`RedisBloomBackend` (``"redisbloom"``, :mod:`.redisbloom`): RedisBloom's
  ``BF.*`` (Redis 8, Redis Stack, valkey-bloom), created with the configured capacity
  and error rate.
* :class:`BackendChoice` (``"bloom"``, ``"auto"``, :mod:`.choice`): not a backend, the
  choice of one when the dupefilter opens (RedisBloom if the server has it, else the
  bitmap or the set; an existing filter is adopted).

:func:`backend_from_config` builds the one the crawl's config names (no I/O).

Every backend follows :class:`DupefilterBackend` (:mod:`.base`, with
:class:`FilterState`, :class:`DupefilterFull` and :func:`filter_error`); its filter
code runs inside the enqueue script (``lua/enqueue.lua``) and, for the dupefilter's
own calls, ``lua/dupefilter.lua``, both over ``lua/_filters.lua``. To add a backend:
a module here with a :class:`~.base.ScriptedBackend` subclass, its ``kind`` in
``lua/_filters.lua``'s ``filter_for``, its name in ``DUPEFILTER_BACKEND`` (validated by
:mod:`scrapy_dist.config.components`) and a branch in :func:`backend_from_config`.
"""

from scrapy_dist.filters.base import (
    DupefilterBackend,
    DupefilterFull,
    FilterState,
    UnopenedBackend,
    filter_error,
)
from scrapy_dist.filters.bitmap import BitmapBloomBackend
from scrapy_dist.filters.buckets import BucketsBackend, migrate_set
from scrapy_dist.filters.choice import (
    BackendChoice,
    backend_from_config,
    backend_from_settings,
    bloom_params_from_config,
)
from scrapy_dist.filters.exact import SetBackend, WindowSetBackend, migrate_to_window
from scrapy_dist.filters.redisbloom import RedisBloomBackend, has_redisbloom

__all__ = [
    "BackendChoice",
    "BitmapBloomBackend",
    "BucketsBackend",
    "DupefilterBackend",
    "DupefilterFull",
    "FilterState",
    "RedisBloomBackend",
    "SetBackend",
    "UnopenedBackend",
    "WindowSetBackend",
    "backend_from_config",
    "backend_from_settings",
    "bloom_params_from_config",
    "filter_error",
    "has_redisbloom",
    "migrate_set",
    "migrate_to_window",
]
