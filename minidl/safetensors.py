"""Reading and writing the safetensors format, with NumPy arrays and nothing else.

A safetensors file is::

    u64 little-endian N | N bytes of UTF-8 JSON header | byte buffer

The header maps each tensor name to ``{"dtype": "F32", "shape": [...],
"data_offsets": [begin, end]}`` (offsets relative to the start of the byte
buffer) and may hold ``"__metadata__"``, a map of strings to strings.  The
tensors' bytes are little-endian, C order, and together cover the buffer
exactly, with neither gaps nor overlaps.

``save`` writes tensors with the larger item sizes first, each size in sorted-name
order, and the header padded with spaces to a multiple of 8 bytes, so every tensor
starts at a multiple of its item size in the file (as the reference writer does) and
the same input always gives the same bytes; it replaces the file atomically (a crash
leaves either the old file or the new one, never a mix).  ``load`` checks the whole
layout before it trusts any offset and raises :class:`SafetensorsError` naming the
file and the problem.
"""
import json
import math
import os
import sys
import tempfile
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

__all__ = ["SafetensorsError", "save", "load", "DTYPES"]

#: safetensors dtype name -> little-endian NumPy dtype.  BF16 and the FP8
#: types have no NumPy equivalent and are not supported.
DTYPES: Dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAME_OF = {(dt.kind, dt.itemsize): name for name, dt in DTYPES.items()}

_METADATA_KEY = "__metadata__"
# The reference implementation refuses headers above 100 MB; so do we, which
# also keeps a corrupt length from making us allocate gigabytes.
MAX_HEADER_BYTES = 100_000_000
# What NumPy can allocate: dimensions, and bytes counting a 0 dimension as 1
_MAX_DIMS = 64
_MAX_BYTES = 2**63 - 1


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file."""


def _dtype_name(arr: np.ndarray) -> Optional[str]:
    return _NAME_OF.get((arr.dtype.kind, arr.dtype.itemsize))


def _validate(tensors, metadata):
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of names to arrays, not {type(tensors).__name__}")
    for name, arr in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        if not name:
            raise ValueError("tensor names must be non-empty")
        if name == _METADATA_KEY:
            raise ValueError(f"{_METADATA_KEY!r} is reserved and cannot name a tensor")
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"tensor {name!r}: expected a numpy array, got {type(arr).__name__}")
        if _dtype_name(arr) is None:
            raise TypeError(f"tensor {name!r}: unsupported dtype {arr.dtype} "
                            f"(supported: {', '.join(sorted(DTYPES))})")
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping of str to str, not {type(metadata).__name__}")
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"metadata entries must be str -> str, got {key!r}: {value!r}")


def _header_bytes(tensors, metadata) -> Tuple[bytes, list]:
    """The padded header and the tensors, in file order, as little-endian C-ordered arrays."""
    header = {}
    if metadata:
        header[_METADATA_KEY] = {k: metadata[k] for k in sorted(metadata)}
    # (not ascontiguousarray: it turns 0-d arrays into 1-d ones)
    arrays = {name: np.asarray(arr, dtype=DTYPES[_dtype_name(arr)], order="C")
              for name, arr in tensors.items()}
    # item sizes are powers of two: the larger first keeps every offset aligned
    order = sorted(arrays, key=lambda k: (-arrays[k].itemsize, k))
    begin = dict(zip(order, np.cumsum([0] + [arrays[k].nbytes for k in order]).tolist()))
    for name in sorted(arrays):  # the header in name order
        arr = arrays[name]
        header[name] = {"dtype": _dtype_name(arr), "shape": list(arr.shape),
                        "data_offsets": [begin[name], begin[name] + arr.nbytes]}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return text, [arrays[k] for k in order]


def _write_arrays(f, header: bytes, arrays) -> None:
    f.write(len(header).to_bytes(8, "little"))
    f.write(header)
    for arr in arrays:
        if arr.nbytes:
            # a byte view of the array itself: no copy of large tensors
            f.write(memoryview(arr.reshape(-1).view(np.uint8)))


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no way to read it without setting it elsewhere
    os.umask(mask)
    return mask


def _fsync_dir(directory: str) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:
        return  # e.g. Windows: directories cannot be opened
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not support it on directories
    finally:
        os.close(fd)


def save(path, tensors: Mapping[str, np.ndarray], metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write ``tensors`` (and string ``metadata``) to ``path`` in safetensors format.

    The bytes depend only on the input: tensors by item size, largest first, then
    by name (each aligned to its item size), header keys in a fixed order (metadata
    keys sorted), header padded with spaces to a multiple of 8.
    Arrays of any byte order and memory layout are accepted and written
    little-endian in C order.

    The file is replaced atomically: the data goes to a uniquely named
    temporary file in the same directory, which is flushed, fsync'ed and
    renamed over ``path`` (and the directory fsync'ed where supported).  If
    anything fails, the temporary file is removed and an existing file at
    ``path`` is left as it was.

    Raises TypeError or ValueError (naming the tensor) for names that are not
    non-empty strings, values that are not NumPy arrays of a supported dtype,
    and metadata that is not str -> str.
    """
    _validate(tensors, metadata)
    path = os.fspath(path)
    header, arrays = _header_bytes(tensors, metadata)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp makes it 0600
            _write_arrays(f, header, arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fail(path, problem: str):
    raise SafetensorsError(f"{path}: {problem}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _no_duplicates(pairs):
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen.add(k)
    return dict(pairs)


class _Duplicate(Exception):
    pass


def _parse_header(path, raw: bytes):
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        _fail(path, f"key {e.args[0]!r} appears twice in the header")
    except UnicodeDecodeError as e:
        _fail(path, f"header is not valid UTF-8 ({e})")
    except ValueError as e:  # JSONDecodeError, or an integer of too many digits
        _fail(path, f"header is not valid JSON ({e})")
    except RecursionError:
        _fail(path, "header is not valid JSON (nested too deeply)")
    if not isinstance(header, dict):
        _fail(path, f"header must be a JSON object, not {type(header).__name__}")

    metadata = header.pop(_METADATA_KEY, None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        _fail(path, f"{_METADATA_KEY} must be an object of strings to strings")

    entries = []
    for name, info in header.items():
        if not name:
            _fail(path, "empty tensor name")
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            _fail(path, f"tensor {name!r}: entry must have exactly the keys dtype, shape, data_offsets")
        dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
            _fail(path, f"tensor {name!r}: unknown or unsupported dtype {dtype_name!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            _fail(path, f"tensor {name!r}: shape must be a list of non-negative integers, got {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) and o >= 0 for o in offsets)):
            _fail(path, f"tensor {name!r}: data_offsets must be two non-negative integers, "
                        f"got {offsets!r}")
        begin, end = offsets
        if begin > end:
            _fail(path, f"tensor {name!r}: data_offsets [{begin}, {end}] end before they begin")
        dtype = DTYPES[dtype_name]
        if len(shape) > _MAX_DIMS or math.prod(max(d, 1) for d in shape) * dtype.itemsize > _MAX_BYTES:
            _fail(path, f"tensor {name!r}: shape {shape} is larger than any array can be")
        want = math.prod(shape) * dtype.itemsize
        if end - begin != want:
            _fail(path, f"tensor {name!r}: shape {shape} of {dtype_name} needs {want} bytes "
                        f"but data_offsets [{begin}, {end}] hold {end - begin}")
        entries.append((begin, end, name, dtype, tuple(shape)))
    return entries, metadata


def _check_layout(path, entries, buffer_size: int) -> None:
    """The tensors must tile [0, buffer_size) exactly: no gap, no overlap, nothing past the end."""
    position, previous = 0, None
    for begin, end, name, _, _ in sorted(entries, key=lambda e: (e[0], e[1])):
        if end > buffer_size:
            _fail(path, f"tensor {name!r}: data_offsets [{begin}, {end}] out of range "
                        f"(the data buffer has {buffer_size} bytes)")
        if begin < position:
            _fail(path, f"tensor {name!r}: data_offsets [{begin}, {end}] overlap tensor "
                        f"{previous!r}, which ends at {position}")
        if begin > position:
            _fail(path, f"data buffer bytes [{position}, {begin}) belong to no tensor")
        position, previous = end, name
    if position != buffer_size:
        _fail(path, f"{buffer_size - position} trailing bytes after the last tensor "
                    f"(tensors end at {position}, the data buffer has {buffer_size} bytes)")


def load(path, tensors: bool = True) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Read a safetensors file: ``(tensors, metadata)`` (tensors=False: the header and
    the layout checked, no tensor read, ``({}, metadata)``).

    Every array is a fresh, writable, C-contiguous array of native byte order
    that shares memory with nothing.  The header and the layout are checked in
    full before any tensor is read; any problem raises SafetensorsError (a
    ValueError) whose message starts with the file name.  OSError (a missing
    file, say) passes through unchanged.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            _fail(path, f"file is {size} bytes, shorter than the 8-byte header length")
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            _fail(path, f"header length {n} runs past the end of the file ({size} bytes)")
        if n > MAX_HEADER_BYTES:
            _fail(path, f"header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
        raw = f.read(n)
        if len(raw) != n:
            _fail(path, "file shrank while being read")
        entries, metadata = _parse_header(path, raw)
        buffer_start = 8 + n
        _check_layout(path, entries, size - buffer_start)

        arrays = {}
        for begin, end, name, dtype, shape in entries if tensors else ():
            arr = np.empty(shape, dtype=dtype)
            if end > begin:
                f.seek(buffer_start + begin)
                got = f.readinto(memoryview(arr.reshape(-1).view(np.uint8)))
                if got != end - begin:
                    _fail(path, f"tensor {name!r}: file shrank while being read")
            if sys.byteorder == "big" and dtype.itemsize > 1:
                arr = arr.astype(dtype.newbyteorder("="))
            arrays[name] = arr
    return arrays, dict(metadata)
