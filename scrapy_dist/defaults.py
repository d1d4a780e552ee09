"""scrapy-redis's ``defaults`` module, for code that imports its constants.

scrapy_dist's own defaults live in :mod:`scrapy_dist.default_settings` (one per
setting, applied to every crawler); this module only gives the names scrapy-redis code
reads, with the values scrapy_dist uses. ``REDIS_PARAMS`` is the client options
:func:`scrapy_dist.connection.get_redis_from_settings` starts from.
"""

from __future__ import annotations

from typing import Any

import redis

from scrapy_dist import default_settings as _settings
from scrapy_dist.config.params import DEFAULT_PARAMS

#: Key of the standalone dupefilter (Scrapy's own scheduler): one per run.
DUPEFILTER_KEY = "dupefilter:%(timestamp)s"

#: Template of the items list.
PIPELINE_KEY: str = _settings.REDIS_ITEMS_KEY

#: Template of the stats hash.
STATS_KEY = "%(spider)s:stats"

#: Client class :func:`scrapy_dist.connection.get_redis` builds by default.
REDIS_CLS = redis.Redis
#: Encoding of seeds read from Redis.
REDIS_ENCODING: str = _settings.REDIS_ENCODING
#: Client options used unless ``REDIS_PARAMS`` overrides them.
REDIS_PARAMS: dict[str, Any] = DEFAULT_PARAMS
#: Seeds read per batch when neither the spider nor the settings say.
REDIS_CONCURRENT_REQUESTS = 16

SCHEDULER_QUEUE_KEY: str = _settings.SCHEDULER_QUEUE_KEY
SCHEDULER_QUEUE_CLASS: str = _settings.SCHEDULER_QUEUE_CLASS
SCHEDULER_DUPEFILTER_KEY: str = _settings.SCHEDULER_DUPEFILTER_KEY
SCHEDULER_DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"
SCHEDULER_PERSIST: bool = _settings.SCHEDULER_PERSIST
START_URLS_KEY: str = _settings.REDIS_START_URLS_KEY
START_URLS_AS_SET: bool = _settings.REDIS_START_URLS_AS_SET
START_URLS_AS_ZSET: bool = _settings.REDIS_START_URLS_AS_ZSET
MAX_IDLE_TIME: float = _settings.MAX_IDLE_TIME_BEFORE_CLOSE
