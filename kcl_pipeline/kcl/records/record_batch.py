"""A batch of deaggregated user records held as columns: what `kpl.deaggregate_batch` returns.

Building one Python object per user record costs more than verifying and parsing the aggregate
(benchmarks/bench_kpl.py). A `UserRecordBatch` keeps the columns instead: per user record the partition
key, explicit hash key and data; per *run* (the user records one Kinesis record delivered, in order) the
sequence number, arrival time, whether it was an aggregate, the first sub-sequence number and the count
(sub-sequence numbers within a run are consecutive). It is still an immutable `Sequence[UserRecord]`:
`len`, indexing, slicing and iteration behave like the list the worker and processors always had, and
build UserRecords only when asked (iteration builds them all once and keeps them, so identity is stable
from then on). `to_arrow` goes from the columns to the landing schema without any UserRecord.
"""
from __future__ import annotations

import dataclasses
import operator
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate, chain, count, repeat
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence, overload

from ..core.model import Checkpoint, UserRecord

if TYPE_CHECKING:
    import pyarrow as pa


@lru_cache(maxsize=1)
def arrow_schema() -> "pa.Schema":
    """The landing schema: the one declaration (zone/batch.py's SCHEMA and the transform's Spark view
    derive from it)."""
    import pyarrow as pa  # kcl/ works without pyarrow until someone asks for Arrow

    return pa.schema([
        pa.field("stream", pa.string(), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("sequence_number", pa.string(), nullable=False),
        pa.field("sub_sequence_number", pa.int64(), nullable=False),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("explicit_hash_key", pa.string(), nullable=True),
        pa.field("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
    ])


# --- building UserRecords fast ------------------------------------------------------------------
#
# UserRecord is a frozen dataclass: its generated __init__ goes through object.__setattr__ once per
# field (~1 µs a record, more than parsing the protobuf). Its instances are plain __dict__ objects,
# so we allocate them with object.__new__ and install a ready dict — the same state __init__ would
# produce (there is no __post_init__ and no default factory). If model.py ever changes shape
# (fields, slots, __post_init__) we fall back to the constructor; a test keeps the fast path honest.

_FIELDS = (
    "shard_id", "sequence_number", "sub_sequence_number", "partition_key", "explicit_hash_key",
    "approximate_arrival_timestamp_ms", "data", "aggregated",
)
_FAST = (
    tuple(f.name for f in dataclasses.fields(UserRecord)) == _FIELDS
    and not hasattr(UserRecord, "__post_init__")
    and not hasattr(UserRecord, "__slots__")
    and "__dict__" in vars(UserRecord)
)
_new = object.__new__
_set_dict = vars(UserRecord)["__dict__"].__set__ if _FAST else None


def _user_records(out: list, shard_id: str, seq: str, ms: int, aggregated: bool, first_sub: int,
                  pks: Sequence[str], ehks: Sequence[str | None] | None, datas: Sequence[bytes]) -> None:
    """Append the UserRecords of one run (pks/ehks/datas aligned, sub-sequence from `first_sub`; ehks None:
    no record has an explicit hash key)."""
    if not _FAST or _set_dict is None:
        out.extend(
            UserRecord(shard_id, seq, sub, pk, ehk, ms, data, aggregated)
            for sub, pk, ehk, data in zip(count(first_sub), pks, ehks or repeat(None), datas)
        )
        return
    base = {
        "shard_id": shard_id, "sequence_number": seq, "sub_sequence_number": 0, "partition_key": "",
        "explicit_hash_key": None, "approximate_arrival_timestamp_ms": ms, "data": b"",
        "aggregated": aggregated,
    }
    set_dict, copy = _set_dict, base.copy
    objs = list(map(_new, repeat(UserRecord, len(datas))))
    if ehks is None:
        for obj, sub, pk, data in zip(objs, count(first_sub), pks, datas):
            d = copy()
            d["sub_sequence_number"] = sub
            d["partition_key"] = pk
            d["data"] = data
            set_dict(obj, d)
    else:
        for obj, sub, pk, ehk, data in zip(objs, count(first_sub), pks, ehks, datas):
            d = copy()
            d["sub_sequence_number"] = sub
            d["partition_key"] = pk
            d["explicit_hash_key"] = ehk
            d["data"] = data
            set_dict(obj, d)
    out.extend(objs)


# --- the batch ------------------------------------------------------------------------------------

class UserRecordBatch(Sequence[UserRecord]):
    """User records of one shard, in shard order, as columns; equal to any list or tuple of the same
    UserRecords (so `batch == [UserRecord(...), ...]` reads as it did for lists).

    Per user record (length `len(batch)`): `partition_keys`, `explicit_hash_keys`, `data`.
    Per run (the user records of one Kinesis record, with consecutive sub-sequence numbers):
    `run_sequence_numbers`, `run_arrival_ms`, `run_aggregated`, `run_first_sub_sequence_numbers`,
    `run_lengths` (every run holds at least one record). Expanded to one value per user record on demand:
    `sequence_numbers`, `sub_sequence_numbers`, `arrival_ms`, `aggregated`.

    The batch never changes. The column properties hand out the batch's own lists (copying them would
    cost as much as building them): read them, never modify them.
    """

    __slots__ = ("_shard_id", "_seqs", "_ms", "_agg", "_first", "_lens", "_pks", "_ehks", "_data",
                 "_ends", "_records")

    def __init__(self, shard_id: str, run_sequence_numbers: Iterable[str], run_arrival_ms: Iterable[int],
                 run_aggregated: Iterable[bool], run_first_sub_sequence_numbers: Iterable[int],
                 run_lengths: Iterable[int], partition_keys: Iterable[str],
                 explicit_hash_keys: Iterable[str | None] | None, data: Iterable[bytes]) -> None:
        """Columns as described on the class (copied); `explicit_hash_keys` None: no record has one."""
        seqs, ms, agg = list(run_sequence_numbers), list(run_arrival_ms), list(run_aggregated)
        first, lens = list(run_first_sub_sequence_numbers), list(run_lengths)
        pks, data_ = list(partition_keys), list(data)
        ehks = None if explicit_hash_keys is None else list(explicit_hash_keys)
        runs, n = len(seqs), len(data_)
        if not len(ms) == len(agg) == len(first) == len(lens) == runs:
            raise ValueError(f"run columns differ in length: {runs} sequence numbers, {len(ms)} arrival times, "
                             f"{len(agg)} aggregated flags, {len(first)} first sub-sequence numbers, "
                             f"{len(lens)} lengths")
        if len(pks) != n or (ehks is not None and len(ehks) != n):
            raise ValueError(f"record columns differ in length: {len(pks)} partition keys, "
                             f"{n if ehks is None else len(ehks)} explicit hash keys, {n} data")
        if (runs and min(lens) < 1) or sum(lens) != n:
            raise ValueError(f"run lengths must be >= 1 and add up to the {n} records, got {lens[:10]}"
                             f"{'...' if runs > 10 else ''}")
        if runs and min(first) < 0:
            raise ValueError(f"sub-sequence numbers must be >= 0, got {min(first)}")
        self._init(shard_id, seqs, ms, agg, first, lens, pks, ehks, data_)

    def _init(self, shard_id: str, seqs: list, ms: list, agg: list, first: list, lens: list, pks: list,
              ehks: list | None, data: list) -> None:
        self._shard_id = shard_id
        self._seqs, self._ms, self._agg, self._first, self._lens = seqs, ms, agg, first, lens
        self._pks, self._ehks, self._data = pks, ehks, data
        self._ends: list[int] | None = None  # cumulative run lengths, built when first needed
        self._records: list[UserRecord] | None = None  # the UserRecords, once iterated

    @classmethod
    def _trusted(cls, shard_id: str, seqs: list, ms: list, agg: list, first: list, lens: list, pks: list,
                 ehks: list | None, data: list) -> "UserRecordBatch":
        """Adopt columns known consistent and owned by nobody else (the deaggregator's, our own cuts)."""
        self = object.__new__(cls)
        self._init(shard_id, seqs, ms, agg, first, lens, pks, ehks, data)
        return self

    @classmethod
    def empty(cls, shard_id: str) -> "UserRecordBatch":
        return cls._trusted(shard_id, [], [], [], [], [], [], None, [])

    @classmethod
    def from_records(cls, shard_id: str, records: Iterable[UserRecord]) -> "UserRecordBatch":
        """A batch of `records` (all of `shard_id`, any order); a record continues the previous one's run
        when it has the next sub-sequence number of the same Kinesis record."""
        seqs: list[str] = []
        ms: list[int] = []
        agg: list[bool] = []
        first: list[int] = []
        lens: list[int] = []
        pks: list[str] = []
        ehks: list[str | None] = []
        data: list[bytes] = []
        prev: UserRecord | None = None
        for r in records:
            if r.shard_id != shard_id:
                raise ValueError(f"a batch of {shard_id} cannot hold a record of {r.shard_id}")
            if (prev is not None and r.sequence_number == prev.sequence_number
                    and r.sub_sequence_number == prev.sub_sequence_number + 1
                    and r.approximate_arrival_timestamp_ms == prev.approximate_arrival_timestamp_ms
                    and r.aggregated == prev.aggregated):
                lens[-1] += 1
            else:
                seqs.append(r.sequence_number)
                ms.append(r.approximate_arrival_timestamp_ms)
                agg.append(r.aggregated)
                first.append(r.sub_sequence_number)
                lens.append(1)
            pks.append(r.partition_key)
            ehks.append(r.explicit_hash_key)
            data.append(r.data)
            prev = r
        return cls(shard_id, seqs, ms, agg, first, lens, pks, ehks if any(e is not None for e in ehks) else None,
                   data)

    @classmethod
    def concat(cls, batches: Iterable["UserRecordBatch"], shard_id: str | None = None) -> "UserRecordBatch":
        """The records of `batches`, in order, all of one shard (`shard_id` is needed only for no batches)."""
        batches = list(batches)
        for b in batches:
            if not isinstance(b, UserRecordBatch):
                raise TypeError(f"concat takes UserRecordBatch objects, got {type(b).__name__}")
        if shard_id is None:
            if not batches:
                raise ValueError("concat of no batches needs a shard_id")
            shard_id = batches[0].shard_id
        for b in batches:
            if b.shard_id != shard_id:
                raise ValueError(f"cannot concatenate a batch of {b.shard_id} to one of {shard_id}")
        if len(batches) == 1:
            return batches[0]

        def join(attr: str) -> list:
            return list(chain.from_iterable(getattr(b, attr) for b in batches))

        ehks = None
        if any(b._ehks is not None for b in batches):
            ehks = list(chain.from_iterable(b.explicit_hash_keys for b in batches))
        return cls._trusted(shard_id, join("_seqs"), join("_ms"), join("_agg"), join("_first"), join("_lens"),
                            join("_pks"), ehks, join("_data"))

    # -- columns ----------------------------------------------------------------------------------------

    @property
    def shard_id(self) -> str:
        return self._shard_id

    @property
    def partition_keys(self) -> Sequence[str]:
        return self._pks

    @property
    def explicit_hash_keys(self) -> Sequence[str | None]:
        return self._ehks if self._ehks is not None else [None] * len(self._data)

    @property
    def has_explicit_hash_keys(self) -> bool:
        """False when no record has one (the column is then all None)."""
        return self._ehks is not None and any(e is not None for e in self._ehks)

    @property
    def data(self) -> Sequence[bytes]:
        return self._data

    @property
    def run_sequence_numbers(self) -> Sequence[str]:
        return self._seqs

    @property
    def run_arrival_ms(self) -> Sequence[int]:
        return self._ms

    @property
    def run_aggregated(self) -> Sequence[bool]:
        return self._agg

    @property
    def run_first_sub_sequence_numbers(self) -> Sequence[int]:
        return self._first

    @property
    def run_lengths(self) -> Sequence[int]:
        return self._lens

    @property
    def sequence_numbers(self) -> list[str]:
        return list(chain.from_iterable(map(repeat, self._seqs, self._lens)))

    @property
    def sub_sequence_numbers(self) -> list[int]:
        return list(chain.from_iterable(map(range, self._first, map(int.__add__, self._first, self._lens))))

    @property
    def arrival_ms(self) -> list[int]:
        return list(chain.from_iterable(map(repeat, self._ms, self._lens)))

    @property
    def aggregated(self) -> list[bool]:
        return list(chain.from_iterable(map(repeat, self._agg, self._lens)))

    @property
    def last(self) -> Checkpoint | None:
        """The (sequence, sub-sequence) of the final record; None when the batch is empty."""
        if not self._seqs:
            return None
        return Checkpoint(self._seqs[-1], self._first[-1] + self._lens[-1] - 1)

    def _run_ends(self) -> list[int]:
        ends = self._ends
        if ends is None:
            ends = self._ends = list(accumulate(self._lens))
        return ends

    # -- Sequence[UserRecord] ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._data)

    @overload
    def __getitem__(self, index: int) -> UserRecord: ...

    @overload
    def __getitem__(self, index: slice) -> "UserRecordBatch": ...

    def __getitem__(self, index):
        """One UserRecord (built on demand), or a slice as a UserRecordBatch."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return self._cut(start, max(start, stop))
            return self._pick(range(start, stop, step))
        n = len(self._data)
        i = operator.index(index)  # TypeError for anything but an integer or a slice
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record index {index} out of range for a batch of {n}")
        if self._records is not None:
            return self._records[i]
        ends = self._run_ends()
        r = bisect_right(ends, i)
        ehk = self._ehks[i] if self._ehks is not None else None
        return UserRecord(self._shard_id, self._seqs[r], self._first[r] + i - (ends[r] - self._lens[r]),
                          self._pks[i], ehk, self._ms[r], self._data[i], self._agg[r])

    def _materialise(self) -> list[UserRecord]:
        records = self._records
        if records is None:
            records = []
            pks, ehks, data = self._pks, self._ehks, self._data
            i = 0
            for seq, ms, agg, first, n in zip(self._seqs, self._ms, self._agg, self._first, self._lens, strict=True):
                j = i + n
                _user_records(records, self._shard_id, seq, ms, agg, first, pks[i:j],
                              None if ehks is None else ehks[i:j], data[i:j])
                i = j
            self._records = records
        return records

    def __iter__(self) -> Iterator[UserRecord]:
        return iter(self._materialise())

    def __reversed__(self) -> Iterator[UserRecord]:
        return reversed(self._materialise())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UserRecordBatch):
            # Compare record by record in columns: run boundaries may differ (e.g. after concat).
            return (self._shard_id == other._shard_id and len(self) == len(other)
                    and self._data == other._data and self._pks == other._pks
                    and self.explicit_hash_keys == other.explicit_hash_keys
                    and self.sequence_numbers == other.sequence_numbers
                    and self.sub_sequence_numbers == other.sub_sequence_numbers
                    and self.arrival_ms == other.arrival_ms and self.aggregated == other.aggregated)
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and all(map(operator.eq, self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        if not self._seqs:
            return f"UserRecordBatch({self._shard_id}, empty)"
        return (f"UserRecordBatch({self._shard_id}, {len(self)} records of {len(self._seqs)} Kinesis records, "
                f"{self._seqs[0]}/{self._first[0]} .. {self.last})")

    def __reduce__(self) -> tuple:
        # Pickle the columns, never the built UserRecords.
        return (UserRecordBatch._trusted, (self._shard_id, self._seqs, self._ms, self._agg, self._first,
                                           self._lens, self._pks, self._ehks, self._data))

    # -- cutting ----------------------------------------------------------------------------------------

    def _cut(self, start: int, stop: int) -> "UserRecordBatch":
        """Records [start, stop) (0 <= start <= stop <= len)."""
        if start == 0 and stop == len(self):
            return self
        if start == stop:
            return UserRecordBatch.empty(self._shard_id)
        ends = self._run_ends()
        r0 = bisect_right(ends, start)
        r1 = bisect_right(ends, stop - 1) + 1  # past the run holding the last record kept
        first = self._first[r0:r1]
        lens = self._lens[r0:r1]
        head = start - (ends[r0] - self._lens[r0])  # records of the first run left out
        first[0] += head
        lens[0] -= head
        lens[-1] -= ends[r1 - 1] - stop
        ehks = self._ehks[start:stop] if self._ehks is not None else None
        return UserRecordBatch._trusted(
            self._shard_id, self._seqs[r0:r1], self._ms[r0:r1], self._agg[r0:r1], first, lens,
            self._pks[start:stop], ehks, self._data[start:stop])

    def _pick(self, indices: Iterable[int]) -> "UserRecordBatch":
        """The records at `indices` (valid, any order); a record continues the previous run when it is the
        next record of the same run."""
        ends = self._run_ends()
        seqs: list[str] = []
        ms: list[int] = []
        agg: list[bool] = []
        first: list[int] = []
        lens: list[int] = []
        picked: list[int] = []
        last_run, last_i = -1, -2
        for i in indices:
            r = bisect_right(ends, i)
            if r == last_run and i == last_i + 1:
                lens[-1] += 1
            else:
                seqs.append(self._seqs[r])
                ms.append(self._ms[r])
                agg.append(self._agg[r])
                first.append(self._first[r] + i - (ends[r] - self._lens[r]))
                lens.append(1)
            picked.append(i)
            last_run, last_i = r, i
        pks, ehks, data = self._pks, self._ehks, self._data
        return UserRecordBatch._trusted(
            self._shard_id, seqs, ms, agg, first, lens, [pks[i] for i in picked],
            None if ehks is None else [ehks[i] for i in picked], [data[i] for i in picked])

    def slice_after(self, after: Checkpoint | None) -> "UserRecordBatch":
        """The records strictly after `after` in (sequence, sub-sequence) order, each judged alone (the
        reader's resume filter). None or a starting sentinel keeps everything; nothing follows SHARD_END
        (ValueError)."""
        if after is None or after.is_starting_sentinel:
            return self
        if after.is_shard_end:
            raise ValueError(f"shard {self._shard_id}: nothing can be read after SHARD_END")
        after_key = (len(after.sequence_number), after.sequence_number)
        after_sub = after.sub_sequence_number
        keep: list[range] = []  # index ranges of the records kept, one per run
        start = 0
        for seq, first, n in zip(self._seqs, self._first, self._lens, strict=True):
            key = (len(seq), seq)
            if key > after_key:
                keep.append(range(start, start + n))
            elif key == after_key and first + n - 1 > after_sub:
                keep.append(range(start + max(0, after_sub + 1 - first), start + n))
            start += n
        if len(keep) == 1 or (keep and keep[-1].stop - keep[0].start == sum(map(len, keep))):
            return self._cut(keep[0].start, keep[-1].stop)  # contiguous (the usual case: a prefix dropped)
        return self._pick(chain.from_iterable(keep))

    # -- Arrow ------------------------------------------------------------------------------------------

    def to_arrow(self, stream: str, memory_pool: Any = None) -> "pa.Table":
        """The batch as a pyarrow Table in the landing schema (`arrow_schema()`), one row per user record.

        Run columns expand inside Arrow (each row takes its run's value), never through a Python object
        per row.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = arrow_schema()
        n = len(self)
        if not n:
            return schema.empty_table()
        pool = memory_pool
        string, int64 = pa.string(), pa.int64()
        seqs = pa.array(self._seqs, string, memory_pool=pool)
        arrivals = pa.array(self._ms, int64, memory_pool=pool)
        if len(self._seqs) == n:  # one record per run (plain records): nothing to expand
            subs = pa.array(self._first, int64, memory_pool=pool)
        else:
            ends = self._run_ends()
            starts = [0, *ends[:-1]]
            # Each row's run index: its parent in a list array whose lists are the runs.
            lists = pa.LargeListArray.from_arrays(pa.array([0, *ends], int64, memory_pool=pool),
                                                  pa.nulls(n, pa.null()), pool=pool)
            run_of_row = pc.list_parent_indices(lists, memory_pool=pool)
            seqs = pc.take(seqs, run_of_row, memory_pool=pool)
            arrivals = pc.take(arrivals, run_of_row, memory_pool=pool)
            # sub-sequence = row number - run start + run's first sub-sequence
            rows = pc.cumulative_sum(pa.repeat(pa.scalar(1, int64), n, memory_pool=pool), start=-1,
                                     memory_pool=pool)
            base = pa.array(list(map(int.__sub__, self._first, starts)), int64, memory_pool=pool)
            subs = pc.add(rows, pc.take(base, run_of_row, memory_pool=pool), memory_pool=pool)
        ehks = (pa.nulls(n, string, memory_pool=pool) if self._ehks is None
                else pa.array(self._ehks, string, memory_pool=pool))
        return pa.Table.from_arrays([
            pa.repeat(pa.scalar(stream, string), n, memory_pool=pool),
            pa.repeat(pa.scalar(self._shard_id, string), n, memory_pool=pool),
            seqs,
            subs,
            pa.array(self._pks, string, memory_pool=pool),
            ehks,
            arrivals.cast(pa.timestamp("ms", tz="UTC"), memory_pool=pool),
            pa.array(self._data, pa.binary(), memory_pool=pool),
        ], schema=schema)


class BatchBuilder:
    """The deaggregator's working columns (kpl._deaggregate_into fills them); `build()` hands them over.

    `ehks` stays None until a record with an explicit hash key arrives.
    """

    __slots__ = ("shard_id", "seqs", "ms", "agg", "first", "lens", "pks", "ehks", "data")

    def __init__(self, shard_id: str) -> None:
        self.shard_id = shard_id
        self.seqs: list[str] = []
        self.ms: list[int] = []
        self.agg: list[bool] = []
        self.first: list[int] = []
        self.lens: list[int] = []
        self.pks: list[str] = []
        self.ehks: list[str | None] | None = None
        self.data: list[bytes] = []

    def add_explicit_hash_keys(self, ehks: Iterable[str | None]) -> None:
        """Explicit hash keys for the records about to be added (call before extending `data`)."""
        if self.ehks is None:
            self.ehks = [None] * len(self.data)
        self.ehks.extend(ehks)

    def build(self) -> UserRecordBatch:
        """The batch (the builder must not be used afterwards: the batch owns the lists)."""
        return UserRecordBatch._trusted(self.shard_id, self.seqs, self.ms, self.agg, self.first, self.lens,
                                        self.pks, self.ehks, self.data)
