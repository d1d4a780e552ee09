"""Every scrapy_dist setting, read once, parsed and validated: one frozen config per crawler.

:class:`scrapy_dist.config.core.Config` is the one view components have of the settings;
every check of a setting's value raises its
:class:`~scrapy_dist.exceptions.ConfigurationError` in this package (its ``check_*``
functions also serve components built directly), and components receive plain values.
The modules, in the one direction they import each other: ``reading`` (the defaults,
import paths, final settings) <- ``params`` (redis-py's client options) <- ``topology``
(where Redis is: one server, a Cluster, Sentinel) <- ``scheduling`` and ``components``
(the sections and their checks) <- ``core`` (``Config``). Nothing here imports the rest
of the package but :mod:`scrapy_dist.exceptions` and :mod:`scrapy_dist.default_settings`.

What only another module can judge stays there: whether a class is a leasable queue
(:func:`scrapy_dist.queue.leasable_queue`), a serializer or request class imports
(:mod:`scrapy_dist.serializers`), a Bloom size is feasible (:mod:`scrapy_dist.dupefilter`),
a key template expands (:func:`scrapy_dist.keys.expand`), redis-py accepts the client
options (:mod:`scrapy_dist.connection`). :mod:`scrapy_dist.settings` re-exports the names
code imported from there before this package existed.
"""
