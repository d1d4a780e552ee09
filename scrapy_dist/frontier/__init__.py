"""The worker's protocol with Redis: the shared frontier of one crawl.

The Scrapy-facing parts talk to one object, a ``gateway.CrawlFrontier``: a
``core.Frontier`` (a crawl on one set of keys) or a ``shards.ShardedFrontier`` (one
``core.Frontier`` per shard, composed). Below ``core``: ``trip`` (one flush, one
pipeline, each reply to its owner), ``outbox`` (writes batched into one pipeline per
flush), ``leases`` (what a worker holds), ``replication`` (waiting for replicas),
``progress`` (the crawl-wide reads), ``epoch`` (the crawl's generation), ``registry``
(the workers' heartbeats), ``background`` (the I/O thread), ``eviction`` (the server's
policy check), ``deletion``, ``events`` (what the frontier tells the rest of the
worker) and ``wire`` (the values shared with the Lua scripts). Above both ``core`` and
``shards``, ``choice`` builds the one a crawler gets.
"""
