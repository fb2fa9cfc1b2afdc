"""Rows to parquet splits, written whole or not at all: the one writer of every dataset grpo-lab makes (GSM8K, your
own pairs, the synthetic tasks), and the error a user's data raises."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from grpo_lab.facts import load_json_or


class DataError(Exception):
    """A problem with the input data that the user can fix; the message says how."""


def stamp_holds(folder: Path, stamp: str, settings: dict) -> bool:
    """Whether FOLDER/stamp records these settings: what is there was made by them (and is kept)."""
    return load_json_or(folder / stamp, None) == settings


def write_splits(rows_by_split: Mapping[str, list[dict]], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write {split: rows} to OUT/{split}.parquet; all files are complete before any is renamed into place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staged: dict[str, str] = {}
    try:
        for split, rows in rows_by_split.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{split}.parquet.", suffix=".tmp", dir=out_dir)
            os.close(fd)
            staged[split] = tmp
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        paths = {split: out_dir / f"{split}.parquet" for split in staged}
        for split, tmp in staged.items():
            os.replace(tmp, paths[split])
        return paths
    finally:
        for tmp in staged.values():
            Path(tmp).unlink(missing_ok=True)
