"""Build minidl: the C core (src_c/) is compiled once and linked three ways --
into the Python extension minidl._C, into minidl/lib/libminidl.so and into
minidl/lib/libminidl.a -- and the public header is copied to minidl/include/,
so that other tools can link the copy installed with the package
(`python -m minidl --cflags --libs`).

Files named *_avx2.c get -mavx2 -mfma; everything else is built for the
baseline CPU, and the kernels pick the AVX2 versions at run time.
MINIDL_SANITIZE=1 builds with AddressSanitizer and UBSan.
"""
import glob
import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CORE_SOURCES = sorted(glob.glob("src_c/*.c"))
CORE_HEADERS = sorted(glob.glob("src_c/*.h")) + ["include/minidl.h"]
BASE_FLAGS = ["-std=c11", "-O3", "-fopenmp", "-fvisibility=hidden", "-Wall", "-Wextra",
              "-Wno-unused-parameter"]
# -Wa,-mbranches-within-32B-boundaries keeps hot loops clear of the JCC-erratum
# slowdown on Skylake-derived CPUs (GNU as).
AVX2_FLAGS = ["-mavx2", "-mfma", "-Wa,-mbranches-within-32B-boundaries"]
SANITIZE = os.environ.get("MINIDL_SANITIZE") == "1"
if SANITIZE:
    BASE_FLAGS = [f for f in BASE_FLAGS if f != "-O3"] + [
        "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all"]
LINK_FLAGS = ["-fopenmp"] + (["-fsanitize=address,undefined"] if SANITIZE else [])


class build_ext(_build_ext):
    def build_extensions(self):
        cc = self.compiler
        x86 = os.uname().machine in ("x86_64", "AMD64", "i686")
        objects = []
        for src in CORE_SOURCES:
            avx2 = src.endswith("_avx2.c")
            if avx2 and not x86:
                continue
            flags = BASE_FLAGS + (AVX2_FLAGS if avx2 else [])
            objects += cc.compile([src], output_dir=self.build_temp, include_dirs=["include"],
                                  depends=CORE_HEADERS, extra_postargs=flags + ["-fPIC"])
        lib_dir = os.path.join(self.build_lib, "minidl", "lib")
        inc_dir = os.path.join(self.build_lib, "minidl", "include")
        os.makedirs(lib_dir, exist_ok=True)
        os.makedirs(inc_dir, exist_ok=True)
        shutil.copy(os.path.join("include", "minidl.h"), inc_dir)
        cc.link_shared_object(objects, os.path.join(lib_dir, "libminidl.so"),
                              extra_postargs=LINK_FLAGS + ["-Wl,-soname,libminidl.so"],
                              libraries=["m"])
        cc.create_static_lib(objects, "minidl", output_dir=lib_dir)
        for ext in self.extensions:
            ext.extra_objects = objects
            ext.extra_compile_args = [f for f in BASE_FLAGS if f != "-std=c11"] + ["-Wno-unused-function"]
            ext.extra_link_args = LINK_FLAGS
        super().build_extensions()

    def copy_extensions_to_source(self):
        """For in-place builds, the libraries and header go next to minidl/_C too."""
        super().copy_extensions_to_source()
        for sub in ("lib", "include"):
            shutil.copytree(os.path.join(self.build_lib, "minidl", sub),
                            os.path.join(HERE, "minidl", sub), dirs_exist_ok=True)


def cython_extensions():
    from Cython.Build import cythonize
    # depends: relink _C whenever a core source or header changes
    ext = Extension("minidl._C", ["minidl/_C.pyx"], include_dirs=["include"], libraries=["m"],
                    depends=CORE_SOURCES + CORE_HEADERS)
    return cythonize([ext], language_level=3, compiler_directives={
        "boundscheck": False, "wraparound": False, "initializedcheck": False})


setup(ext_modules=cython_extensions(), cmdclass={"build_ext": build_ext},
      package_data={"minidl": ["include/*.h", "lib/*.so", "lib/*.a"]})
