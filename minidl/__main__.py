"""``python -m minidl``: the minidl command (see minidl.cli)."""
import sys

from minidl.cli import main

if __name__ == "__main__":
    sys.exit(main())
