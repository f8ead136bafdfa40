"""A Hugging Face folder's weights: safetensors files, single or sharded with their index.

Reading parses each file's header (a little-endian u64 length, then JSON naming every
tensor's dtype, shape and byte range) and reads one tensor's bytes at a time, so an import holds
one tensor in memory; the ``safetensors`` package's NumPy reader cannot give bfloat16, the
dtype most published checkpoints use, so the bytes are read here (through ``ml_dtypes``'s
NumPy bfloat16). A header that does not parse, or a byte range past the end of its file (a
truncated download), is refused before any weight is used. Writing goes through
``safetensors`` itself, in shards of at most ``SHARD_BYTES`` with the index
(``model.safetensors.index.json``) that transformers reads.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from pax_core import UsageError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SHARD_BYTES = 2 * 1024**3
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
           "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
           "BOOL": np.bool_}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are: its file, dtype, shape and absolute byte offset."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    size: int


def _header(path: Path) -> dict[str, TensorInfo]:
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 * 1024**2:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as e:
        raise UsageError(f"{path} is not a readable safetensors file ({e}); download it "
                         f"again") from None
    start, file_size = 8 + length, path.stat().st_size
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        if entry["dtype"] not in _DTYPES:
            raise UsageError(f"{path}: tensor {name} has dtype {entry['dtype']}, which is not "
                             f"supported (supported: {', '.join(_DTYPES)})")
        if start + end > file_size:
            raise UsageError(f"{path} is truncated: tensor {name} ends at byte {start + end}, "
                             f"the file has {file_size}; download it again")
        tensors[name] = TensorInfo(path, entry["dtype"], tuple(entry["shape"]), start + begin,
                                   end - begin)
    return tensors


def list_tensors(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of the folder's safetensors weights (sharded by its index, or one file),
    from the headers alone."""
    index = folder / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(f"{index} does not read ({e}); download it again") from None
        files = sorted(set(weight_map.values()))
        missing = [name for name in files if not (folder / name).exists()]
        if missing:
            raise UsageError(f"{folder} lacks {missing[0]}, which {INDEX} names; download it")
    elif (folder / SINGLE).exists():
        files, weight_map = [SINGLE], None
    else:
        raise UsageError(f"{folder} has no {SINGLE} or {INDEX}; Pax imports safetensors "
                         f"weights (convert .bin weights with transformers first)")
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        tensors.update(_header(folder / name))
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise UsageError(f"{folder}: {INDEX} names {absent[0]}, which no file holds; "
                             f"download the weights again")
    return tensors


def read_tensor(info: TensorInfo) -> np.ndarray:
    """One tensor's values, read from its file."""
    dtype = np.dtype(_DTYPES[info.dtype])
    count = int(np.prod(info.shape)) if info.shape else 1
    if count * dtype.itemsize != info.size:
        raise UsageError(f"{info.file}: a tensor's byte range ({info.size} bytes) does not fit "
                         f"its shape {info.shape} and dtype {info.dtype}; download it again")
    values = np.fromfile(info.file, dtype=dtype, count=count, offset=info.offset)
    return values.reshape(info.shape)


def write_tensors(folder: Path, tensors: Iterator[tuple[str, np.ndarray]],
                  shard_bytes: int = SHARD_BYTES) -> list[str]:
    """Write ``tensors`` (arriving one at a time) into shards of at most ``shard_bytes`` and
    their index; returns the files written. A single shard is ``model.safetensors`` with no
    index, as transformers writes a small model."""
    from safetensors.numpy import save_file

    shards: list[dict[str, np.ndarray]] = [{}]
    weight_map: dict[int, list[str]] = {}
    total = held = 0
    for name, array in tensors:
        # A shard is written as soon as the next tensor would overflow it.
        if shards[-1] and held + array.nbytes > shard_bytes:
            _save_shard(folder, len(shards), shards[-1], save_file)
            shards[-1] = {}  # written: its arrays are let go
            shards.append({})
            held = 0
        shards[-1][name] = np.ascontiguousarray(array)
        weight_map.setdefault(len(shards), []).append(name)
        held += array.nbytes
        total += array.nbytes
    count = len(shards)
    if count == 1:
        save_file(shards[0], str(folder / SINGLE), metadata={"format": "pt"})
        return [SINGLE]
    _save_shard(folder, count, shards[-1], save_file)
    names = [_shard_name(i, count) for i in range(1, count + 1)]
    for i in range(1, count + 1):  # written under a provisional name: the count was unknown
        (folder / _shard_name(i, 0)).rename(folder / names[i - 1])
    index = {"metadata": {"total_size": total},
             "weight_map": {t: names[i - 1] for i, ts in weight_map.items() for t in ts}}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [*names, INDEX]


def _save_shard(folder: Path, number: int, shard: dict[str, np.ndarray], save_file) -> None:
    if shard:
        name = _shard_name(number, 0)
        save_file(shard, str(folder / name), metadata={"format": "pt"})


def _shard_name(number: int, count: int) -> str:
    return f"model-{number:05d}-of-{count:05d}.safetensors"
