"""The server-side scripts, as package data (``*.lua``), read by :mod:`scrapy_dist.lua_source`."""
