"""``python -m minidl --cflags --libs``: compiler and linker flags for the C core
installed with this package (like ``pkg-config --cflags --libs minidl``)."""
import argparse
import sys

import minidl


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidl", description=__doc__)
    parser.add_argument("--cflags", action="store_true", help="print the include flags")
    parser.add_argument("--libs", action="store_true",
                        help="print the flags that link libminidl.so (with an rpath)")
    parser.add_argument("--version", action="store_true", help="print the version")
    args = parser.parse_args(argv)
    if not (args.cflags or args.libs or args.version):
        parser.print_help()
        return 2
    out = []
    if args.version:
        out.append(minidl.__version__)
    if args.cflags:
        out.append(f"-I{minidl.get_include()}")
    if args.libs:
        lib = minidl.get_library_dir()
        out.append(f"-L{lib} -Wl,-rpath,{lib} -lminidl")
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
