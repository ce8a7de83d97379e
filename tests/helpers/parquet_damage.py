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


def flip_a_name_bit(path: Path, column: str) -> str:
    """The low bit of the last letter of `column`'s name flipped in the footer's schema (thrift: its
    length, then its letters), where no checksum looks; returns the name it now reads."""
    data = bytearray(path.read_bytes())
    footer = len(data) - 8 - struct.unpack("<I", data[-8:-4])[0]
    at = data.find(bytes([len(column)]) + column.encode(), footer)
    assert at >= 0, f"{column}'s name is not in the footer of {path}"
    data[at + len(column)] ^= 1
    path.write_bytes(bytes(data))
    return column[:-1] + chr(ord(column[-1]) ^ 1)


def flip_a_header_bit(path: Path) -> int:
    """The first bit 0, from the file's start, whose flip pyarrow's checksum-verified read passes and
    duckdb's read fails on (a page header's field pyarrow does not use: headers have no checksum);
    returns its offset."""
    import duckdb

    data = path.read_bytes()
    for at in range(4, len(data) - 8):
        path.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :])
        try:
            pq.read_table(path, page_checksum_verification=True)
        except Exception:  # noqa: BLE001 - caught by the checksums: not the flip sought
            continue
        try:
            duckdb.connect().execute("SELECT * FROM read_parquet(?)", [str(path)]).fetchall()
        except duckdb.Error:
            return at
    path.write_bytes(data)
    raise AssertionError(f"no flip of {path} passes pyarrow's check that duckdb fails on")
