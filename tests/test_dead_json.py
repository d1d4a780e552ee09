"""``scrapy-dist dead list --json``: one record per line, whatever the record holds."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from scrapy_dist import deadletter
from scrapy_dist.cli import main
from scrapy_dist.cli.dead import json_line

if TYPE_CHECKING:
    from pathlib import Path

    import pytest
    import redis


def test_line_separators_are_escaped() -> None:
    value = {"a": "x\u2028y\u2029z\x85é"}
    line = json_line(value)
    assert not any(c in line for c in "\u2028\u2029\x85")
    assert len(line.splitlines()) == 1
    assert "é" in line  # other text stays readable
    assert json.loads(line) == value


def test_dead_list_json_is_safe_json_lines(
    *,
    client: redis.Redis,
    name: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    dead = deadletter.DeadLetters(client, f"{name}:dead")
    dead.add(deadletter.SEED, "bad\u2028seed", "https://a.example/\u2029x")
    dead.add(deadletter.SEED, "plain", "https://a.example/y")
    assert main(["dead", "list", name, "--json", "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert "\u2028" not in out
    assert "\u2029" not in out
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["reason"] for r in records] == ["bad\u2028seed", "plain"]
    assert records[0]["data"] == "https://a.example/\u2029x"
