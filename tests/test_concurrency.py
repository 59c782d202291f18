"""The bindings release the GIL: kernels called from several Python threads at
once give the same results as one after another, and each thread sees its own
error message."""
import threading

import numpy as np

from minidl import ops

from helpers import f32


def _run_threads(fns):
    results = [None] * len(fns)

    def work(i):
        results[i] = fns[i]()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_calls_match_serial(rng):
    x, w = f32(rng, 4, 8, 16, 16), f32(rng, 12, 8, 3, 3)
    a, b = f32(rng, 200, 150), f32(rng, 150, 170)
    jobs = [lambda: ops.conv2d(x, w, padding=1),
            lambda: ops.sgemm(a, b),
            lambda: ops.max_pool2d(x, 3, stride=2, ceil_mode=True),
            lambda: ops.batch_norm(x, np.ones(8, np.float32), np.zeros(8, np.float32))[0]] * 3
    serial = [job() for job in jobs]
    for got, want in zip(_run_threads(jobs), serial):
        np.testing.assert_array_equal(got, want)


def test_error_messages_are_per_thread():
    """A failing C call in one thread does not change another thread's message."""
    from minidl import _C
    shapes = {"stride_h": (1, 1, 4, 4, 1, 3, 3, 0, 1, 0, 0),
              "pad_w": (1, 1, 4, 4, 1, 3, 3, 1, 1, 0, -1)}
    buf = np.zeros(16, np.float32)

    def messages(field):
        out = []
        for _ in range(300):
            try:  # the C call fails without the GIL; the message is read after
                _C.conv2d_forward(shapes[field], buf, buf, None, buf)
            except ValueError as e:
                out.append(str(e))
        return field, out

    for field, msgs in _run_threads([lambda f=f: messages(f) for f in shapes for _ in range(2)]):
        assert len(msgs) == 300
        assert all(field in m for m in msgs), [m for m in msgs if field not in m][:3]
