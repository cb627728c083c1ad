"""The one window-commit protocol (windows/commit.py) the Spark transform and the simulation both run: begin
deletes both commit keys, the caller writes its datasets, finish writes the commit last from the datasets'
own manifests; and the one "window is done" test the sensor and the simulation share."""
from __future__ import annotations

import pytest

from kcl_pipeline.windows.commit import begin_window, window_done
from kcl_pipeline.windows.manifest import (
    QUARANTINE,
    TRANSFORMED,
    CommitFormatError,
    DatasetManifest,
    WindowCommit,
    commit_key,
    pending_commit_key,
    read_commit,
    window_partition,
)
from kcl_pipeline.zone.errors import LandingError
from kcl_pipeline.zone.store import open_store

W = 60_000
T0 = 1_700_000_040_000 - 1_700_000_040_000 % W


@pytest.fixture
def output(tmp_path):
    store = open_store(str(tmp_path / "out"))
    store.ensure_zone(create=True)
    return store


def write_datasets(write, run: str = "run-2", rows: tuple[int, int] = (3, 1)) -> None:
    for name, n in zip((TRANSFORMED, QUARANTINE), rows, strict=True):
        write.output.put(write.manifest_key(name), DatasetManifest(run, run, (f"{run}/part-0.parquet",), n)
                         .to_json(window_partition(write.window_start_ms)))


def test_begin_withdraws_both_the_published_and_the_pending_commit(output):
    output.put(commit_key(T0), WindowCommit(T0, T0 + W, "run-1", frozenset({"a"})).to_json())
    output.put(pending_commit_key(T0), WindowCommit(T0, T0 + W, "run-1", frozenset({"a"})).to_json())
    begin_window(output, T0, T0 + W, publish=False)
    assert output.get_optional(commit_key(T0)) is None and output.get_optional(pending_commit_key(T0)) is None


@pytest.mark.parametrize("publish,key", [(False, pending_commit_key(T0)), (True, commit_key(T0))])
def test_finish_writes_the_commit_from_the_datasets_manifests(output, publish, key):
    write = begin_window(output, T0, T0 + W, publish=publish)
    write_datasets(write)
    commit = write.finish(["b2", "b1"])
    assert WindowCommit.from_json(output.get(key)) == commit
    assert commit.run_id == "run-2" and commit.batches == {"b1", "b2"}
    assert commit.dataset(TRANSFORMED) == DatasetManifest("run-2", "run-2", ("run-2/part-0.parquet",), 3)
    assert commit.dataset(QUARANTINE).rows == 1
    assert output.get_optional(commit_key(T0) if not publish else pending_commit_key(T0)) is None


def test_a_run_that_stops_before_finish_leaves_the_window_without_a_commit(output):
    output.put(commit_key(T0), WindowCommit(T0, T0 + W, "run-1", frozenset({"a"})).to_json())
    write = begin_window(output, T0, T0 + W, publish=True)
    write_datasets(write)  # datasets in place, no finish: the run died
    assert read_commit(output, T0) is None


def test_finish_without_a_dataset_manifest_writes_no_commit(output):
    write = begin_window(output, T0, T0 + W, publish=True)
    output.put(write.manifest_key(TRANSFORMED), DatasetManifest("r", "r", (), 0).to_json(window_partition(T0)))
    with pytest.raises(LandingError):  # the quarantine write never switched its manifest in
        write.finish(["b1"])
    assert read_commit(output, T0) is None


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"job_id": "r", "run": "r", "files": "one", "rows": 1}',
                                  b'{"job_id": "r", "run": "r", "files": []}'])
def test_finish_over_a_malformed_dataset_manifest_names_it_and_writes_no_commit(output, body):
    write = begin_window(output, T0, T0 + W, publish=True)
    write_datasets(write)
    output.put(write.manifest_key(QUARANTINE), body)
    with pytest.raises(CommitFormatError, match=f"quarantine/{window_partition(T0)}/_manifest.json"):
        write.finish(["b1"])
    assert read_commit(output, T0) is None


def test_a_commit_without_a_dataset_entry_is_a_format_error():
    with pytest.raises(CommitFormatError, match="no quarantine dataset"):
        WindowCommit(T0, T0 + W, "r", frozenset(), {TRANSFORMED: {}}).dataset(QUARANTINE)


def test_the_dataset_manifest_keeps_the_writers_own_fields_apart():
    """The Spark writer's `_manifest.json` carries more (the schema, the partition): the commit's entry is the
    four fields the audit and the checkpoint plan read."""
    raw = b'{"job_id": "j", "partition": "window=x", "run": "j", "files": ["f"], "rows": 2, "schema": [["a", "int"]]}'
    assert DatasetManifest.from_json(raw).entry() == {"job_id": "j", "run": "j", "files": ["f"], "rows": 2}


@pytest.mark.parametrize("commit,need,done", [
    (None, (), False),
    (WindowCommit(T0, T0 + W, "r", frozenset({"a"})), (), True),
    (WindowCommit(T0, T0 + W, "r", frozenset({"a"})), ("a",), True),
    (WindowCommit(T0, T0 + W, "r", frozenset({"a"})), ("a", "late"), False),  # a run before the late batch
])
def test_window_done(commit, need, done):
    assert window_done(commit, need) is done
