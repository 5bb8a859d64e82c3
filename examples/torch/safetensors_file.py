"""safetensors files with halfstep's checksums, with PyTorch and NumPy only.

The format is an 8-byte header length, a JSON header, and the raw
little-endian bytes; halfstep adds a CRC-32C per tensor (over its name,
dtype, shape and bytes) and one over the rest of the metadata, under the
metadata key ``halfstep.checksums`` (``nn/checksum.ts``). :func:`read_safetensors`
reads in bounded steps and verifies them; :func:`write_safetensors` writes
them, atomically. A file that cannot be used raises :class:`RunFileError`,
whose message is one line.
"""

import contextlib
import json
import math
import os

import numpy as np
import torch

CHECKSUMS_KEY = "halfstep.checksums"
_MAX_HEADER = 100_000_000


class RunFileError(ValueError):
    """A run file that cannot be read or used; the message is one line, for the user."""


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli) of ``data``, going on from ``crc``: nn/checksum.ts's."""
    c, table = crc ^ 0xFFFFFFFF, _CRC_TABLE
    for b in bytes(data):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _json(value):
    """JSON as JavaScript's JSON.stringify writes it (what the checksums are over)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _tensor_checksum(name, dtype, shape, raw):
    return f"{crc32c(raw, crc32c(_json([name, dtype, list(shape)]))):08x}"


def _metadata_checksum(metadata):
    rest = sorted((k, v) for k, v in metadata.items() if k != CHECKSUMS_KEY)
    return f"{crc32c(_json([list(pair) for pair in rest])):08x}"


def _verify_checksums(path, stored, metadata):
    """Raises RunFileError naming the first damaged tensor (files without checksums pass)."""
    if CHECKSUMS_KEY not in metadata:
        return
    try:
        sums = json.loads(metadata[CHECKSUMS_KEY])
        assert isinstance(sums, dict)
    except (ValueError, AssertionError):
        raise RunFileError(f"{path}: its checksums are not readable (damaged file?)") from None
    if sums.get("__metadata__") != _metadata_checksum(metadata):
        raise RunFileError(f"{path}: the metadata was changed after saving (damaged or edited file?)")
    for name, (dtype, shape, raw) in stored.items():
        if sums.get(name) != _tensor_checksum(name, dtype, shape, raw):
            raise RunFileError(f"{path}: tensor {name!r} was changed after saving (damaged or edited file?)")

_NUMPY = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}
_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.int32: "I32", torch.bfloat16: "BF16"}


def _entry(path, name, info):
    """A header entry's (dtype, shape, start, end), or RunFileError naming the tensor."""
    try:
        dtype, shape, (start, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        sizes_ok = all(isinstance(n, int) and n >= 0 for n in (*shape, start, end))
    except (KeyError, TypeError, ValueError):
        sizes_ok = False
    if not sizes_ok or dtype not in (*_NUMPY, "BF16"):
        raise RunFileError(f"{path}: tensor {name!r} is truncated or malformed")
    width = 2 if dtype in ("BF16", "F16") else 8 if dtype == "I64" else 4
    if end - start != math.prod(shape) * width:
        raise RunFileError(f"{path}: tensor {name!r} is truncated or malformed")
    return dtype, shape, start, end


def read_safetensors(path):
    """Returns ({name: tensor}, {metadata key: string}) of a safetensors file, checksums verified.

    Raises RunFileError (one line) for a missing, truncated, damaged or malformed file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise RunFileError(f"{path}: {len(head)} bytes, not a safetensors file")
            length = int.from_bytes(head, "little")
            if length > _MAX_HEADER:
                raise RunFileError(f"{path}: its header length {length} is impossible (not a safetensors file?)")
            header_bytes = f.read(length)
            header = json.loads(header_bytes)
            if len(header_bytes) < length or not isinstance(header, dict):
                raise ValueError("short header")
            metadata = header.pop("__metadata__", {}) or {}
            if not isinstance(metadata, dict):
                raise ValueError("metadata")
            ends = [_entry(path, name, info)[3] for name, info in header.items()]
            data = f.read(max(ends, default=0))
    except RunFileError:
        raise
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such file") from None
    except OSError as e:
        raise RunFileError(f"{path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError, IndexError):
        raise RunFileError(f"{path}: its header is damaged (not a safetensors file?)") from None
    stored, tensors = {}, {}
    for name, info in header.items():
        dtype, shape, start, end = _entry(path, name, info)
        if end > len(data):
            raise RunFileError(f"{path}: tensor {name!r} is truncated or malformed")
        stored[name] = (dtype, shape, data[start:end])
    _verify_checksums(path, stored, metadata)
    for name, (dtype, shape, raw) in stored.items():
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            t = torch.from_numpy(bits.view(np.float32).copy()).to(torch.bfloat16)
        else:
            t = torch.from_numpy(np.frombuffer(raw, dtype=_NUMPY[dtype]).copy())
        tensors[name] = t.reshape(shape)
    return tensors, metadata


def write_safetensors(path, tensors, metadata):
    """Writes {name: tensor} and string metadata atomically (a temporary file, then a rename),
    with halfstep's checksums.

    int64 tensors (``num_batches_tracked``) are written as int32, the integer type halfstep has.
    A tensor of another dtype (float64, say) is a RunFileError, before anything is written. A
    symbolic link stays one: the file it names is replaced. On failure the temporary file is
    removed and a file already at ``path`` is left as it was.
    """
    entries, offset = {}, 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.int64:
            t = t.to(torch.int32)
        if t.dtype not in _NAMES:
            raise RunFileError(f"{name} is {t.dtype}; halfstep reads float32, float16, bfloat16 "
                               "and int32 (convert the model first, e.g. model.float())")
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        entries[name] = (_NAMES[t.dtype], list(t.shape), raw)
    metadata = {k: v for k, v in metadata.items() if k != CHECKSUMS_KEY}
    sums = {"__metadata__": _metadata_checksum(metadata)}
    sums.update({name: _tensor_checksum(name, *entry) for name, entry in entries.items()})
    header = {"__metadata__": dict(metadata, **{CHECKSUMS_KEY: json.dumps(sums, separators=(",", ":"))})}
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    target = os.path.realpath(path)  # through a symbolic link to the file it names
    temporary = f"{target}.tmp{os.getpid()}"
    try:
        with open(temporary, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for _, _, raw in entries.values():
                f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
