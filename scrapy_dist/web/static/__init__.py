"""The page of ``scrapy-dist web`` (HTML, CSS and script), shipped as package data."""
