"""Calls every mdl_status function of include/minidl.h (or include/minidl_cuda.h)
through ctypes: once with valid arguments (small shapes, 1 MiB buffers of ones, labels
and taps 0; a CUDA function's stream NULL, the default stream), then once per pointer
argument with that pointer NULL, each call in a forked child so that a crash is a
result, not the end of the run.  Prints one JSON object: function -> {"valid": status,
"null": {argument: status}}, a status being the child's exit code (the mdl_status
returned; negative: killed by that signal).  The buffers are host memory: a CUDA
function that passes its checks hands them to the device (MDL_ERR_DEVICE without a
GPU; with one, MDL_ERR_DEVICE or MDL_OK, the launch being asynchronous).

Run in a fresh interpreter (tests/test_packaging.py does): the parent never runs a
kernel, so the forked children start from a process without OpenMP threads (or a
CUDA context).
Usage: python null_pointers.py HEADER LIBRARY"""
import ctypes as C
import json
import multiprocessing
import os
import re
import struct
import sys

BUF = 1 << 20
ONES = struct.pack("f", 1.0) * (BUF // 4)


class ConvShape(C.Structure):
    _fields_ = [(f, C.c_int64) for f in
                "n c_in h w c_out kh kw stride_h stride_w pad_h pad_w".split()]


class PoolShape(C.Structure):
    _fields_ = [(f, C.c_int64) for f in "n c h w kh kw stride_h stride_w pad_h pad_w".split()] \
        + [("ceil_mode", C.c_int)]


class Affine(C.Structure):
    _fields_ = [("scale", C.c_void_p), ("shift", C.c_void_p), ("relu", C.c_int)]


keep = []  # every buffer and struct, alive until the end


def _name(param: str) -> str:
    return re.findall(r"(\w+)\s*$", param)[0]


def _buffer(name: str):
    zeros = name in ("labels", "tap")  # class 0, window position 0
    b = (C.c_float * (BUF // 4))() if zeros else (C.c_float * (BUF // 4)).from_buffer_copy(ONES)
    keep.append(b)
    return C.cast(b, C.c_void_p)


def _pointer(s):
    keep.append(s)
    return C.cast(C.pointer(s), C.c_void_p)


def arguments(function: str, params):
    """(values, ctypes types, indices of the pointer arguments) of a valid call: a
    2 x 3 x 5 x 5 input, 4 output channels, 3x3 kernels with padding 1, 2x2 pools."""
    values, types, pointers = [], [], []
    for i, p in enumerate(params):
        name = _name(p)
        kind = p[:p.rfind(name)].strip()
        if kind == "mdl_cuda_stream":  # NULL: the default stream, never an error
            types.append(C.c_void_p)
            values.append(None)
        elif "*" in kind:
            pointers.append(i)
            types.append(C.c_void_p)
            if "mdl_conv2d_shape" in kind:
                values.append(_pointer(ConvShape(2, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1)))
            elif "mdl_pool2d_shape" in kind:  # the pooled convolution pools its output
                c = 4 if function.endswith("conv2d_forward_pooled") else 3
                values.append(_pointer(PoolShape(2, c, 5, 5, 2, 2, 2, 2, 0, 0, 0)))
            elif "mdl_affine" in kind:
                values.append(_pointer(Affine(_buffer(""), _buffer(""), 0)))
            else:
                values.append(_buffer(name))
        elif kind == "float":
            types.append(C.c_float)
            values.append(0.5 if name == "p" else 0.1)
        elif kind == "double":
            types.append(C.c_double)
            values.append(1e-5)
        elif kind == "size_t":
            types.append(C.c_size_t)
            values.append(BUF)
        elif kind == "uint64_t":
            types.append(C.c_uint64)
            values.append(1)
        elif kind == "int64_t":
            types.append(C.c_int64)
            values.append(1 if name == "step" else 2)
        else:  # int flags and enums
            types.append(C.c_int)
            values.append(1 if name == "step" else 0)
    return values, types, pointers


def _call(lib, function, types, values):
    f = getattr(lib, function)
    f.restype, f.argtypes = C.c_int, types
    os._exit(f(*values))


def main(header: str, library: str) -> None:
    text = re.sub(r"/\*.*?\*/", "", open(header).read(), flags=re.S)
    lib = C.CDLL(library)
    fork = multiprocessing.get_context("fork")
    results = {}
    for function, plist in re.findall(r"MDL_API\s+mdl_status\s+(\w+)\s*\(([^)]*)\)\s*;", text):
        params = [p.strip() for p in plist.split(",") if p.strip() not in ("", "void")]
        values, types, pointers = arguments(function, params)

        def status(vals):
            child = fork.Process(target=_call, args=(lib, function, types, vals))
            child.start()
            child.join(60)
            if child.is_alive():
                child.kill()
                return "hang"
            return child.exitcode

        nulls = {}
        for i in pointers:
            vals = list(values)
            vals[i] = None
            nulls[_name(params[i])] = status(vals)
        results[function] = {"valid": status(values), "null": nulls}
    print(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
