"""Default values of every setting scrapy_dist reads.

Rules, as in Scrapy's own ``default_settings.py``: one setting per line, alphabetical
order, a ``#:`` comment each, no logic. docs/settings.md lists each setting once; class
docstrings do not repeat them. :class:`scrapy_dist.config.core.Config` fills every unset
setting from here before it parses them, so a project that sets nothing still gets them,
and :class:`scrapy_dist.addon.DistAddon` installs them at ``"addon"`` priority.
"""

#: Size of a Bloom dupefilter as scrapy-redis-bloomfilter sets it: ``2**BLOOMFILTER_BIT``
#: bits (30 = 128 MiB). When set, it replaces ``BLOOM_CAPACITY``/``BLOOM_ERROR_RATE``, and
#: the capacity is the count at which ``BLOOMFILTER_HASH_NUMBER`` hashes are optimal.
BLOOMFILTER_BIT = None

#: Hash functions per fingerprint of a ``BLOOMFILTER_BIT`` filter.
BLOOMFILTER_HASH_NUMBER = 6

#: Fingerprints a Bloom dupefilter is sized for: up to this count its false-positive rate
#: stays within ``BLOOM_ERROR_RATE`` (memory: 1.8 bytes per fingerprint at 0.1%).
BLOOM_CAPACITY = 10_000_000

#: False-positive rate a Bloom dupefilter is sized for, at ``BLOOM_CAPACITY``: the share
#: of new pages skipped as if seen.
BLOOM_ERROR_RATE = 0.001

#: A Bloom dupefilter past its capacity: ``"grow"`` adds a filter of twice the capacity at
#: half the error rate (as RedisBloom does), with a warning; ``"refuse"`` fails requests
#: with new fingerprints (``DupefilterFull``) rather than let the error rate climb.
BLOOM_ON_FULL = "grow"

#: Close a worker once the crawl as a whole is finished (nothing queued, leased or
#: waiting as a seed, for ``CRAWL_DONE_GRACE`` seconds), so a batch crawl ends by itself.
CLOSE_WHEN_CRAWL_DONE = False

#: Seconds the whole crawl must stay empty before it counts as finished.
CRAWL_DONE_GRACE = 2.0

#: Where the dupefilter keeps fingerprints: ``"set"`` (exact, ~70 bytes each, as in
#: scrapy-redis), ``"bloom"`` (RedisBloom if the server has it, else a bitmap Bloom filter
#: in Lua), ``"bitmap"``, ``"redisbloom"``, ``"auto"`` (RedisBloom if the server has
#: it, else the set), or ``"buckets"`` (exact, ~25 bytes each at 10 million: many small
#: lists in Redis's compact encoding, sized by ``DUPEFILTER_CAPACITY``). With "bloom" or
#: "auto" a crawl keeps the kind it started with.
DUPEFILTER_BACKEND = "set"

#: Fingerprints the ``"buckets"`` backend sizes its bucket count for (``None``:
#: ``BLOOM_CAPACITY``). Past it the filter stays exact and compact; each test costs more
#: CPU (buckets get longer). Fixed by a crawl's first worker.
DUPEFILTER_CAPACITY = None

#: Keep a per-worker cache of fingerprints known to be in Redis, to skip serializing and
#: sending the links repeated on every page. ``None``: on; exact (a set of digests)
#: with the set backend, a Bloom filter with 1% of ``BLOOM_ERROR_RATE`` with Bloom
#: backends. ``False``: off.
DUPEFILTER_LOCAL_CACHE = None

#: Fingerprints the local cache holds before it starts over.
DUPEFILTER_LOCAL_CACHE_SIZE = 100_000

#: ``RFPDupeFilter`` under a scheduler other than scrapy_dist's (Scrapy's own): ``True``
#: keeps fingerprints in a per-run key ``dupefilter:<timestamp>:<random>`` deleted at close, as
#: scrapy-redis does; ``False`` uses the crawl's ``<spider>:dupefilter``, kept across runs.
DUPEFILTER_STANDALONE_PER_RUN = True

#: Seconds after which the dupefilter forgets everything, so a recurring crawl visits
#: pages again: its keys get this expiry when they are created, never extended.
#: ``None`` or ``0``: never.
DUPEFILTER_TTL = None

#: Seconds a fingerprint counts as seen (the recrawl window): a periodic crawl fetches
#: again exactly the pages first fetched longer ago, in bounded memory. Exact for
#: "set" (a zset of fingerprint -> time); the Bloom backends and "buckets" rotate
#: generations (seen for at least 7/8 of it, never longer). Needs ``SCHEDULER_PERSIST``
#: to survive between runs. ``None``: seen forever.
DUPEFILTER_RECRAWL_AFTER = None

#: Seconds a RedisSpider worker waits with nothing to do (no seeds, no queued or
#: in-flight requests) before it closes. ``0`` waits for seeds forever.
MAX_IDLE_TIME_BEFORE_CLOSE = 0

#: Serve Prometheus metrics of the crawl (queue depth, leased, dead, seeds, live workers,
#: pages and items per second, dupefilter size and Bloom fill) from each worker, with
#: the extension ``scrapy_dist.metrics.PrometheusMetrics`` in ``EXTENSIONS``.
METRICS_ENABLED = False

#: Address the metrics server listens on; ``"0.0.0.0"`` to let Prometheus reach it
#: from other hosts (in a Kubernetes pod, say).
METRICS_HOST = "127.0.0.1"

#: Seconds between reads of the crawl's state from Redis for the metrics (one round
#: trip each); a scrape serves the last read and never waits for Redis.
METRICS_INTERVAL = 5.0

#: TCP port of the metrics server (``GET /metrics``): a worker takes the first free one of
#: this and the next 15 (another worker on the host holds it), else any free port
#: (logged); ``0`` picks a free port at once.
METRICS_PORT = 9410

#: Host of the Redis server, when ``REDIS_URL`` is not used. ``None`` means localhost.
REDIS_HOST = None

#: Database number, when ``REDIS_URL`` is not used. ``None`` means 0.
REDIS_DB = None

#: Text encoding of seeds read from Redis.
REDIS_ENCODING = "utf-8"

#: What a worker does at open when Redis's ``maxmemory-policy`` may evict frontier keys
#: (``allkeys-*``): ``"refuse"`` to start, ``"warn"`` and run, or ``"off"`` (no check).
REDIS_EVICTION_POLICY_CHECK = "refuse"

#: Items the item pipeline sends to Redis in one ``RPUSH``; a batch is sent when it is
#: full or ``REDIS_ITEMS_FLUSH_INTERVAL`` seconds old, and at close.
REDIS_ITEMS_BATCH_SIZE = 100

#: Longest time, in seconds, an item waits in the item pipeline's buffer.
REDIS_ITEMS_FLUSH_INTERVAL = 1.0

#: Template of the items list ``scrapy_dist.pipelines.RedisPipeline`` appends to.
REDIS_ITEMS_KEY = "%(spider)s:items"

#: Keep at most this many items in the items list, dropping the oldest (``LTRIM``);
#: ``0`` keeps every item.
REDIS_ITEMS_MAXLEN = 0

#: Import path of a function ``item -> str`` (or bytes) that serializes items for
#: Redis; ``None`` uses Scrapy's ``ScrapyJSONEncoder`` (one JSON object per item).
REDIS_ITEMS_SERIALIZER = None

#: Unsent items from which the item pipeline makes Scrapy wait (back-pressure) until
#: Redis has taken some: bounds the pipeline's memory during a Redis outage.
REDIS_ITEMS_BUFFER_MAX = 10_000

#: Seconds closing the spider keeps retrying to store the last items while Redis fails;
#: what is left then is kept in ``REDIS_ITEMS_REJECTED_FILE``.
REDIS_ITEMS_CLOSE_TIMEOUT = 30.0

#: File (``%(key)s``: the items list, ``%(pid)s``: the worker's process id) where items
#: Redis refuses for good, or still refuses at close, are kept, one per line.
REDIS_ITEMS_REJECTED_FILE = "%(key)s.%(pid)s.rejected.jl"

#: Template of the Redis Stream ``scrapy_dist.pipelines.RedisStreamPipeline`` adds
#: items to (``XADD``); its dead-letter stream is ``<stream>:dead-letters``.
REDIS_ITEMS_STREAM_KEY = "%(spider)s:items:stream"

#: Cap the items stream near this many entries (``XADD MAXLEN ~``, oldest dropped, even
#: unread ones); ``0`` keeps every entry (the stream grows until trimmed: a warning says so).
REDIS_ITEMS_STREAM_MAXLEN = 0

#: Extra keyword arguments for the redis-py client (timeouts, password, ``ssl_*``...).
REDIS_PARAMS: dict[str, object] = {}

#: Port of the Redis server, when ``REDIS_URL`` is not used. ``None`` means 6379.
REDIS_PORT = None

#: Seeds taken from Redis in one call; ``None`` means ``CONCURRENT_REQUESTS``.
REDIS_START_URLS_BATCH_SIZE = None

#: Seeds that do not say ``"dont_filter"`` skip the dupefilter, as in scrapy-redis, so a
#: recurring crawl that pushes the same URLs again crawls them again (their fingerprints
#: are not recorded, as Scrapy records no ``dont_filter`` request: a page that requests
#: a seed's URL again crawls it once more). ``False``: seeds are filtered like any
#: request.
REDIS_START_URLS_DONT_FILTER = True

#: A JSON seed's fields other than scrapy_dist's (``url``, ``method``, ``meta``...)
#: are form data, as in scrapy-redis's ``{"url", "meta", "url_cookie_key": ...}``
#: (query string for its default GET). ``False``: such a seed is invalid (dead-lettered).
REDIS_START_URLS_EXTRA_FORMDATA = True

#: Read seeds from a set (``SPOP``) instead of a list.
REDIS_START_URLS_AS_SET = False

#: Read seeds from a sorted set, highest score first, instead of a list.
REDIS_START_URLS_AS_ZSET = False

#: Template of the seeds key; ``%(name)s`` (or ``%(spider)s``) is the crawl name.
REDIS_START_URLS_KEY = "%(name)s:start_urls"

#: Redis URL (``redis://``, ``rediss://`` or ``unix://``). ``None`` means use
#: ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``, or ``redis://localhost:6379/0``.
REDIS_URL = None

#: ``REDIS_URL`` set together with ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``: ``True``
#: connects to the URL and logs a warning (scrapy-redis's behaviour); ``False`` stops
#: at start-up with a ``ConfigurationError``.
REDIS_URL_PRECEDENCE = True

#: Replicas that must confirm a worker's new requests (Redis ``WAIT``) before it
#: acknowledges the request that produced them, so an acknowledged request survives a
#: failover. ``None``: 1 under Sentinel or Cluster when the master has a replica, else
#: off; ``0``: off. Fewer confirmations than asked is an outage: the requests and the
#: acknowledgements behind them are kept and retried, never skipped.
REDIS_WAIT_REPLICAS = None

#: Seconds one ``WAIT`` for ``REDIS_WAIT_REPLICAS`` may block the worker.
REDIS_WAIT_TIMEOUT = 1.0

# -- topology: Redis Cluster and Sentinel (scrapy_dist.connection) ---------------------

#: Redis Cluster: nodes to discover the cluster from, each ``"host:port"``,
#: ``(host, port)`` or ``{"host": ..., "port": ...}`` (a string may list several,
#: comma-separated). ``None``: no cluster (unless ``REDIS_URL`` is ``redis+cluster://``).
REDIS_STARTUP_NODES = None

#: The name scrapy-redis-cluster forks use for ``REDIS_STARTUP_NODES`` (set one of them).
REDIS_MASTER_NODES = None

#: Redis Cluster: keyword arguments of ``redis.cluster.RedisCluster`` (over
#: ``REDIS_PARAMS``, which also apply to each node's connections).
REDIS_CLUSTER_PARAMS: dict[str, object] = {}

#: Redis Sentinel: the Sentinels, each ``"host:port"``, ``(host, port)`` or a dict
#: (port 26379 when omitted). Needs ``REDIS_SENTINEL_PARAMS["service_name"]``.
REDIS_SENTINELS = None

#: Redis Sentinel: ``service_name`` (the master's name, required), options of the
#: master's connections (``password``, ``db``...: over ``REDIS_PARAMS``), and the
#: Sentinels' own authentication, ``sentinel_username``/``sentinel_password`` (or a whole
#: ``sentinel_kwargs`` dict).
REDIS_SENTINEL_PARAMS: dict[str, object] = {}

#: Wrap the crawl name in a Cluster hash tag (``{books}:requests``) so every key of a
#: crawl lives in one slot. ``None``: on under Redis Cluster, off otherwise.
REDIS_KEY_HASH_TAG = None

#: A request whose callback raised (``spider_error``): ``"done"`` acknowledges it, as
#: Scrapy's own scheduler does (Scrapy logs the error and counts it under
#: ``spider_exceptions/``); ``"retry"`` returns it to the queue with the error as its
#: reason, to be crawled again until ``SCHEDULER_MAX_DELIVERIES`` (its items are scraped
#: again each time); ``"dead"`` sends it to the dead-letter list at once, acknowledged,
#: with the error as its reason (``scrapy-dist dead requeue`` puts it back once the
#: spider is fixed). The requests and items it yielded before raising are kept in every
#: case; download errors, errbacks and expired leases are not affected.
SCHEDULER_CALLBACK_ERRORS = "done"

#: Template of the dupefilter key.
SCHEDULER_DUPEFILTER_KEY = "%(spider)s:dupefilter"

#: Exit status of a ``scrapy crawl`` worker that stopped because its crawl's frontier
#: vanished (close reason ``frontier_lost``); ``0`` leaves Scrapy's own status.
SCHEDULER_FAULT_EXIT_CODE = 3

#: Seconds requests and acknowledgements may wait to be sent to Redis together (they
#: also go with the next batch of requests taken); ``0`` sends each at once.
SCHEDULER_FLUSH_INTERVAL = 0.1

#: Send the timer's flushes (requests, acknowledgements, the top-up of the local buffer)
#: from an I/O thread, so the reactor goes on crawling during the round trip (see
#: benchmarks/README.md); ``False``: send them on the reactor thread, blocking it for
#: each round trip. A sharded crawl always sends them on the reactor.
SCHEDULER_BACKGROUND_FLUSH = True

#: Delete this crawl's queue and dupefilter when a worker opens, if no other worker
#: of the crawl is alive.
SCHEDULER_FLUSH_ON_START = False

#: Seconds between a worker's heartbeats in the worker registry.
SCHEDULER_HEARTBEAT_INTERVAL = 5.0

#: Seconds the scheduler keeps reporting pending work after the shared queue was last
#: seen non-empty (scrapy-redis's blocking-pop timeout, without blocking).
SCHEDULER_IDLE_BEFORE_CLOSE = 0

#: Seconds between an idle worker's looks for new work in Redis (seeds, requests
#: queued by other workers, expired leases): two round trips each.
SCHEDULER_IDLE_POLL = 0.5

#: After five minutes without work the pause between looks doubles up to this many
#: seconds.
SCHEDULER_IDLE_POLL_MAX = 5.0

#: Literal job id inserted into every crawl key: ``<spider>:<job>:requests``.
SCHEDULER_JOB_ID = None

#: ``strftime`` pattern (UTC, evaluated once when the worker starts, on the Redis
#: server's clock so all workers agree) inserted into every crawl key, e.g.
#: ``"%Y%m%d"``. Exclusive with ``SCHEDULER_JOB_ID``.
SCHEDULER_JOB_TIMESTAMP = None

#: Start requests of a spider that does not read seeds from Redis (Scrapy marks them
#: ``dont_filter``) are crawled once per crawl: by the first worker, which records them
#: as seen; workers joining a running crawl filter theirs. ``False``: every worker
#: crawls its start requests, as in scrapy-redis.
SCHEDULER_START_ONCE = True

#: Seconds a worker holds a request it took before it must renew the lease; a dead
#: worker's requests return to the queue this long after its last renewal.
SCHEDULER_LEASE_TIMEOUT = 120.0

#: Times one request (or seed) is handed to a worker before it goes to the dead-letter
#: list instead: a page whose callback always raises, or that kills its worker.
SCHEDULER_MAX_DELIVERIES = 3

#: Keep the queue and dupefilter when the crawl finishes (otherwise the worker that
#: sees it finished deletes them; a crawl that is stopped unfinished is always kept).
SCHEDULER_PERSIST = False

#: Cluster-wide politeness: apply ``DOWNLOAD_DELAY``, ``CONCURRENT_REQUESTS_PER_DOMAIN``,
#: ``DOWNLOAD_SLOTS`` (and robots.txt ``Crawl-delay``) to all workers of the crawl
#: together, per download slot, through Redis, instead of to each worker on its own.
SCHEDULER_POLITENESS = False

#: Seconds a politeness token (the right to one download from a slot) lasts past its
#: send time without renewal: a killed worker's tokens free their slot after this.
SCHEDULER_POLITENESS_TIMEOUT = 60.0

#: Requests leased from Redis in one call and buffered by the worker, at least; ``0``
#: means half of ``CONCURRENT_REQUESTS``. ``1`` leases one request when Scrapy asks for
#: one, never ahead (Scrapy's own order).
SCHEDULER_PREFETCH = 0

#: Requests leased in one call at most: a worker whose engine takes requests fast
#: leases what it takes in about half a second, up to this (fewer, larger script
#: calls); ``0`` means four times ``SCHEDULER_PREFETCH``. A worker holds at most
#: ``CONCURRENT_REQUESTS + 2 * SCHEDULER_PREFETCH_MAX`` leases, which bounds what a
#: killed worker leaves to fetch again. Set it to ``SCHEDULER_PREFETCH`` for batches of
#: a fixed size.
SCHEDULER_PREFETCH_MAX = 0

#: Seconds within which Scrapy's downloader must be able to start a leased request for
#: this worker to keep it: a request whose download slot would hold it longer (its
#: ``DOWNLOAD_DELAY`` since the slot's last send, and the requests queued before it)
#: goes back to the queue, where another worker can send it now; ``0`` keeps every
#: request leased. Not used with ``SCHEDULER_POLITENESS``.
SCHEDULER_START_HORIZON = 1.0

#: Count the requests of each download slot for the whole crawl: sent, pages, 4xx,
#: 5xx and failed (``<crawl>:slots:sent`` and ``<crawl>:slots:counts``, about once a
#: second per worker); ``status`` shows the busiest slots.
SCHEDULER_SLOT_COUNTS = True

#: Most requests the crawl starts (hands to a worker's engine) of one download slot
#: (its host, or ``meta["download_slot"]``); once reached, a worker drops the slot's
#: leased requests (``request_dropped``). The workers together may start a few more:
#: what the others started since they last wrote their counts, about four times a
#: second. ``0`` = no limit. Needs ``SCHEDULER_SLOT_COUNTS``.
SCHEDULER_SLOT_PAGE_LIMIT = 0

#: Most seconds a ``429`` or ``503`` response pauses its download slot for every worker
#: of the crawl: its ``Retry-After`` (seconds or a date), cut to this; ``0`` = no pauses.
#: Held by the start horizon, or by the shared gate with ``SCHEDULER_POLITENESS``.
SCHEDULER_SLOT_PAUSE_MAX = 300.0

#: ``429``/``503`` responses without ``Retry-After`` in a row, from one download slot at
#: one worker, that pause the slot for every worker; ``0`` = never.
SCHEDULER_SLOT_BACKOFF_AFTER = 5

#: Seconds the first such run pauses its slot, doubled for each run after it (up to
#: ``SCHEDULER_SLOT_PAUSE_MAX``); any other response of the slot starts over.
SCHEDULER_SLOT_BACKOFF = 10.0

#: Seconds a robots.txt one worker fetched serves the other workers of the crawl
#: (``scrapy_dist.robots.SharedRobotsTxt``, with ``ROBOTSTXT_OBEY``): each site's
#: robots.txt is fetched about once per crawl; ``0`` = each worker fetches its own.
ROBOTSTXT_SHARED_TTL = 86400.0

#: Request queue class: ``scrapy_dist.queue.PriorityQueue``, ``FifoQueue`` or ``LifoQueue``.
SCHEDULER_QUEUE_CLASS = "scrapy_dist.queue.PriorityQueue"

#: Template of the request queue key.
SCHEDULER_QUEUE_KEY = "%(spider)s:requests"

#: Import paths of request classes, besides Scrapy's own (``Request``, ``FormRequest``,
#: ``JsonRequest``, ``XmlRpcRequest``), that queue entries may be rebuilt as. A queue
#: entry naming any other class is dead-lettered; nothing it names is imported.
SCHEDULER_REQUEST_CLASSES: list[str] = []

#: Request serializer: ``"json"`` (default), ``"pickle"`` (unsafe with an untrusted
#: Redis), or an import path to an object with ``dumps``/``loads``.
#: ``"json"`` writes compact entries (defaults left out, short field names); ``"json-long"``
#: writes long field names, which workers older than the compact encoding read: use it
#: during a rolling upgrade, until every worker runs this version. Both read both forms.
SCHEDULER_SERIALIZER = "json"

#: Hash tags one crawl's queue, leases and dupefilter spread over, requests placed by
#: host (``1``: one tag, the usual keys); fixed for the life of the crawl.
SCHEDULER_SHARDS = 1

#: URL schemes a queue entry may use; an entry with another scheme (``file:``,
#: ``data:``, ``s3:``...) is dead-lettered, never fetched.
SCHEDULER_URL_SCHEMES = ["http", "https"]

#: Seconds without a heartbeat after which a worker counts as gone.
SCHEDULER_WORKER_TIMEOUT = 30.0

#: Seconds a request queue key of the wrong Redis type (an operator's mistake) is
#: waited for; requests still refused after that go to the dead-letter list.
SCHEDULER_WRONGTYPE_TIMEOUT = 300.0

#: ``meta`` keys a seed may carry although they change where or how a request connects
#: (``proxy``, ``bindaddress``, ``download_slot``..., see ``scrapy_dist.seeds.CONNECTION_META``)
#: or are private (``_...``). Empty: seeds with such keys are dead-lettered.
SEED_ALLOWED_META: list[str] = []

#: Seconds between the writes of a worker's stats to the crawl's shared stats hash by
#: ``scrapy_dist.stats.RedisStatsCollector`` (one round trip each, and one at close).
STATS_FLUSH_INTERVAL = 1.0

#: Seconds closing retries the last write of a worker's stats while Redis fails.
STATS_CLOSE_TIMEOUT = 10.0
