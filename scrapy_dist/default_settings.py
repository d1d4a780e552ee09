"""Default values of every setting scrapy_dist reads.

Rules, as in Scrapy's own ``default_settings.py``: one setting per line, alphabetical
order, a ``#:`` comment each, no logic. The README documents each setting once; class
docstrings do not repeat them. Components read these through
:func:`scrapy_dist.settings.resolve`, so a project that sets nothing still gets them,
and :class:`scrapy_dist.addon.DistAddon` installs them at ``"addon"`` priority.
"""

#: Seconds a RedisSpider worker waits with nothing to do (no seeds, no queued or
#: in-flight requests) before it closes. ``0`` waits for seeds forever.
MAX_IDLE_TIME_BEFORE_CLOSE = 0

#: Host of the Redis server, when ``REDIS_URL`` is not used. ``None`` means localhost.
REDIS_HOST = None

#: Database number, when ``REDIS_URL`` is not used. ``None`` means 0.
REDIS_DB = None

#: Text encoding of seeds read from Redis.
REDIS_ENCODING = "utf-8"

#: Extra keyword arguments for the redis-py client (timeouts, password, ``ssl_*``...).
REDIS_PARAMS: dict[str, object] = {}

#: Port of the Redis server, when ``REDIS_URL`` is not used. ``None`` means 6379.
REDIS_PORT = None

#: Seeds taken from Redis in one call; ``None`` means ``CONCURRENT_REQUESTS``.
REDIS_START_URLS_BATCH_SIZE = None

#: Read seeds from a set (``SPOP``) instead of a list.
REDIS_START_URLS_AS_SET = False

#: Read seeds from a sorted set, highest score first, instead of a list.
REDIS_START_URLS_AS_ZSET = False

#: Template of the seeds key; ``%(name)s`` (or ``%(spider)s``) is the crawl name.
REDIS_START_URLS_KEY = "%(name)s:start_urls"

#: Redis URL (``redis://``, ``rediss://`` or ``unix://``). ``None`` means use
#: ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``, or ``redis://localhost:6379/0``.
REDIS_URL = None

#: Template of the dupefilter key.
SCHEDULER_DUPEFILTER_KEY = "%(spider)s:dupefilter"

#: Delete this crawl's queue and dupefilter when a worker opens, if no other worker
#: of the crawl is alive.
SCHEDULER_FLUSH_ON_START = False

#: Seconds between a worker's heartbeats in the worker registry.
SCHEDULER_HEARTBEAT_INTERVAL = 5.0

#: Seconds the scheduler keeps reporting pending work after the shared queue was last
#: seen non-empty (scrapy-redis's blocking-pop timeout, without blocking).
SCHEDULER_IDLE_BEFORE_CLOSE = 0

#: Literal job id inserted into every crawl key: ``<spider>:<job>:requests``.
SCHEDULER_JOB_ID = None

#: ``strftime`` pattern (UTC, evaluated once when the worker starts) inserted into
#: every crawl key, e.g. ``"%Y%m%d"``. Exclusive with ``SCHEDULER_JOB_ID``.
SCHEDULER_JOB_TIMESTAMP = None

#: Keep the queue and dupefilter when the crawl ends (otherwise the last worker to
#: leave deletes them).
SCHEDULER_PERSIST = False

#: Requests taken from Redis in one call and buffered by the worker.
SCHEDULER_PREFETCH = 1

#: Request queue class: ``scrapy_dist.queue.PriorityQueue``, ``FifoQueue`` or ``LifoQueue``.
SCHEDULER_QUEUE_CLASS = "scrapy_dist.queue.PriorityQueue"

#: Template of the request queue key.
SCHEDULER_QUEUE_KEY = "%(spider)s:requests"

#: Request serializer: ``"json"`` (default), ``"pickle"`` (unsafe with an untrusted
#: Redis), or an import path to an object with ``dumps``/``loads``.
SCHEDULER_SERIALIZER = "json"

#: Seconds without a heartbeat after which a worker counts as gone.
SCHEDULER_WORKER_TIMEOUT = 30.0
