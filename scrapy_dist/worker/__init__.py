"""The Scrapy-facing parts of one worker, assembled by ``scrapy_dist.scheduler``.

``deliveries`` (requests leased, handed to the engine and settled), ``enqueuer``
(requests scheduled on their way down), ``local`` (requests kept in memory),
``heartbeat``, ``membership`` (joining, leaving and closing), ``control`` (the crawl's
control state read and acted on), ``startup`` (failures at open) and ``engine`` (the
checked reads of Scrapy's engine).
"""
