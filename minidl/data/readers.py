"""Readers for CIFAR-10, MNIST and Fashion-MNIST in their official file layouts.

Every reader returns ``(images, labels)``: images uint8 of shape (N, C, H, W),
labels int64 of shape (N,).  A file that is truncated or corrupt raises
:class:`DatasetError` naming the file and what is wrong with it.

Where the files are looked for, under a data root ``ROOT`` (:func:`data_root`):

- CIFAR-10: the first complete one of ``ROOT/cifar-10-batches-bin/``,
  ``ROOT/cifar10/cifar-10-batches-bin/``, ``ROOT/cifar-10-batches-py/``,
  ``ROOT/cifar10/cifar-10-batches-py/`` (the binary layout is preferred);
  failing that, the archive ``ROOT/cifar-10-binary.tar.gz`` is extracted,
  and failing that it is downloaded into ``ROOT`` first.
- MNIST: ``ROOT/mnist/``; Fashion-MNIST: ``ROOT/fashion-mnist/``, then
  ``/usr/share/datasets/fashion-mnist/`` (where Debian's ``dataset-fashion-mnist``
  package installs it).  The idx files may be gzipped or not; missing ones are
  downloaded into the first of those directories.

Downloads are checked against the published MD5 sums and written to a temporary
file that is renamed into place only when the sum matches.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import math
import os
import pickle
import shutil
import struct
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional, Sequence, Tuple, Union

import numpy as np

PathLike = Union[str, "os.PathLike[str]"]
Arrays = Tuple[np.ndarray, np.ndarray]


class DatasetError(ValueError):
    """A data set is missing, truncated or corrupt; the message names the file."""


@dataclass(frozen=True)
class DatasetInfo:
    """Metadata of a data set: class names, image shape (channels, (H, W)), and
    the per-channel mean and std of the training images on the 0..1 scale."""
    classes: Tuple[str, ...]
    channels: int
    size: Tuple[int, int]
    mean: Tuple[float, ...]
    std: Tuple[float, ...]


DATASETS = {
    "cifar10": DatasetInfo(
        ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
         "truck"), 3, (32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "fashion-mnist": DatasetInfo(
        ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
         "Bag", "Ankle boot"), 1, (28, 28), (0.2860,), (0.3530,)),
    "mnist": DatasetInfo(tuple(str(d) for d in range(10)), 1, (28, 28), (0.1307,), (0.3081,)),
}


def data_root(explicit: Optional[PathLike] = None) -> Path:
    """The data directory: ``explicit`` (the command line's ``--data``) if given,
    else the environment variable ``MINIDL_DATA``, else ``~/.cache/minidl``."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("MINIDL_DATA"):
        return Path(os.environ["MINIDL_DATA"]).expanduser()
    return Path.home() / ".cache" / "minidl"


# ---- downloads ------------------------------------------------------------------------

@dataclass(frozen=True)
class Remote:
    """A file to download: mirror URLs (tried in order), its MD5 and size in bytes."""
    urls: Tuple[str, ...]
    md5: str
    size: Optional[int] = None


CIFAR10_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR10_REMOTE = Remote(("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
                        "c32a1d4ab5d03f1284b67883e8d87530", 170052171)
_MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                  "http://yann.lecun.com/exdb/mnist/")
_FASHION_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/"
                    "data/fashion/")


def _remotes(mirrors, md5s):
    return {name: Remote(tuple(m + name for m in mirrors), md5) for name, md5 in md5s}


IDX_REMOTES = {
    "mnist": _remotes(_MNIST_MIRRORS, [
        ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
        ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c")]),
    "fashion-mnist": _remotes(_FASHION_MIRRORS, [
        ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
        ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310")]),
}
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

_urlopen = urllib.request.urlopen   # the tests replace it: they never touch the network


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(remote: Remote, dest: Path) -> None:
    """Fetch ``remote`` to ``dest`` with a progress bar: into a temporary file in
    dest's directory, renamed to ``dest`` once its MD5 matches.  Raises
    DatasetError (leaving no partial file) when every mirror fails."""
    from tqdm import tqdm

    created = not dest.parent.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for url in remote.urls:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        try:
            digest = hashlib.md5()
            with os.fdopen(fd, "wb") as out, _urlopen(url, timeout=60) as response:
                total = int(response.headers.get("Content-Length") or 0) or remote.size
                with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                          desc=dest.name, disable=None) as bar:
                    for chunk in iter(lambda: response.read(1 << 20), b""):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            if digest.hexdigest() != remote.md5:
                raise DatasetError(f"checksum mismatch (md5 {digest.hexdigest()}, "
                                   f"expected {remote.md5})")
            os.replace(tmp, dest)
            return
        except (OSError, http.client.HTTPException, DatasetError) as e:
            errors.append(f"{url}: {e}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if created and not any(dest.parent.iterdir()):
        dest.parent.rmdir()
    raise DatasetError("download failed: " + "; ".join(errors))


def extract_tar(archive: Path, dest: Path) -> None:
    """Extract ``archive`` into ``dest``, refusing members that are not plain files
    or directories or whose names are absolute or contain ``..``.  Everything is
    extracted into a temporary directory first, then moved into place."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                parts = PurePosixPath(m.name).parts
                if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                    raise DatasetError(f"{archive}: refusing to extract member {m.name!r} "
                                       "(absolute path, '..' or not a plain file)")
            tmp = Path(tempfile.mkdtemp(dir=dest, prefix=".extract-"))
            try:
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(tmp, members=members, **safe)
                for entry in tmp.iterdir():
                    if (dest / entry.name).exists():
                        raise DatasetError(f"{archive}: {dest / entry.name} already exists")
                    os.replace(entry, dest / entry.name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"{archive}: cannot extract ({e})") from e


# ---- CIFAR-10 -------------------------------------------------------------------------

_CIFAR_RECORD = 1 + 3 * 32 * 32


def _check_labels(path: Path, labels: np.ndarray, num_classes: int = 10) -> None:
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        raise DatasetError(f"{path}: label {labels[bad[0]]} of record {bad[0]} is outside "
                           f"0..{num_classes - 1}")


def read_cifar10_bin(path: Path) -> Arrays:
    """One file of the binary layout: records of 1 label byte and 3072 pixel bytes
    (R, G and B planes of 32x32, row-major).  -> (uint8 (N, 3, 32, 32), int64 (N,))"""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise DatasetError(f"{path}: {raw.size} bytes is not a whole number of "
                           f"{_CIFAR_RECORD}-byte records (truncated?)")
    records = raw.reshape(-1, _CIFAR_RECORD)
    labels = records[:, 0].astype(np.int64)
    _check_labels(path, labels)
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _latin1_encode(text, encoding="latin1"):
    """Python 3 writes bytes into protocol-2 pickles as _codecs.encode(str, "latin1")."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is only allowed as (str, 'latin1')")
    return text.encode("latin1")


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain data and NumPy arrays only: any other global (os.system,
    builtins.eval, ...) is refused, so a malicious file cannot run code."""
    _reconstruct = np.zeros(1).__reduce__()[0]
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
               ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
               ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
               ("_codecs", "encode"): _latin1_encode}

    def find_class(self, module, name):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed") from None


def read_cifar10_py(path: Path) -> Arrays:
    """One file of the Python layout: a pickled dict (protocol 2, written by
    Python 2) with b"data" uint8 (N, 3072) and b"labels" (N ints).
    -> (uint8 (N, 3, 32, 32), int64 (N,))"""
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except Exception as e:   # anything a truncated or hostile pickle can raise
        raise DatasetError(f"{path}: cannot unpickle ({type(e).__name__}: {e})") from e
    if not isinstance(batch, dict):
        raise DatasetError(f"{path}: expected a pickled dict, got {type(batch).__name__}")
    data, labels = (batch.get(k, batch.get(k.decode())) for k in (b"data", b"labels"))
    if data is None or labels is None:
        raise DatasetError(f"{path}: missing key b'data' or b'labels' "
                           f"(has {sorted(map(repr, batch))})")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == 3072):
        what = f"{data.dtype} array {data.shape}" if isinstance(data, np.ndarray) else type(data)
        raise DatasetError(f"{path}: b'data' must be a uint8 array of shape (N, 3072), "
                           f"got {what}")
    try:
        labels = np.asarray(labels)
    except ValueError:  # a ragged list
        labels = np.asarray(None)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DatasetError(f"{path}: b'labels' must be a list of ints, got {labels.dtype} "
                           f"{labels.shape}")
    if len(labels) != len(data):
        raise DatasetError(f"{path}: {len(labels)} labels for {len(data)} images")
    labels = labels.astype(np.int64)
    _check_labels(path, labels)
    return data.reshape(-1, 3, 32, 32), labels


_CIFAR_FILES = {
    "bin": ([f"data_batch_{i}.bin" for i in range(1, 6)], ["test_batch.bin"]),
    "py": ([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]),
}


def _cifar_dirs(root: Path):
    """(layout, directory) in the order they are tried."""
    return [(layout, base / f"cifar-10-batches-{layout}")
            for layout in ("bin", "py") for base in (root, root / "cifar10")]


def _cifar_help(root: Path) -> str:
    return (f"CIFAR-10 was not found under {root}. Put the official files in "
            f"{root / 'cifar-10-batches-bin'}/ (data_batch_1.bin ... data_batch_5.bin, "
            f"test_batch.bin, from {CIFAR10_ARCHIVE}) or in "
            f"{root / 'cifar-10-batches-py'}/ (data_batch_1 ... data_batch_5, test_batch, "
            f"from cifar-10-python.tar.gz), either also allowed under {root / 'cifar10'}/, "
            f"or put {CIFAR10_ARCHIVE} itself in {root}/; choose another data directory "
            "with --data DIR or the MINIDL_DATA environment variable.")


def load_cifar10(root: Optional[PathLike] = None, train: bool = True, *,
                 download: bool = True) -> Arrays:
    """CIFAR-10's training (50,000) or test (10,000) images.
    -> (uint8 (N, 3, 32, 32), int64 (N,)); see the module docstring for where the
    files are looked for and when they are downloaded."""
    root = data_root(root)
    split = 0 if train else 1

    def find():
        for layout, d in _cifar_dirs(root):
            if all((d / name).is_file() for name in _CIFAR_FILES[layout][split]):
                return layout, d
        return None

    found = find()
    if found is None:
        for layout, d in _cifar_dirs(root):
            if d.is_dir():
                missing = [n for n in _CIFAR_FILES[layout][split] if not (d / n).is_file()]
                raise DatasetError(f"{d}: incomplete CIFAR-10 directory, missing "
                                   f"{', '.join(missing)}")
        archive = root / CIFAR10_ARCHIVE
        if not archive.is_file():
            if not download:
                raise DatasetError(_cifar_help(root))
            try:
                fetch(CIFAR10_REMOTE, archive)
            except DatasetError as e:
                raise DatasetError(f"{e}\n{_cifar_help(root)}") from e
        if _md5(archive) != CIFAR10_REMOTE.md5:
            raise DatasetError(f"{archive}: md5 is not {CIFAR10_REMOTE.md5}, the official "
                               "archive's (corrupt or partial copy?)")
        extract_tar(archive, root)
        found = find()
        if found is None:
            raise DatasetError(f"{archive}: did not contain cifar-10-batches-bin/")
    layout, d = found
    read = read_cifar10_bin if layout == "bin" else read_cifar10_py
    parts = [read(d / name) for name in _CIFAR_FILES[layout][split]]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


# ---- MNIST and Fashion-MNIST (idx files) ---------------------------------------------

# Deflate gives at most about 1032 bytes per compressed byte
_GZIP_MAX_RATIO = 1100


def read_idx(path: PathLike, magic: int) -> np.ndarray:
    """An idx file (gzipped or not, told by its first bytes) of unsigned bytes;
    ``magic`` is 0x00000803 for images, 0x00000801 for labels.
    -> uint8 array of the dimensions in its header.  The header is checked before
    the data is read, so a corrupt file is never read (or decompressed) whole."""
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        gzipped = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        try:
            return _read_idx(path, gzip.GzipFile(fileobj=f) if gzipped else f, magic, size,
                             gzipped)
        except (OSError, EOFError, zlib.error) as e:
            raise DatasetError(f"{path}: corrupt gzip data ({e})") from e


def _read_idx(path: Path, f, magic: int, size: int, gzipped: bool) -> np.ndarray:
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    raw = f.read(header)
    if len(raw) < 4 or int.from_bytes(raw[:4], "big") != magic:
        found = f"0x{int.from_bytes(raw[:4], 'big'):08x}" if len(raw) >= 4 else "none"
        raise DatasetError(f"{path}: magic number {found}, expected 0x{magic:08x} "
                           f"(an idx file of {'images' if ndim == 3 else 'labels'})")
    if len(raw) < header:
        raise DatasetError(f"{path}: {len(raw)} bytes, shorter than its header (truncated?)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    want = header + math.prod(dims)
    if gzipped and want > size * _GZIP_MAX_RATIO:
        raise DatasetError(f"{path}: dimensions {dims} need {want} bytes, more than its {size} "
                           f"gzipped bytes can hold (truncated?)")
    if not gzipped and want > size:
        raise DatasetError(f"{path}: {size} bytes, expected {want} for dimensions {dims} "
                           f"(truncated?)")
    data = f.read(want - header)
    if len(data) < want - header:
        raise DatasetError(f"{path}: {header + len(data)} bytes, expected {want} for dimensions "
                           f"{dims} (truncated?)")
    extra = len(f.read(1 << 20))
    if extra:
        raise DatasetError(f"{path}: expected {want} bytes for dimensions {dims}, got "
                           f"{extra} extra bytes" + " or more" * (extra == 1 << 20))
    return np.frombuffer(data, np.uint8).reshape(dims).copy()


def load_idx(images_path: PathLike, labels_path: PathLike) -> Arrays:
    """An MNIST-style pair of idx files.  -> (uint8 (N, 1, H, W), int64 (N,))"""
    images = read_idx(images_path, 0x00000803)
    labels = read_idx(labels_path, 0x00000801).astype(np.int64)
    if len(images) != len(labels):
        raise DatasetError(f"{images_path}: {len(images)} images but {labels_path}: "
                           f"{len(labels)} labels")
    return images[:, None], labels


def _load_idx_set(name: str, dirs: Sequence[Path], train: bool, download: bool) -> Arrays:
    prefix = "train" if train else "t10k"
    names = [f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"]

    def find(d: Path):
        paths = [next((p for p in (d / n, d / f"{n}.gz") if p.is_file()), None) for n in names]
        return paths if None not in paths else None

    found = next((p for p in map(find, dirs) if p), None)
    if found is None:
        where = " or ".join(f"{d}/" for d in dirs)
        title = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST"}[name]
        help_ = (f"{title} was not found: expected {names[0]}[.gz] and {names[1]}[.gz] (the "
                 f"official idx files, gzipped or not) in {where}; put them there, or choose "
                 "another data directory with --data DIR or the MINIDL_DATA environment "
                 "variable.")
        if not download:
            raise DatasetError(help_)
        try:
            for n in names:
                if not any((dirs[0] / f).is_file() for f in (n, f"{n}.gz")):
                    fetch(IDX_REMOTES[name][f"{n}.gz"], dirs[0] / f"{n}.gz")
        except DatasetError as e:
            raise DatasetError(f"{e}\n{help_}") from e
        found = find(dirs[0])
    images, labels = load_idx(*found)
    if images.shape[2:] != (28, 28):
        raise DatasetError(f"{found[0]}: expected images of 28 x 28 pixels, got "
                           f"{images.shape[2]} x {images.shape[3]}")
    _check_labels(found[1], labels, len(DATASETS[name].classes))
    return images, labels


def load_mnist(root: Optional[PathLike] = None, train: bool = True, *,
               download: bool = True) -> Arrays:
    """MNIST from ``ROOT/mnist/``.  -> (uint8 (N, 1, 28, 28), int64 (N,))"""
    return _load_idx_set("mnist", [data_root(root) / "mnist"], train, download)


def load_fashion_mnist(root: Optional[PathLike] = None, train: bool = True, *,
                       download: bool = True) -> Arrays:
    """Fashion-MNIST from ``ROOT/fashion-mnist/`` or else the system copy in
    ``/usr/share/datasets/fashion-mnist/``.  -> (uint8 (N, 1, 28, 28), int64 (N,))"""
    return _load_idx_set("fashion-mnist", [data_root(root) / "fashion-mnist",
                                           SYSTEM_FASHION_MNIST], train, download)


_LOADERS = {"cifar10": load_cifar10, "fashion-mnist": load_fashion_mnist, "mnist": load_mnist}


def load_dataset(name: str, root: Optional[PathLike] = None, train: bool = True,
                 download: bool = True) -> Arrays:
    """``load_cifar10``, ``load_fashion_mnist`` or ``load_mnist`` by name (the keys
    of :data:`DATASETS`).  -> (uint8 (N, C, H, W), int64 (N,))"""
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(_LOADERS)}")
    return _LOADERS[name](root, train, download=download)
