"""The worker's protocol with Redis: the shared frontier of one crawl.

``core.Frontier`` is the one object the Scrapy-facing parts talk to. Below it:
``outbox`` (writes batched into one pipeline per flush), ``leases`` (what a worker holds),
``replication`` (waiting for replicas), ``shards`` (a frontier spread over several
servers), ``epoch`` (the crawl's generation), ``registry`` (the workers' heartbeats),
``background`` (the I/O thread), ``eviction`` (the server's policy check) and
``wire`` (the values shared with the Lua scripts). Above both ``core`` and ``shards``,
``choice`` builds the one a crawler gets.
"""
