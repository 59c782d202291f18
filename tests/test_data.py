"""minidl.data: the readers against small files written in the official layouts
(and against the real Fashion-MNIST where the system has it), and the loader.
No test touches the network: downloads are served by a stand-in opener."""
import gzip
import struct
import hashlib
import io
import os
import pickle
import tarfile
import threading
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from minidl import data
from minidl.data import DatasetError, readers

# ---- writing files in the official layouts -------------------------------------------


def cifar_arrays(n, seed):
    """n random CIFAR images and labels; image 0 has a known plane layout: R is
    0, 1, 2, ... in row-major order, G is all 100, B all 200."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    images[0, 0] = (np.arange(1024) % 256).reshape(32, 32)
    images[0, 1], images[0, 2] = 100, 200
    return images, rng.integers(0, 10, n).astype(np.int64)


def cifar_bin_bytes(images, labels):
    """Records of 1 label byte then the R, G and B planes, built byte by byte."""
    out = bytearray()
    for img, label in zip(images, labels):
        out.append(int(label))
        for plane in range(3):
            out += bytes(int(v) for v in img[plane].ravel())
    return bytes(out)


def cifar_py_bytes(images, labels):
    """A batch pickled as the official Python files: a dict with bytes keys, protocol 2."""
    return pickle.dumps({b"batch_label": b"a test batch", b"data": images.reshape(len(images), -1),
                         b"labels": [int(v) for v in labels],
                         b"filenames": [b"img%d.png" % i for i in range(len(images))]}, protocol=2)


CIFAR_NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def write_cifar(directory, layout, records=3, seed=0):
    """Six files of ``records`` images each; returns {file stem: (images, labels)}."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for k, stem in enumerate(CIFAR_NAMES):
        images, labels = written[stem] = cifar_arrays(records, seed + k)
        if layout == "bin":
            (directory / f"{stem}.bin").write_bytes(cifar_bin_bytes(images, labels))
        else:
            (directory / stem).write_bytes(cifar_py_bytes(images, labels))
    return written


def expected_cifar(written, train):
    stems = CIFAR_NAMES[:5] if train else CIFAR_NAMES[5:]
    return (np.concatenate([written[s][0] for s in stems]),
            np.concatenate([written[s][1] for s in stems]))


def idx_bytes(array, magic, gz=False):
    raw = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    raw += array.astype(np.uint8).tobytes()
    return gzip.compress(raw) if gz else raw


def mnist_arrays(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, n).astype(np.int64))


def write_mnist(directory, prefix="train", n=5, seed=0, gz=(True, False)):
    directory.mkdir(parents=True, exist_ok=True)
    images, labels = mnist_arrays(n, seed)
    (directory / (f"{prefix}-images-idx3-ubyte" + ".gz" * gz[0])).write_bytes(
        idx_bytes(images, 0x803, gz[0]))
    (directory / (f"{prefix}-labels-idx1-ubyte" + ".gz" * gz[1])).write_bytes(
        idx_bytes(labels, 0x801, gz[1]))
    return images[:, None], labels


class FakeResponse(io.BytesIO):
    def __init__(self, payload):
        super().__init__(payload)
        self.headers = {"Content-Length": str(len(payload))}


@pytest.fixture
def serve(monkeypatch):
    """serve({url: bytes}): the downloader's opener answers from that dict (and
    fails like a machine without network for anything else); returns the URLs asked."""
    asked = []

    def install(files):
        def opener(url, timeout=None):
            asked.append(url)
            if url not in files:
                raise urllib.error.URLError("no network in tests")
            return FakeResponse(files[url])
        monkeypatch.setattr(readers, "_urlopen", opener)
        return asked
    install({})
    return install


def md5(payload):
    return hashlib.md5(payload).hexdigest()


# ---- CIFAR-10 -------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["bin", "py"])
@pytest.mark.parametrize("train", [True, False])
def test_cifar10_reads_exact_pixels(tmp_path, layout, train):
    written = write_cifar(tmp_path / f"cifar-10-batches-{layout}", layout)
    images, labels = data.load_cifar10(tmp_path, train, download=False)
    want_images, want_labels = expected_cifar(written, train)
    assert images.dtype == np.uint8 and labels.dtype == np.int64
    assert images.shape == (15 if train else 3, 3, 32, 32) and images.flags.c_contiguous
    np.testing.assert_array_equal(images, want_images)
    np.testing.assert_array_equal(labels, want_labels)
    first = images[0]   # the known plane layout of the first image
    assert first[0, 0, 1] == 1 and first[0, 1, 0] == 32 and first[0, 31, 31] == 1023 % 256
    assert (first[1] == 100).all() and (first[2] == 200).all()


def test_cifar10_layouts_agree_and_bin_is_preferred(tmp_path):
    write_cifar(tmp_path / "a" / "cifar-10-batches-bin", "bin", seed=0)
    write_cifar(tmp_path / "b" / "cifar10" / "cifar-10-batches-py", "py", seed=0)
    for train in (True, False):
        for x, y in zip(data.load_cifar10(tmp_path / "a", train, download=False),
                        data.load_cifar10(tmp_path / "b", train, download=False)):
            np.testing.assert_array_equal(x, y)
    # both layouts under one root, different contents: bin (even under cifar10/) wins
    written = write_cifar(tmp_path / "c" / "cifar10" / "cifar-10-batches-bin", "bin", seed=0)
    write_cifar(tmp_path / "c" / "cifar-10-batches-py", "py", seed=50)
    np.testing.assert_array_equal(data.load_cifar10(tmp_path / "c", False, download=False)[0],
                                  expected_cifar(written, False)[0])


def test_cifar10_truncated_bin(tmp_path):
    d = tmp_path / "cifar-10-batches-bin"
    write_cifar(d, "bin")
    path = d / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DatasetError, match=r"data_batch_3\.bin: 9218 bytes is not a whole "
                       r"number of 3073-byte records \(truncated\?\)"):
        data.load_cifar10(tmp_path, True, download=False)
    path.write_bytes(b"")
    with pytest.raises(DatasetError, match=r"data_batch_3\.bin: 0 bytes"):
        data.load_cifar10(tmp_path, True, download=False)


@pytest.mark.parametrize("layout", ["bin", "py"])
def test_cifar10_label_out_of_range(tmp_path, layout):
    d = tmp_path / f"cifar-10-batches-{layout}"
    write_cifar(d, layout)
    images, labels = cifar_arrays(3, 9)
    labels[1] = 10
    if layout == "bin":
        (d / "test_batch.bin").write_bytes(cifar_bin_bytes(images, labels))
    else:
        (d / "test_batch").write_bytes(cifar_py_bytes(images, labels))
    with pytest.raises(DatasetError,
                       match=r"test_batch(\.bin)?: label 10 of record 1 is outside 0\.\.9"):
        data.load_cifar10(tmp_path, False, download=False)


def python2_pickle(images, labels):
    """A batch byte for byte as Python 2's cPickle (protocol 2) writes it: str
    opcodes for bytes, arrays rebuilt by numpy.core.multiarray._reconstruct."""
    raw = images.reshape(len(images), -1).tobytes()
    n = len(images)
    array = (b"cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85U\x01b"
             b"\x87R(K\x01K" + bytes([n]) + b"M\x00\x0c\x86cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R"
             b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89T"
             + len(raw).to_bytes(4, "little") + raw + b"tb")
    label_list = b"]q\x05(" + b"".join(b"K" + bytes([int(v)]) for v in labels) + b"e"
    return (b"\x80\x02}q\x00(U\x04data" + array + b"U\x06labels" + label_list +
            b"U\x0bbatch_labelU\x0ctest batch 1u.")


def test_cifar10_python2_pickle(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    write_cifar(d, "py")
    images, labels = cifar_arrays(4, 7)
    (d / "test_batch").write_bytes(python2_pickle(images, labels))
    got = data.load_cifar10(tmp_path, False, download=False)
    np.testing.assert_array_equal(got[0], images)
    np.testing.assert_array_equal(got[1], labels)


class RunsCommand:
    """Unpickling this would run a shell command (if the unpickler allowed it)."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _pickle_cases(marker):
    images, labels = cifar_arrays(3, 1)
    good = cifar_py_bytes(images, labels)
    flat = images.reshape(3, -1)

    def batch(**kw):
        d = {b"data": flat, b"labels": [int(v) for v in labels]}
        d.update({k.encode(): v for k, v in kw.items()})
        return pickle.dumps({k: v for k, v in d.items() if v is not None}, protocol=2)
    return {
        "garbage": (b"this is not a pickle at all", "cannot unpickle"),
        "truncated": (good[:len(good) // 2], "cannot unpickle"),
        "not a dict": (pickle.dumps([1, 2, 3], protocol=2), "expected a pickled dict"),
        "missing labels": (batch(labels=None), "missing key"),
        "wrong dtype": (batch(data=flat.astype(np.int32)), "must be a uint8 array"),
        "wrong shape": (batch(data=flat[:, :3000]), r"shape \(N, 3072\)"),
        "label count": (batch(labels=[1, 2]), "2 labels for 3 images"),
        "label type": (batch(labels=["a", "b", "c"]), "must be a list of ints"),
        "ragged labels": (batch(labels=[1, [2, 3], 4]), "must be a list of ints"),
        "keys of two types": (pickle.dumps({"x": 1, b"y": 2}, protocol=2),
                              r"missing key .*has \[\"'x'\", \"b'y'\"\]"),
        "runs code": (pickle.dumps({b"data": RunsCommand(marker)}, protocol=2), "not allowed"),
        "eval": (b"cbuiltins\neval\n(S'open(\\'%s\\', \\'w\\')'\ntR." % str(marker).encode(),
                 "global builtins.eval is not allowed"),
    }


@pytest.mark.parametrize("case", list(_pickle_cases("-")))
def test_cifar10_bad_pickles(tmp_path, case):
    d = tmp_path / "cifar-10-batches-py"
    write_cifar(d, "py")
    marker = tmp_path / "code-ran"
    payload, message = _pickle_cases(marker)[case]
    (d / "test_batch").write_bytes(payload)
    with pytest.raises(DatasetError, match=rf"cifar-10-batches-py/test_batch: .*{message}"):
        data.load_cifar10(tmp_path, False, download=False)
    assert not marker.exists()


def test_cifar10_missing_or_incomplete(tmp_path):
    with pytest.raises(DatasetError) as err:
        data.load_cifar10(tmp_path, True, download=False)
    msg = str(err.value)
    for expect in (f"{tmp_path}/cifar-10-batches-bin/", "data_batch_1.bin", "test_batch.bin",
                   f"{tmp_path}/cifar-10-batches-py/", "cifar-10-binary.tar.gz", "--data DIR",
                   "MINIDL_DATA"):
        assert expect in msg
    d = tmp_path / "cifar-10-batches-bin"
    write_cifar(d, "bin")
    (d / "data_batch_4.bin").unlink()
    with pytest.raises(DatasetError,
                       match="incomplete CIFAR-10 directory, missing data_batch_4.bin"):
        data.load_cifar10(tmp_path, True)
    assert len(data.load_cifar10(tmp_path, False)[0]) == 3   # the test split is complete


def cifar_archive(tmp_path, extra=()):
    """A cifar-10-binary.tar.gz in the official layout (3 records per file)."""
    written = write_cifar(tmp_path / "src" / "cifar-10-batches-bin", "bin")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
        for info, payload in extra:
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return buf.getvalue(), written


URL = "https://cifar.test/cifar-10-binary.tar.gz"


def test_cifar10_download(tmp_path, serve, monkeypatch):
    archive, written = cifar_archive(tmp_path)
    monkeypatch.setattr(readers, "CIFAR10_REMOTE",
                        readers.Remote((URL,), md5(archive), len(archive)))
    asked = serve({URL: archive})
    root = tmp_path / "root"
    images, labels = data.load_cifar10(root, True)
    assert asked == [URL]
    np.testing.assert_array_equal(images, expected_cifar(written, True)[0])
    np.testing.assert_array_equal(labels, expected_cifar(written, True)[1])
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-batches-bin",
                                                      "cifar-10-binary.tar.gz"]
    data.load_cifar10(root, False)   # now present: no second download
    assert asked == [URL]
    # an archive put there by hand is extracted without the network
    (tmp_path / "hand").mkdir()
    (tmp_path / "hand" / "cifar-10-binary.tar.gz").write_bytes(archive)
    assert len(data.load_cifar10(tmp_path / "hand", False, download=False)[0]) == 3


def test_cifar10_download_checksum_mismatch_leaves_nothing(tmp_path, serve, monkeypatch):
    archive, _ = cifar_archive(tmp_path)
    monkeypatch.setattr(readers, "CIFAR10_REMOTE", readers.Remote((URL,), "0" * 32))
    serve({URL: archive})
    root = tmp_path / "root"
    with pytest.raises(DatasetError, match=f"checksum mismatch(.|\n)*{root}/cifar-10-batches-bin"):
        data.load_cifar10(root, True)
    assert not root.exists()   # not even the directory it made


def test_cifar10_without_network(tmp_path, serve):
    with pytest.raises(DatasetError) as err:
        data.load_cifar10(tmp_path, True)
    msg = str(err.value)
    assert "download failed" in msg and "no network" in msg
    assert f"{tmp_path}/cifar-10-batches-bin/" in msg and "MINIDL_DATA" in msg
    assert list(tmp_path.iterdir()) == []   # the root existed: it stays, empty


@pytest.mark.parametrize("member", ["../evil.bin", "/abs/evil.bin", "link"])
def test_cifar10_unsafe_archive_refused(tmp_path, serve, monkeypatch, member):
    info = tarfile.TarInfo(member)
    payload = b"x"
    if member == "link":
        info.type, info.linkname, payload = tarfile.SYMTYPE, "/etc/passwd", None
    else:
        info.size = 1
    archive, _ = cifar_archive(tmp_path, [(info, payload)])
    monkeypatch.setattr(readers, "CIFAR10_REMOTE", readers.Remote((URL,), md5(archive)))
    serve({URL: archive})
    root = tmp_path / "root"
    with pytest.raises(DatasetError,
                       match=f"cifar-10-binary.tar.gz: refusing to extract member '{member}'"):
        data.load_cifar10(root, True)
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-binary.tar.gz"]
    assert not (tmp_path / "evil.bin").exists()


# ---- idx files (MNIST, Fashion-MNIST) -------------------------------------------------

@pytest.mark.parametrize("gz", [(False, False), (True, True), (True, False)])
def test_idx_reads_exact_pixels(tmp_path, gz):
    want_images, want_labels = write_mnist(tmp_path, gz=gz)
    # gzip is told by its magic bytes, not the name: swap the names around
    for path in tmp_path.iterdir():
        path.rename(tmp_path / (path.name[:-3] if path.suffix == ".gz" else path.name + ".gz"))
    found = [next(iter(tmp_path.glob(f"train-{k}*"))) for k in ("images", "labels")]
    images, labels = data.load_idx(*found)
    assert images.shape == (5, 1, 28, 28) and images.dtype == np.uint8 and labels.dtype == np.int64
    assert images.flags.writeable
    np.testing.assert_array_equal(images, want_images)
    np.testing.assert_array_equal(labels, want_labels)


@pytest.mark.parametrize("loader, sub", [(data.load_mnist, "mnist"),
                                         (data.load_fashion_mnist, "fashion-mnist")])
def test_mnist_layouts(tmp_path, loader, sub, monkeypatch):
    monkeypatch.setattr(readers, "SYSTEM_FASHION_MNIST", tmp_path / "system")
    train = write_mnist(tmp_path / sub, "train", n=5, seed=1, gz=(True, False))
    test = write_mnist(tmp_path / sub, "t10k", n=4, seed=2, gz=(False, True))
    for split, want in ((True, train), (False, test)):
        got = loader(tmp_path, split, download=False)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    name = "mnist" if sub == "mnist" else "fashion-mnist"
    np.testing.assert_array_equal(data.load_dataset(name, tmp_path, False, False)[1], test[1])


def test_fashion_mnist_system_copy_and_missing(tmp_path, monkeypatch):
    system = tmp_path / "system"
    monkeypatch.setattr(readers, "SYSTEM_FASHION_MNIST", system)
    with pytest.raises(DatasetError) as err:
        data.load_fashion_mnist(tmp_path / "root", True, download=False)
    msg = str(err.value)
    for expect in (f"{tmp_path}/root/fashion-mnist/", f"{system}/", "train-images-idx3-ubyte[.gz]",
                   "train-labels-idx1-ubyte[.gz]", "--data DIR", "MINIDL_DATA"):
        assert expect in msg
    want = write_mnist(system, "train")
    np.testing.assert_array_equal(data.load_fashion_mnist(tmp_path / "root", True)[0], want[0])
    with pytest.raises(DatasetError, match=f"{tmp_path}/mnist/"):
        data.load_mnist(tmp_path, False, download=False)


def _corrupt(tmp_path, which, how):
    """Write a good train pair under tmp_path/mnist, then damage one file."""
    write_mnist(tmp_path / "mnist", gz=(which == "images", which == "labels"))
    path = next((tmp_path / "mnist").glob(f"train-{which}*"))
    raw = path.read_bytes()
    plain = gzip.decompress(raw) if path.suffix == ".gz" else raw
    out = {"magic": lambda: b"\x00\x00\x08\x02" + plain[4:],
           "cut": lambda: plain[:-1],
           "extra": lambda: plain + b"\x00\x00",
           "header": lambda: plain[:6],
           "empty": lambda: b"",
           "gzip-garbage": lambda: b"\x1f\x8b\x08\x00" + b"garbage" * 10,
           "gzip-cut": lambda: gzip.compress(plain)[:-20],
           "gzip-crc": lambda: gzip.compress(plain)[:-8] + b"\x00" * 8,
           "count": lambda: (idx_bytes(np.zeros(4, np.uint8), 0x801) if which == "labels"
                             else idx_bytes(np.zeros((4, 28, 28), np.uint8), 0x803)),
           "label": lambda: idx_bytes(np.array([1, 2, 12, 3, 4]), 0x801),
           "huge dims": lambda: plain[:4] + struct.pack(">III", 2 ** 31, 2 ** 31, 4) + plain[16:],
           "small images": lambda: idx_bytes(np.zeros((5, 5, 5), np.uint8), 0x803)}[how]()
    path.write_bytes(out)
    return path


@pytest.mark.parametrize("which, how, message", [
    ("images", "magic", r"magic number 0x00000802, expected 0x00000803"),
    ("labels", "magic", r"magic number 0x00000802, expected 0x00000801"),
    ("images", "cut", r"3935 bytes, expected 3936 for dimensions \(5, 28, 28\) \(truncated\?\)"),
    ("labels", "cut", r"12 bytes, expected 13 .*truncated"),
    ("images", "extra", r"2 extra bytes"),
    ("images", "header", r"shorter than its header"),
    ("labels", "empty", r"magic number none"),
    ("images", "gzip-garbage", r"corrupt gzip data"),
    ("images", "gzip-cut", r"corrupt gzip data"),
    ("labels", "gzip-crc", r"corrupt gzip data"),
    ("images", "count", r"4 images but .*5 labels"),
    ("labels", "count", r"5 images but .*4 labels"),
    ("labels", "label", r"label 12 of record 2 is outside 0\.\.9"),
    ("images", "huge dims", r"expected 18446744073709551632 for dimensions "
                            r"\(2147483648, 2147483648, 4\) \(truncated"),
    ("images", "small images", r"expected images of 28 x 28 pixels, got 5 x 5"),
])
def test_idx_corrupt_files(tmp_path, which, how, message):
    path = _corrupt(tmp_path, which, how)
    with pytest.raises(DatasetError, match=message) as err:
        data.load_mnist(tmp_path, True, download=False)
    assert str(path) in str(err.value)


def test_idx_gzip_bomb_is_not_decompressed(tmp_path):
    """A gzipped idx file whose header asks for more than its compressed bytes can
    hold, or that runs on past its data, is refused without decompressing it all."""
    path = tmp_path / "bomb-idx3-ubyte.gz"
    head = struct.pack(">IIII", 0x803, 1, 28, 28)
    path.write_bytes(gzip.compress(head + bytes(28 * 28) + bytes(300 << 20)))
    assert path.stat().st_size < 1 << 20
    with pytest.raises(DatasetError, match="1048576 extra bytes or more"):
        readers.read_idx(path, 0x803)
    path.write_bytes(gzip.compress(struct.pack(">IIII", 0x803, 100_000, 28, 28) + bytes(1000)))
    with pytest.raises(DatasetError, match=r"\(100000, 28, 28\) need 78400016 bytes, more than "
                                           r"its \d+ gzipped bytes can hold"):
        readers.read_idx(path, 0x803)


def test_mnist_download(tmp_path, serve, monkeypatch):
    files, remotes = {}, {}
    images, labels = mnist_arrays(5, 3)
    for name, payload in (("t10k-images-idx3-ubyte.gz", idx_bytes(images, 0x803, True)),
                          ("t10k-labels-idx1-ubyte.gz", idx_bytes(labels, 0x801, True))):
        files["https://mnist.test/" + name] = payload
        # the first mirror is down; the second answers
        remotes[name] = readers.Remote(("https://down.test/" + name, "https://mnist.test/" + name),
                                       md5(payload))
    monkeypatch.setitem(readers.IDX_REMOTES, "mnist", remotes)
    asked = serve(files)
    got = data.load_mnist(tmp_path, False)
    np.testing.assert_array_equal(got[0][:, 0], images)
    np.testing.assert_array_equal(got[1], labels)
    assert len(asked) == 4
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == sorted(remotes)


def test_mnist_download_bad_checksum_and_no_network(tmp_path, serve, monkeypatch):
    name = "train-images-idx3-ubyte.gz"
    remote = readers.Remote(("https://mnist.test/" + name,), "0" * 32)
    monkeypatch.setitem(readers.IDX_REMOTES, "mnist",
                        {**readers.IDX_REMOTES["mnist"], name: remote})
    serve({remote.urls[0]: b"whatever"})
    with pytest.raises(DatasetError, match=f"checksum mismatch(.|\n)*{tmp_path}/mnist/"):
        data.load_mnist(tmp_path, True)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DatasetError, match=r"download failed(.|\n)*--data DIR"):
        data.load_mnist(tmp_path, False)


def test_load_dataset_and_data_root(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown data set 'svhn'; choose one of cifar10, "
                       "fashion-mnist, mnist"):
        data.load_dataset("svhn", tmp_path)
    assert set(data.DATASETS) == {"cifar10", "fashion-mnist", "mnist"}
    for info in data.DATASETS.values():
        assert len(info.classes) == 10 and len(info.mean) == len(info.std) == info.channels
    monkeypatch.delenv("MINIDL_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.data_root() == tmp_path / "home" / ".cache" / "minidl"
    monkeypatch.setenv("MINIDL_DATA", str(tmp_path / "env"))
    assert data.data_root() == tmp_path / "env"
    assert data.data_root(tmp_path / "cli") == tmp_path / "cli"
    assert data.data_root("~/x") == tmp_path / "home" / "x"


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not (FASHION / "t10k-labels-idx1-ubyte.gz").exists(),
                    reason="Fashion-MNIST is not installed (Debian: dataset-fashion-mnist)")
def test_real_fashion_mnist(tmp_path):
    for train, n in ((True, 60000), (False, 10000)):
        images, labels = data.load_dataset("fashion-mnist", tmp_path, train, download=False)
        assert images.shape == (n, 1, 28, 28) and images.dtype == np.uint8
        np.testing.assert_array_equal(np.bincount(labels, minlength=10), [n // 10] * 10)
        if train:   # the published normalisation constants
            info = data.DATASETS["fashion-mnist"]
            assert abs(images.mean() / 255 - info.mean[0]) < 1e-3
            assert abs(images.std() / 255 - info.std[0]) < 1e-3


# ---- the loader -----------------------------------------------------------------------

CIFAR = data.DATASETS["cifar10"]


def make_loader(n=103, batch_size=10, channels=3, size=8, **kw):
    """A loader over n random images whose label is the image's index."""
    rng = np.random.default_rng(n)
    images = rng.integers(0, 256, (n, channels, size, size), dtype=np.uint8)
    kw = {"shuffle": True, "seed": 5, "mean": CIFAR.mean[:channels], "std": CIFAR.std[:channels],
          **kw}
    return data.DataLoader(images, np.arange(n, dtype=np.int64), batch_size, **kw)


def normalise64(images):
    """(image / 255 - mean) / std in float64, with CIFAR-10's first C means and stds."""
    c = images.shape[-3]
    mean = np.asarray(CIFAR.mean[:c])[:, None, None]
    std = np.asarray(CIFAR.std[:c])[:, None, None]
    return (images.astype(np.float64) / 255 - mean) / std


def epoch(loader, e, start=0):
    loader.set_epoch(e, start)
    return list(loader)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_loader_batches(drop_last, prefetch):
    loader = make_loader(drop_last=drop_last, prefetch=prefetch)
    batches = epoch(loader, 0)
    assert len(loader) == len(batches) == (10 if drop_last else 11)
    for i, (x, y) in enumerate(batches):
        b = 3 if i == 10 else 10
        assert x.shape == (b, 3, 8, 8) and x.dtype == np.float32 and x.flags.c_contiguous
        assert y.shape == (b,) and y.dtype == np.int64
        # normalisation, against a float64 computation (y is the image index)
        np.testing.assert_allclose(x, normalise64(loader.images[y]), rtol=0, atol=2e-6)
    seen = np.concatenate([y for _, y in batches])
    if drop_last:
        assert len(set(seen)) == 100
    else:   # every sample exactly once
        np.testing.assert_array_equal(np.sort(seen), np.arange(103))


def test_loader_order():
    loader = make_loader()
    order = lambda e: np.concatenate([y for _, y in epoch(loader, e)])   # noqa: E731
    first = order(3)
    for e in (0, 1, 2):
        order(e)
    np.testing.assert_array_equal(order(3), first)   # the same whatever came before
    np.testing.assert_array_equal(first, np.random.default_rng([5, 3]).permutation(103))
    assert not np.array_equal(order(4), first)
    assert not np.array_equal(np.concatenate([y for _, y in make_loader(seed=6).iter_from(0)]),
                              order(0))
    plain = make_loader(shuffle=False)
    for e in (0, 7):
        np.testing.assert_array_equal(np.concatenate([y for _, y in epoch(plain, e)]),
                                      np.arange(103))


def test_each_iteration_is_the_next_epoch():
    """A plain loop over the loader reshuffles every epoch: iteration k is epoch k, or
    counts on from the epoch set_epoch chose (its start only for that iteration);
    iter_from does not move the epoch on."""
    labels = lambda batches: np.concatenate([y for _, y in batches])   # noqa: E731
    want = [labels(epoch(make_loader(), e)) for e in range(4)]
    loader = make_loader()
    for e in range(2):
        np.testing.assert_array_equal(labels(loader), want[e])
    assert not np.array_equal(want[0], want[1])
    loader.set_epoch(2, start=5)
    np.testing.assert_array_equal(labels(loader), want[2][5 * 10:])
    np.testing.assert_array_equal(labels(loader.iter_from(0)), want[3])
    np.testing.assert_array_equal(labels(loader), want[3])


@pytest.mark.parametrize("augment", [False, True])
def test_loader_resume(augment):
    loader = make_loader(augment=augment)
    full = epoch(loader, 2)
    for k in (0, 1, 6, 10, 11):
        resumed = epoch(make_loader(augment=augment), 2, start=k)   # a fresh loader
        assert len(resumed) == len(full) - k
        for (x, y), (fx, fy) in zip(resumed, full[k:]):
            np.testing.assert_array_equal(y, fy)
            np.testing.assert_array_equal(x, fx)
    other = make_loader(augment=augment, prefetch=0)
    other.set_epoch(2)
    tail = list(other.iter_from(4))
    assert len(tail) == 7
    for (x, y), (fx, fy) in zip(tail, full[4:]):
        np.testing.assert_array_equal(y, fy)
        np.testing.assert_array_equal(x, fx)
    with pytest.raises(ValueError, match="start: 12 is past the 11 batches"):
        loader.set_epoch(0, start=12)


def test_augmentation_against_reference():
    """Each augmented image is the window at the drawn offset of the image
    zero-padded by 4 (black pixels, normalised like the rest), mirrored when
    drawn; checked against float64 with the offsets the loader draws."""
    loader = make_loader(n=64, batch_size=16, size=32, augment=True)
    loader.set_epoch(1)
    for i, (x, y) in enumerate(loader):
        dy, dx, flip = loader.augment_params(1, i, len(y))
        padded = np.pad(loader.images[y].astype(np.float64), ((0, 0), (0, 0), (4, 4), (4, 4)))
        for j in range(len(y)):
            crop = padded[j, :, dy[j]:dy[j] + 32, dx[j]:dx[j] + 32]
            crop = crop[:, :, ::-1] if flip[j] else crop
            np.testing.assert_allclose(x[j], normalise64(crop), rtol=0, atol=2e-6)
    # the draws: offsets cover 0..8 about uniformly, half the images are mirrored
    draws = [loader.augment_params(0, i, 1000) for i in range(4)]
    dy, dx, flip = (np.concatenate(d) for d in zip(*draws))
    assert set(dy) == set(dx) == set(range(9))
    assert np.all(np.abs(np.bincount(dy) / len(dy) - 1 / 9) < 0.02)
    assert abs(flip.mean() - 0.5) < 0.03
    assert not np.array_equal(loader.augment_params(0, 1, 16)[0],
                              loader.augment_params(0, 2, 16)[0])
    # independent of the thread that makes the batch
    sync = make_loader(n=64, batch_size=16, size=32, augment=True, prefetch=0)
    for (x, _), (sx, _) in zip(epoch(loader, 3), epoch(sync, 3)):
        np.testing.assert_array_equal(x, sx)


def test_augmentation_throughput():
    """100-image CIFAR batches with augmentation, made in the calling thread:
    150,000-190,000 images/s on one core of the development machine (0.5-0.7 ms
    a batch); the requirement is well over 5,000."""
    import time
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2000, 3, 32, 32), dtype=np.uint8)
    loader = data.DataLoader(images, np.zeros(2000, np.int64), 100, shuffle=True, seed=0,
                             mean=CIFAR.mean, std=CIFAR.std, augment=True, prefetch=0)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        n = sum(len(y) for _, y in loader)
        best = max(best, n / (time.perf_counter() - t))
    assert best > 5000, f"{best:.0f} images/s"


def live_workers():
    return [t for t in threading.enumerate() if t.name == "minidl-data"]


def test_loader_thread_lifetime():
    before = threading.active_count()
    loader = make_loader(prefetch=3)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert not live_workers() and threading.active_count() == before
    it = iter(loader)
    assert not live_workers()   # nothing starts before the first batch is asked for
    next(it)
    assert len(live_workers()) == 1
    it.close()
    assert not live_workers()
    it = iter(loader)
    next(it)
    del it
    assert not live_workers() and threading.active_count() == before


def test_loader_worker_exception():
    loader = make_loader()
    make = loader._batch

    def failing(epoch, order, index):
        if index == 3:
            raise RuntimeError("bad batch 3")
        return make(epoch, order, index)
    loader._batch = failing
    got = []
    with pytest.raises(RuntimeError, match="bad batch 3"):
        for batch in loader:
            got.append(batch)
    assert len(got) == 3 and not live_workers()


@pytest.mark.parametrize("change, message", [
    ({"images": np.zeros((4, 3, 8, 8), np.float32)}, "images must be a uint8 array"),
    ({"images": np.zeros((4, 8, 8), np.uint8)}, "images must be a uint8 array"),
    ({"labels": np.zeros(4, np.int32)}, "labels must be an int64 array"),
    ({"labels": np.zeros((4, 1), np.int64)}, "labels must be an int64 array"),
    ({"labels": np.zeros(3, np.int64)}, "labels: 3 labels for 4 images"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"batch_size": 2.0}, "batch_size must be an integer >= 1"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"seed": 1 << 32}, r"seed must be below 2\^32"),  # [2^32 + s, e] is [s, 1, e]: s's next epoch
    ({"prefetch": -1}, "prefetch must be an integer >= 0"),
    ({"mean": (0.5, 0.5)}, r"mean must have one value per channel \(3\), got 2"),
    ({"std": (0.5,)}, r"std must have one value per channel \(3\), got 1"),
    ({"std": (0.5, 0.0, 0.5)}, "std positive and finite"),
])
def test_loader_bad_arguments(change, message):
    args = {"images": np.zeros((4, 3, 8, 8), np.uint8), "labels": np.zeros(4, np.int64),
            "batch_size": 2, "shuffle": True, "seed": 0, "mean": CIFAR.mean, "std": CIFAR.std,
            **change}
    with pytest.raises(ValueError, match=message):
        data.DataLoader(args.pop("images"), args.pop("labels"), args.pop("batch_size"), **args)
    loader = make_loader()
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        loader.set_epoch(-1)
