"""A bit flipped inside a data page of a parquet file (not its footer), as a disk or a copy damages one."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow.parquet as pq


def flip_a_value_bit(path: Path, column: str) -> tuple[float, float]:
    """The low bit of the first value of int64 or double `column` flipped where its 8 bytes lie, in a
    page of that column's chunk; returns (value before, value after). The tables are small: a column's
    values lie verbatim in its pages (a dictionary page holds each distinct one; snappy leaves so few
    bytes uncompressed)."""
    table, meta = pq.read_table(path), pq.read_metadata(path)
    value = table.column(column)[0].as_py()
    packed = struct.pack("<d" if isinstance(value, float) else "<q", value)
    data = bytearray(path.read_bytes())
    chunk = meta.row_group(0).column(meta.schema.names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    at = data.find(packed, start, start + chunk.total_compressed_size)
    assert at >= 0, f"{column}'s first value is not verbatim in its pages of {path}"
    data[at] ^= 1
    path.write_bytes(bytes(data))
    return value, struct.unpack("<d" if isinstance(value, float) else "<q", data[at : at + 8])[0]
