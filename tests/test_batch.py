"""Reserves sized by the engine's demand (scrapy_dist/worker/batch.py) and their
settings."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.worker.batch import AHEAD, WINDOW, BatchSize

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_batch_starts_at_the_floor_and_follows_the_engine_s_rate() -> None:
    clock = Clock()
    batch = BatchSize(8, 32, clock=clock)
    assert batch() == 8
    batch.took(30)
    clock.now += WINDOW / 2
    assert batch() == 8  # (measured over whole windows only)
    clock.now += WINDOW / 2
    # 30 requests a second: what the engine takes in AHEAD seconds
    assert batch() == math.ceil(30 * AHEAD) > 8
    batch.took(1000)
    clock.now += WINDOW
    assert batch() == 32  # the ceiling
    clock.now += WINDOW  # the engine took nothing: back to the floor
    assert batch() == 8


def test_a_floor_of_one_never_grows() -> None:
    clock = Clock()
    batch = BatchSize(1, 32, clock=clock)
    batch.took(1000)
    clock.now += WINDOW
    assert batch() == 1
    assert batch.ceiling == 1


def test_a_ceiling_under_the_floor_is_the_floor() -> None:
    assert BatchSize(8, 2).ceiling == 8


@pytest.mark.parametrize(
    ("settings", "prefetch", "prefetch_max", "max_held"),
    [
        ({}, 8, 32, 16 + 2 * 32),
        ({"SCHEDULER_PREFETCH": 4}, 4, 16, 16 + 2 * 16),
        ({"SCHEDULER_PREFETCH_MAX": 8}, 8, 8, 16 + 2 * 8),
        ({"SCHEDULER_PREFETCH": 1}, 1, 1, 16 + 2),
        ({"CONCURRENT_REQUESTS": 2}, 1, 1, 2 + 2),
        ({"CONCURRENT_REQUESTS": 64, "SCHEDULER_PREFETCH_MAX": 100}, 32, 100, 64 + 200),
    ],
    ids=["default", "prefetch", "fixed", "one", "low-concurrency", "max"],
)
def test_the_settings_give_the_batch_s_bounds_and_what_a_worker_holds(
    make_crawler: Callable[..., Crawler],
    settings: dict[str, Any],
    prefetch: int,
    prefetch_max: int,
    max_held: int,
) -> None:
    from scrapy_dist.assembly import assemble

    config = assemble(make_crawler(settings)).config.scheduler
    assert (config.prefetch, config.prefetch_max, config.max_held) == (
        prefetch,
        prefetch_max,
        max_held,
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"SCHEDULER_PREFETCH_MAX": -1}, "SCHEDULER_PREFETCH_MAX cannot be negative"),
        ({"SCHEDULER_PREFETCH_MAX": 4}, r"SCHEDULER_PREFETCH_MAX \(4\) cannot be lower"),
    ],
    ids=["negative", "under-the-floor"],
)
def test_a_ceiling_out_of_range_is_refused(
    make_crawler: Callable[..., Crawler], settings: dict[str, Any], message: str
) -> None:
    from scrapy_dist.assembly import assemble

    with pytest.raises(ConfigurationError, match=message):
        _ = assemble(make_crawler(settings)).config.scheduler
