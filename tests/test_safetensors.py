"""minidl.safetensors: round trips, the exact byte layout, interoperability with
the reference implementation, rejection of corrupt files, and atomic saves."""
import glob
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import minidl
from minidl import safetensors as st
from minidl.safetensors import SafetensorsError

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(minidl.__file__)))

SHAPES = [(), (0,), (7,), (3, 4), (2, 0, 3), (2, 3, 4, 5)]


def _random(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def _listing(directory):
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(st.DTYPES))
def test_round_trip_each_dtype_and_shape(tmp_path, rng, name, shape):
    arr = _random(rng, st.DTYPES[name], shape)
    path = tmp_path / "t.safetensors"
    st.save(path, {"x": arr})
    out, meta = st.load(path)
    assert meta == {}
    assert list(out) == ["x"]
    assert out["x"].dtype == arr.dtype and out["x"].shape == shape
    np.testing.assert_array_equal(out["x"], arr)


def test_round_trip_many_tensors_and_metadata(tmp_path, rng):
    tensors = {
        "conv1.weight": _random(rng, np.float32, (16, 3, 3, 3)),
        "conv1.bias": _random(rng, np.float32, (16,)),
        "bn1.num_batches_tracked": np.array(12, np.int64),
        "step": np.array(3, np.int32),
        "mask": _random(rng, bool, (5, 5)),
        "bytes": _random(rng, np.uint8, (10,)),
        "double": _random(rng, np.float64, (2, 2)),
        "empty": np.zeros((0, 4), np.float32),
        "scalar": np.array(2.5, np.float32),
        "ünïcode name": np.arange(3, dtype=np.int16),
    }
    meta = {"format": "np", "epoch": "7", "note": "ü, \"quoted\", {braces}"}
    path = tmp_path / "ckpt.safetensors"
    st.save(path, tensors, meta)
    out, out_meta = st.load(str(path))
    assert out_meta == meta
    assert sorted(out) == sorted(tensors)
    for k, v in tensors.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
        np.testing.assert_array_equal(out[k], v)


def test_layouts_and_byte_orders_are_normalised(tmp_path, rng):
    base = _random(rng, np.float32, (4, 6))
    tensors = {
        "transposed": base.T,
        "strided": base[::2, 1::3],
        "fortran": np.asfortranarray(base),
        "big_endian": base.astype(">f4"),
        "big_endian_i64": np.arange(5, dtype=">i8"),
    }
    path = tmp_path / "t.safetensors"
    st.save(path, tensors)
    out, _ = st.load(path)
    for k, v in tensors.items():
        np.testing.assert_array_equal(out[k], v)
        assert out[k].dtype.isnative and out[k].flags.c_contiguous, k
    # the same values stored C-ordered little-endian give the same file
    st.save(tmp_path / "u.safetensors",
            {k: np.ascontiguousarray(v, v.dtype.newbyteorder("<")) for k, v in tensors.items()})
    assert (tmp_path / "u.safetensors").read_bytes() == path.read_bytes()


def test_loaded_arrays_are_independent_and_writable(tmp_path):
    path = tmp_path / "t.safetensors"
    st.save(path, {"a": np.arange(6, dtype=np.float32), "b": np.ones(3, np.int32)})
    out, _ = st.load(path)
    for arr in out.values():
        assert arr.flags.writeable and arr.flags.owndata
    out["a"][:] = -1
    np.testing.assert_array_equal(out["b"], 1)
    np.testing.assert_array_equal(st.load(path)[0]["a"], np.arange(6))


def test_bytes_are_deterministic(tmp_path, rng):
    a, b, c = (_random(rng, np.float32, (3, 5)), _random(rng, np.int64, (4,)),
               _random(rng, np.uint8, (2, 2)))
    st.save(tmp_path / "1", {"a": a, "b": b, "c": c}, {"x": "1", "y": "2"})
    st.save(tmp_path / "2", {"c": c, "a": a, "b": b}, {"y": "2", "x": "1"})
    first = (tmp_path / "1").read_bytes()
    assert (tmp_path / "2").read_bytes() == first
    n = struct.unpack("<Q", first[:8])[0]
    assert n % 8 == 0
    header = json.loads(first[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    assert names == ["a", "b", "c"]
    # the larger items first (b's), each tensor aligned to its item size, contiguous
    assert [header[k]["data_offsets"] for k in names] == [[32, 92], [0, 32], [92, 96]]
    assert len(first) == 8 + n + 96


def test_every_tensor_starts_at_a_multiple_of_its_item_size(tmp_path, rng):
    tensors = {"a": np.ones(3, bool), "b": _random(rng, np.float64, (3,)),
               "c": _random(rng, np.float16, (5,)), "d": _random(rng, np.int32, (1,)),
               "e": np.arange(7, dtype=np.uint8), "f": _random(rng, np.int64, (2,))}
    st.save(tmp_path / "m", tensors)
    raw = (tmp_path / "m").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    assert list(header) == sorted(tensors)
    for name, arr in tensors.items():
        begin = header[name]["data_offsets"][0]
        assert (8 + n + begin) % arr.itemsize == 0, name
    out, _ = st.load(tmp_path / "m")
    for name, arr in tensors.items():
        np.testing.assert_array_equal(out[name], arr)


def test_exact_bytes_of_a_small_file(tmp_path):
    st.save(tmp_path / "t", {"x": np.array([1.0, -2.0], np.float32)}, {"format": "np"})
    # '{"__metadata__":' 16 + '{"format":"np"}' 15 + ',' 1 + '"x":' 4
    # + '{"dtype":"F32",' 15 + '"shape":[2],' 12 + '"data_offsets":[0,8]' 20 + '}}' 2
    # = 85 bytes, padded with 3 spaces to 88 = 0x58
    expected = (b"\x58\x00\x00\x00\x00\x00\x00\x00"
                b'{"__metadata__":{"format":"np"},"x":{"dtype":"F32","shape":[2],'
                b'"data_offsets":[0,8]}}   '
                b"\x00\x00\x80\x3f"    # 1.0f
                b"\x00\x00\x00\xc0")   # -2.0f
    assert (tmp_path / "t").read_bytes() == expected


def test_empty_dict_and_no_metadata(tmp_path):
    st.save(tmp_path / "t", {})
    assert (tmp_path / "t").read_bytes() == b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "
    assert st.load(tmp_path / "t") == ({}, {})
    st.save(tmp_path / "u", {"x": np.zeros(1, np.uint8)}, {})
    assert b"__metadata__" not in (tmp_path / "u").read_bytes()


@pytest.mark.parametrize("tensors, metadata, exc, match", [
    ({1: np.zeros(1)}, None, TypeError, "names must be str"),
    ({"": np.zeros(1)}, None, ValueError, "non-empty"),
    ({"__metadata__": np.zeros(1)}, None, ValueError, "reserved"),
    ({"w": [1.0, 2.0]}, None, TypeError, "tensor 'w': expected a numpy array"),
    ({"w": np.float32(1.0)}, None, TypeError, "tensor 'w': expected a numpy array"),
    ({"ok": np.zeros(1), "z": np.zeros(2, np.complex64)}, None, TypeError,
     "tensor 'z': unsupported dtype complex64"),
    ({"o": np.array([None])}, None, TypeError, "tensor 'o': unsupported dtype object"),
    ({"s": np.array(["ab"])}, None, TypeError, "tensor 's': unsupported dtype"),
    ([("w", np.zeros(1))], None, TypeError, "mapping"),
    ({"w": np.zeros(1)}, {"epoch": 3}, TypeError, "metadata"),
    ({"w": np.zeros(1)}, {3: "x"}, TypeError, "metadata"),
    ({"w": np.zeros(1)}, "epoch=3", TypeError, "metadata"),
])
def test_save_rejects_bad_input_and_writes_nothing(tmp_path, tensors, metadata, exc, match):
    with pytest.raises(exc, match=match):
        st.save(tmp_path / "t", tensors, metadata)
    assert _listing(tmp_path) == []


# ---------------------------------------------------------------------------
# the reference implementation (optional)

def test_interop_with_the_safetensors_package(tmp_path, rng):
    stn = pytest.importorskip("safetensors.numpy")
    tensors = {
        "w": _random(rng, np.float32, (8, 3, 3, 3)),
        "b": _random(rng, np.float64, (8,)),
        "n": np.array(5, np.int64),
        "i": _random(rng, np.int32, (2, 3)),
        "m": _random(rng, bool, (4,)),
        "u": _random(rng, np.uint8, (3,)),
        "h": _random(rng, np.float16, (2, 2)),
        "e": np.zeros((0, 3), np.float32),
    }
    meta = {"framework": "minidl", "epoch": "2"}
    ours = tmp_path / "ours.safetensors"
    st.save(ours, tensors, meta)
    got = stn.load_file(str(ours))
    assert sorted(got) == sorted(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v)

    # theirs -> ours (their writer orders tensors by dtype, then name)
    theirs = tmp_path / "theirs.safetensors"
    stn.save_file(tensors, str(theirs), metadata=meta)
    got, got_meta = st.load(theirs)
    assert got_meta == meta
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v)


def test_same_bytes_as_the_safetensors_package(tmp_path, rng):
    """With one dtype and at most one metadata entry the two writers agree byte for byte."""
    stn = pytest.importorskip("safetensors.numpy")
    tensors = {k: _random(rng, np.float32, s)
               for k, s in [("conv.weight", (4, 3, 3, 3)), ("conv.bias", (4,)), ("fc", (10, 4))]}
    st.save(tmp_path / "ours", tensors, {"format": "np"})
    stn.save_file(tensors, str(tmp_path / "theirs"), metadata={"format": "np"})
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()


# ---------------------------------------------------------------------------
# corrupt files

def _file(header, data=b"", pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


GOOD = _file({"a": _entry("F32", [2], 0, 8), "b": _entry("I64", [1], 8, 16)}, bytes(16))

CORRUPT = {
    "empty file": (b"", "shorter than the 8-byte"),
    "7 bytes": (b"\x00" * 7, "shorter than the 8-byte"),
    "header length past the end": (struct.pack("<Q", 100) + b"{}", "runs past the end"),
    "huge header length": (struct.pack("<Q", 2 ** 63) + b"{}" + bytes(6), "runs past the end"),
    "truncated data": (GOOD[:-1], "out of range"),
    "bad JSON": (_file(b'{"a": {"dtype": "F32",'), "not valid JSON"),
    "not UTF-8": (_file(b'{"\xff": 1}'), "not valid UTF-8"),
    "JSON not an object": (_file(b"[1, 2]"), "must be a JSON object"),
    "duplicate name": (_file(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                             b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)),
                       "appears twice"),
    "unknown dtype": (_file({"a": _entry("F33", [2], 0, 8)}, bytes(8)), "unknown or unsupported dtype"),
    "bf16": (_file({"a": _entry("BF16", [2], 0, 4)}, bytes(4)), "unknown or unsupported dtype"),
    "missing key": (_file({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "exactly the keys"),
    "extra key": (_file({"a": dict(_entry("F32", [2], 0, 8), x=1)}, bytes(8)), "exactly the keys"),
    "negative dim": (_file({"a": _entry("F32", [-2], 0, 8)}, bytes(8)), "non-negative integers"),
    "float dim": (_file({"a": _entry("F32", [2.0], 0, 8)}, bytes(8)), "non-negative integers"),
    "three offsets": (_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}},
                            bytes(8)), "two non-negative integers"),
    "negative offset": (_file({"a": _entry("U8", [0], -1, -1)}), "two non-negative integers"),
    "offsets reversed": (_file({"a": _entry("U8", [0], 8, 0)}, bytes(8)), "end before they begin"),
    "shape/offsets mismatch": (_file({"a": _entry("F32", [3], 0, 8)}, bytes(8)),
                               "needs 12 bytes but data_offsets"),
    "overlap": (_file({"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 4, 12)}, bytes(12)),
                "overlap tensor 'a'"),
    "same offsets twice": (_file({"a": _entry("F32", [1], 0, 4), "b": _entry("F32", [1], 0, 4)},
                                 bytes(4)), "overlap"),
    "out of range": (_file({"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 8, 16)}, bytes(12)),
                     "out of range"),
    "gap": (_file({"a": _entry("F32", [1], 0, 4), "b": _entry("F32", [1], 8, 12)}, bytes(12)),
            "belong to no tensor"),
    "gap at the start": (_file({"a": _entry("F32", [1], 4, 8)}, bytes(8)), "belong to no tensor"),
    "trailing bytes": (GOOD + b"\x00", "1 trailing bytes"),
    "data but no tensors": (_file({}, bytes(4)), "4 trailing bytes"),
    "metadata not strings": (_file({"__metadata__": {"epoch": 3}}), "__metadata__ must be"),
    "metadata not an object": (_file({"__metadata__": ["x"]}), "__metadata__ must be"),
    "entry not an object": (_file({"a": [0, 8]}, bytes(8)), "exactly the keys"),
    "dtype not a string": (_file({"a": _entry(["F32"], [2], 0, 8)}, bytes(8)),
                           "unknown or unsupported dtype"),
    "JSON nested too deeply": (_file(b"[" * 100000 + b"]" * 100000), "not valid JSON"),
    "integer of 5000 digits": (_file(b'{"a": ' + b"9" * 5000 + b"}"), "not valid JSON"),
    "empty with a huge dim": (_file({"a": _entry("F32", [0, 2 ** 63], 0, 0)}), "larger than any array"),
    "empty with huge dims": (_file({"a": _entry("F32", [0, 2 ** 62, 2 ** 62], 0, 0)}),
                             "larger than any array"),
    "65 dims": (_file({"a": _entry("F32", [1] * 65, 0, 4)}, bytes(4)), "larger than any array"),
}


def test_good_file_of_the_corruption_cases_loads(tmp_path):
    (tmp_path / "good.safetensors").write_bytes(GOOD)
    out, meta = st.load(tmp_path / "good.safetensors")
    assert out["a"].shape == (2,) and out["b"].dtype == np.int64 and meta == {}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_raises_naming_file_and_problem(tmp_path, case):
    content, problem = CORRUPT[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorsError) as info:
        st.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert problem in message, message
    assert isinstance(info.value, ValueError)


def test_duplicate_names_are_found_in_linear_time(tmp_path):
    """200,000 metadata keys with one repeated at the end: found at once (a quadratic
    search took minutes)"""
    n = 200_000
    keys = ",".join(f'"k{i}":"v"' for i in range(n)) + f',"k{n - 1}":"v"'
    path = tmp_path / "dup.safetensors"
    path.write_bytes(_file(('{"__metadata__":{' + keys + "}}").encode()))
    start = time.perf_counter()
    with pytest.raises(SafetensorsError, match=f"'k{n - 1}' appears twice"):
        st.load(path)
    assert time.perf_counter() - start < 5


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        st.load(tmp_path / "nope.safetensors")


# ---------------------------------------------------------------------------
# atomic replacement

@pytest.fixture
def old_checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    st.save(path, {"w": np.arange(10, dtype=np.float32)}, {"epoch": "1"})
    return path, path.read_bytes()


def test_save_replaces_an_existing_file(old_checkpoint):
    path, _ = old_checkpoint
    st.save(path, {"w": np.ones(3, np.float64)}, {"epoch": "2"})
    out, meta = st.load(path)
    assert meta == {"epoch": "2"} and out["w"].dtype == np.float64
    assert _listing(path.parent) == [path.name]


def test_new_file_gets_the_default_permissions(tmp_path):
    umask = os.umask(0o027)
    try:
        st.save(tmp_path / "t", {"w": np.zeros(1)})
    finally:
        os.umask(umask)
    assert (tmp_path / "t").stat().st_mode & 0o777 == 0o640


def test_failing_fsync_leaves_old_file_and_no_temp(old_checkpoint, monkeypatch):
    path, before = old_checkpoint

    def broken_fsync(fd):
        raise OSError(5, "simulated I/O error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="simulated I/O error"):
        st.save(path, {"w": np.zeros(1000, np.float32)})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _listing(path.parent) == [path.name]


class _FailingFile:
    """Passes writes through to the real file until `limit` bytes, then fails."""

    def __init__(self, f, limit, exc):
        self._f, self._left, self._exc = f, limit, exc

    def write(self, data):
        n = memoryview(data).nbytes
        if n > self._left:
            self._f.write(memoryview(data).cast("B")[:self._left])
            raise self._exc
        self._left -= n
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk full", "interrupt"])
def test_failure_midway_through_the_data_leaves_old_file(old_checkpoint, monkeypatch, exc):
    path, before = old_checkpoint
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: _FailingFile(real_fdopen(*a, **k), 5000, exc))
    with pytest.raises(type(exc)):
        st.save(path, {"a": np.zeros(1000, np.float32), "b": np.ones(1000, np.float32)})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _listing(path.parent) == [path.name]


def test_failing_replace_without_an_old_file_leaves_nothing(tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise PermissionError(13, "simulated")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(PermissionError):
        st.save(tmp_path / "new.safetensors", {"w": np.zeros(4)})
    monkeypatch.undo()
    assert _listing(tmp_path) == []


def test_process_killed_while_saving_leaves_a_whole_checkpoint(old_checkpoint):
    """SIGKILL a process in the middle of saving ~200 MB: the file at the path is
    still a complete checkpoint (the old one, or at worst the whole new one)."""
    path, before = old_checkpoint
    child = textwrap.dedent(f"""
        import sys
        import numpy as np
        from minidl import safetensors as st
        tensors = {{f"layer{{i}}.weight": np.full((1000, 5000), i, np.float32) for i in range(10)}}
        print("saving", flush=True)
        st.save({str(path)!r}, tensors, {{"epoch": "2"}})
        print("saved", flush=True)
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"saving\n"
        # kill once the temporary file has started to fill (or after a short delay)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            temps = glob.glob(os.path.join(path.parent, f".{path.name}.*.tmp"))
            if temps and os.path.getsize(temps[0]) > 0:
                break
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    tensors, meta = st.load(path)
    if meta == {"epoch": "1"}:
        assert path.read_bytes() == before
    else:  # the save finished before the kill arrived: then the new file is whole
        assert meta == {"epoch": "2"} and len(tensors) == 10
        np.testing.assert_array_equal(tensors["layer9.weight"], 9)
