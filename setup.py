"""Build minidl: the C core (src_c/) is compiled once (a file per CPU at a time, with
the Makefile's compiler and flags into its objects, build/obj/, so that `make lib` and
`make ext` compile each file once between them; each is compiled again only when it or
a header changes) and linked three ways --
into the Python extension minidl._C, into minidl/lib/libminidl.so and into
minidl/lib/libminidl.a -- and the public header is copied to minidl/include/,
so that other tools can link the copy installed with the package
(`python -m minidl --cflags --libs`).

Files named *_avx2.c get -mavx2 -mfma, files named *_avx512.c -mavx512f
-mavx2 -mfma; everything else is built for the baseline CPU, and the kernels
pick the AVX2 (or AVX-512) versions at run time.
MINIDL_SANITIZE=1 builds with AddressSanitizer and UBSan (its objects in build/asan-obj/).

CUDA: when nvcc is found (on PATH or in $CUDA_HOME/bin) the kernels of
src_cuda/ are compiled too (one nvcc per file, in parallel) and linked, with
the CUDA runtime static, into minidl/lib/libminidl_cuda.so, with
minidl_cuda.h beside minidl.h and the binding minidl._cuda.  MINIDL_CUDA=0
leaves them out, MINIDL_CUDA=1 makes a missing nvcc an error.
"""
import concurrent.futures
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CORE_SOURCES = sorted(glob.glob("src_c/*.c"))
CORE_HEADERS = sorted(glob.glob("src_c/*.h")) + ["include/minidl.h"]
# The Makefile's CFLAGS_COMMON, OPT, AVX2_FLAGS, AVX512_FLAGS and SAN_FLAGS: both compile
# src_c/ into build/obj/ (the sanitizer build into build/asan-obj/), so the lists must match.
C_FLAGS = ["-std=c11", "-fPIC", "-fopenmp", "-fvisibility=hidden", "-Wall", "-Wextra",
           "-Wno-unused-parameter", "-Iinclude"]
OPT = ["-O3"]
# -Wa,-mbranches-within-32B-boundaries keeps hot loops clear of the JCC-erratum
# slowdown on Skylake-derived CPUs (GNU as).  -fno-tree-loop-distribute-patterns:
# the kernels' short row copies stay inline vector loops instead of becoming a libc
# memcpy or memset call per row (bench/NOTES.md).
AVX2_FLAGS = ["-mavx2", "-mfma", "-fno-tree-loop-distribute-patterns",
              "-Wa,-mbranches-within-32B-boundaries"]
AVX512_FLAGS = ["-mavx512f"] + AVX2_FLAGS
# -fno-var-tracking-assignments: reports keep their files and lines, a debugger sees
# fewer locals, and the SGEMM's files compile in two thirds of the time
SAN_FLAGS = ["-O1", "-g", "-fno-var-tracking-assignments", "-fno-omit-frame-pointer",
             "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
SANITIZE = os.environ.get("MINIDL_SANITIZE") == "1"
if SANITIZE:
    OPT = SAN_FLAGS
OBJ_DIR = os.path.join("build", "asan-obj" if SANITIZE else "obj")
# the bindings (Cython's C): the core's flags; -fno-wrapv undoes Python's -fwrapv, so
# that UBSan checks signed overflow there too
EXT_FLAGS = [f for f in C_FLAGS if f not in ("-std=c11", "-Iinclude")] + OPT + (
    ["-fno-wrapv"] if SANITIZE else []) + ["-Wno-unused-function"]
LINK_FLAGS = ["-fopenmp"] + (["-fsanitize=address,undefined"] if SANITIZE else [])

CUDA_SOURCES = sorted(glob.glob("src_cuda/*.cu"))
# src_c/checks.h, optim_hp.h: what the CUDA files share with src_c (as ../src_c/X.h)
CUDA_HEADERS = sorted(glob.glob("src_cuda/*.cuh")) + ["src_c/checks.h", "src_c/optim_hp.h", "include/minidl.h",
                                                     "include/minidl_cuda.h"]
# sm_80 (A100) and sm_90 (H100) machine code, plus PTX the driver compiles for newer GPUs
CUDA_ARCH = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
             "-gencode", "arch=compute_90,code=compute_90"]
# the Makefile's NVCCFLAGS: both compile into build/cuda/, so the two lists must match
NVCC_FLAGS = ["-O3", "-std=c++17", "--compiler-options", "-fPIC,-fvisibility=hidden",
              "-Werror", "all-warnings", "-Iinclude"] + CUDA_ARCH


def find_nvcc():
    """nvcc on PATH, else in $CUDA_HOME/bin, else None; MINIDL_CUDA=0/1 forces off/on."""
    flag = os.environ.get("MINIDL_CUDA", "")
    if flag not in ("", "0", "1"):
        sys.exit(f"MINIDL_CUDA must be 0 or 1, got {flag!r}")
    if flag == "0":
        return None
    nvcc = shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME")
    if nvcc is None and home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        nvcc = os.path.join(home, "bin", "nvcc")
    if nvcc is None and flag == "1":
        sys.exit("MINIDL_CUDA=1 but nvcc is neither on PATH nor in $CUDA_HOME/bin: "
                 "install the CUDA toolkit or set CUDA_HOME")
    return nvcc


NVCC = None if SANITIZE else find_nvcc()
print("minidl: CUDA kernels " + (
    f"built with {NVCC}" if NVCC else "left out of the sanitizer build" if SANITIZE else
    "left out (MINIDL_CUDA=0)" if os.environ.get("MINIDL_CUDA") == "0" else
    "left out (no nvcc on PATH or in $CUDA_HOME/bin)"))


def parallel_map(fn, items):
    """fn over items on all the CPUs (each call runs a compiler): a list of the results."""
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(fn, items))


def compile_stale(command, sources, obj_dir, headers):
    """Each source to obj_dir/NAME.o by command(src, obj), a file per CPU at a time,
    skipped where the object is newer than its source and every header (as make's
    rules decide): the objects."""
    os.makedirs(obj_dir, exist_ok=True)
    newest_header = max(os.path.getmtime(h) for h in headers)

    def compile_one(src):
        obj = os.path.join(obj_dir, os.path.splitext(os.path.basename(src))[0] + ".o")
        if not (os.path.exists(obj) and
                os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_header)):
            subprocess.run(command(src, obj), check=True)
        return obj

    return parallel_map(compile_one, sources)


def build_cuda_library(lib_dir):
    """src_cuda/*.cu -> build/cuda/*.o -> lib_dir/libminidl_cuda.so."""
    objects = compile_stale(lambda src, obj: [NVCC] + NVCC_FLAGS + ["-c", src, "-o", obj],
                            CUDA_SOURCES, os.path.join("build", "cuda"), CUDA_HEADERS)
    # --exclude-libs: the static CUDA runtime's symbols stay private to the library
    subprocess.run([NVCC, "-shared", "-cudart", "static", "-Xlinker",
                    "--exclude-libs,ALL,-soname,libminidl_cuda.so", "-o",
                    os.path.join(lib_dir, "libminidl_cuda.so")] + objects, check=True)


def remove_cuda_files(package_dir):
    for path in (glob.glob(os.path.join(package_dir, "_cuda.*.so")) +
                 [os.path.join(package_dir, "lib", "libminidl_cuda.so"),
                  os.path.join(package_dir, "include", "minidl_cuda.h")]):
        if os.path.exists(path):
            os.remove(path)


class build_ext(_build_ext):
    def build_extensions(self):
        cc = self.compiler
        x86 = os.uname().machine in ("x86_64", "AMD64", "i686")
        sources = [src for src in CORE_SOURCES
                   if x86 or not src.endswith(("_avx2.c", "_avx512.c"))]

        # the Makefile's compiler (make's default, cc) and flags, into its objects
        cc_cmd = shlex.split(os.environ.get("CC", "cc"))
        objects = compile_stale(
            lambda src, obj: cc_cmd + C_FLAGS + OPT + (
                AVX2_FLAGS if src.endswith("_avx2.c") else
                AVX512_FLAGS if src.endswith("_avx512.c") else []) + ["-c", src, "-o", obj],
            sources, OBJ_DIR, CORE_HEADERS)
        lib_dir = os.path.join(self.build_lib, "minidl", "lib")
        inc_dir = os.path.join(self.build_lib, "minidl", "include")
        os.makedirs(lib_dir, exist_ok=True)
        os.makedirs(inc_dir, exist_ok=True)
        shutil.copy(os.path.join("include", "minidl.h"), inc_dir)
        cc.link_shared_object(objects, os.path.join(lib_dir, "libminidl.so"),
                              extra_postargs=LINK_FLAGS + ["-Wl,-soname,libminidl.so"],
                              libraries=["m"])
        cc.create_static_lib(objects, "minidl", output_dir=lib_dir)
        if NVCC:
            shutil.copy(os.path.join("include", "minidl_cuda.h"), inc_dir)
            build_cuda_library(lib_dir)
        else:  # nothing of an earlier CUDA build may end up in this one
            remove_cuda_files(os.path.join(self.build_lib, "minidl"))
        for ext in self.extensions:
            ext.extra_compile_args = EXT_FLAGS
            if ext.name == "minidl._cuda":  # links the CUDA library, found next to it at run time
                ext.library_dirs = [lib_dir]
                ext.extra_link_args = ["-Wl,-rpath,$ORIGIN/lib"]
                continue
            ext.extra_objects = objects
            ext.extra_link_args = LINK_FLAGS
        super().build_extensions()

    def copy_extensions_to_source(self):
        """For in-place builds, the libraries and header go next to minidl/_C too."""
        super().copy_extensions_to_source()
        if not NVCC:
            remove_cuda_files(os.path.join(HERE, "minidl"))
        for sub in ("lib", "include"):
            shutil.copytree(os.path.join(self.build_lib, "minidl", sub),
                            os.path.join(HERE, "minidl", sub), dirs_exist_ok=True)


def cython_extensions():
    from Cython.Build import cythonize
    # depends: relink _C whenever a core source or header changes
    import numpy
    # NumPy's C API: the bindings read an array's data pointer from the array itself
    exts = [Extension("minidl._C", ["minidl/_C.pyx"],
                      include_dirs=["include", numpy.get_include()], libraries=["m"],
                      define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                      depends=CORE_SOURCES + CORE_HEADERS)]
    if NVCC:
        exts.append(Extension("minidl._cuda", ["minidl/_cuda.pyx"], include_dirs=["include"],
                              libraries=["minidl_cuda"], depends=CUDA_SOURCES + CUDA_HEADERS))
    return cythonize(exts, language_level=3, compiler_directives={
        "boundscheck": False, "wraparound": False, "initializedcheck": False})


setup(ext_modules=cython_extensions(), cmdclass={"build_ext": build_ext},
      package_data={"minidl": ["include/*.h", "lib/*.so", "lib/*.a"]})
