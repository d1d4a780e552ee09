"""The values Python and the Lua scripts must agree on, defined once.

:func:`scrapy_dist.lua_source.source` writes each constant of :data:`LUA_CONSTANTS` into
every script where it names it, as a literal; Python imports it from here. The key
suffixes among them are :mod:`scrapy_dist.keys`'s, which spells every key name.
"""

from __future__ import annotations

from scrapy_dist.keys import (
    HOLDERS_SUFFIX,
    LEVEL_FORMAT,
    LEVEL_INFIX,
    LEVELS_MARKER,
    LEVELS_SUFFIX,
    SLOT_INFIX,
    SLOT_PROBE_SUFFIX,
    SLOTS_DELAYS_SUFFIX,
    SLOTS_MARKER,
    SLOTS_QUEUED_SUFFIX,
    SLOTS_READY_SUFFIX,
    SLOTS_REST_SUFFIX,
    SLOTS_WAIT_SUFFIX,
)

__all__ = [
    "DEAD_BECAUSE",
    "DEAD_NOW",
    "DONE",
    "ENTRY_ID_LEN",
    "EPOCH_REFUSAL",
    "FROM_QUEUE",
    "FROM_SEEDS",
    "HAND_BACK",
    "LUA_CONSTANTS",
    "NO_EPOCH",
    "SLOT_DELAY_MAX",
    "SLOT_WAIT_MAX",
    "WORKER_ID_PATTERN",
]

#: Length of the zero-padded decimal id that starts every queue entry
#: (``<id><payload>``, written by ``lua/enqueue.lua``; see :mod:`scrapy_dist.queue`).
ENTRY_ID_LEN = 16

# -- the outcome of a lease (lua/settle.lua) ----------------------------------------------

#: Outcome of a lease: Scrapy is done with it.
DONE = ""
#: Outcome of a lease: give it back untouched (not counted as a delivery).
HAND_BACK = "~"
#: Outcome prefix of a lease: dead-letter it now, with the JSON record that follows.
DEAD_NOW = "!"
#: Outcome prefix of a lease: dead-letter its entry now (as held in Redis), with the
#: reason that follows (a callback that raised, ``SCHEDULER_CALLBACK_ERRORS = "dead"``).
DEAD_BECAUSE = "#"

# -- the origin of a leased entry (lua/_leases.lua) ---------------------------------------

#: Origin of a leased entry: the request queue (its lease id is its entry id).
FROM_QUEUE = "q"
#: Origin of a leased entry: the seeds key (its lease id starts with this letter).
FROM_SEEDS = "s"

#: A Lua pattern that every worker id matches (``<host>:<pid>:<6 hex digits>``,
#: :func:`scrapy_dist.frontier.registry.new_worker_id`): what ``lua/_leases.lua`` takes for a
#: holding's worker when it rebuilds the holders zset (a key of a job named ``holders``,
#: ``<crawl>:holders:requests``, is not a holding).
WORKER_ID_PATTERN = "^[^:]*:%d+:%x%x%x%x%x%x$"

# -- the epoch fence (lua/_fence.lua, scrapy_dist.frontier.epoch) -------------------------

#: The first word of a script's refusal of a write for another epoch:
#: ``EPOCH <found> expected <joined>``.
EPOCH_REFUSAL = "EPOCH"
#: What that refusal names as found when the crawl has no epoch key.
NO_EPOCH = "none"

#: The longest delay (seconds) a queue per download slot gives a slot: a robots.txt
#: ``Crawl-delay`` (or a delay written by hand) asking for more is cut to it.
SLOT_DELAY_MAX = 300
#: The farthest ahead (seconds) a queue per download slot puts a slot's wait: a delay,
#: lengthened by its jitter, is at most twice :data:`SLOT_DELAY_MAX`; a longer pause is
#: looked at again after this long. A wait or rest further ahead was written by hand
#: (or is garbage) and ends at the next reserve: no slot waits forever.
SLOT_WAIT_MAX = 3600

#: The constants every script may name (written as values by
#: :func:`scrapy_dist.lua_source.inline_constants`).
LUA_CONSTANTS: dict[str, int | str] = {
    "ENTRY_ID_LEN": ENTRY_ID_LEN,
    "DONE": DONE,
    "HAND_BACK": HAND_BACK,
    "DEAD_NOW": DEAD_NOW,
    "DEAD_BECAUSE": DEAD_BECAUSE,
    "FROM_QUEUE": FROM_QUEUE,
    "FROM_SEEDS": FROM_SEEDS,
    "EPOCH_REFUSAL": EPOCH_REFUSAL,
    "NO_EPOCH": NO_EPOCH,
    "LEVELS_MARKER": LEVELS_MARKER,
    "LEVELS_SUFFIX": LEVELS_SUFFIX,
    "LEVEL_INFIX": LEVEL_INFIX,
    "LEVEL_FORMAT": LEVEL_FORMAT,
    "HOLDERS_SUFFIX": HOLDERS_SUFFIX,
    "WORKER_ID_PATTERN": WORKER_ID_PATTERN,
    "SLOT_PROBE_SUFFIX": SLOT_PROBE_SUFFIX,
    "SLOTS_MARKER": SLOTS_MARKER,
    "SLOT_DELAY_MAX": SLOT_DELAY_MAX,
    "SLOT_WAIT_MAX": SLOT_WAIT_MAX,
    "SLOT_INFIX": SLOT_INFIX,
    "SLOTS_READY_SUFFIX": SLOTS_READY_SUFFIX,
    "SLOTS_WAIT_SUFFIX": SLOTS_WAIT_SUFFIX,
    "SLOTS_REST_SUFFIX": SLOTS_REST_SUFFIX,
    "SLOTS_QUEUED_SUFFIX": SLOTS_QUEUED_SUFFIX,
    "SLOTS_DELAYS_SUFFIX": SLOTS_DELAYS_SUFFIX,
}
