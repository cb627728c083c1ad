"""Reading a JSONL sink while its worker appends: the fleet tests poll the files a live consumer writes, and a
poll that met a line half-written failed with a JSONDecodeError (a multi-stream fleet test in CI)."""
from __future__ import annotations

import json

import pytest

from .fleet_support import json_lines


def test_a_line_being_appended_is_not_read_as_a_torn_record(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"stream": "s", "shard_id": "shardId-000')
    assert json_lines(path) == [{"a": 1}, {"b": 2}]
    path.write_text('{"a": 1}\n{"b": 2}')  # complete, its newline not written yet
    assert json_lines(path) == [{"a": 1}, {"b": 2}]
    assert json_lines(tmp_path / "none.jsonl") == []


def test_a_torn_line_before_the_last_is_an_error(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"a": 1}\n{"b": \n{"c": 3}\n')
    with pytest.raises(json.JSONDecodeError):
        json_lines(path)
