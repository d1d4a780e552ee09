-- Count the leases held in a crawl (or one shard): every holder's holding, and the
-- previous version's leases (lua/_leases.lua). Read only, unfenced: for status.
--
-- KEYS[1] = holders zset (worker id -> deadline of its leases)
-- KEYS[2] = the previous version's leases zset
-- Returns: the number of leases
-- uses: _leases

return leased_count(KEYS[1], KEYS[2])
