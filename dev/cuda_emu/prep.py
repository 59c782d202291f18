"""src_cuda/*.cu -> OUT/*.cpp and *.cuh copies, each kernel<<<cfg>>>(args) turned into
emu_launch(cfg, kernel, args) for dev/cuda_emu/cuda_runtime.h."""
import pathlib
import re
import sys

src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
launch = re.compile(r"(?P<k>[\w:]+(?:<[^;]*?>)?)<<<(?P<cfg>.*?)>>>\(", re.S)
for f in sorted(src.glob("*.cu")) + sorted(src.glob("*.cuh")):
    text = launch.sub(lambda m: f"emu_launch({m.group('cfg')}, {m.group('k')}, ", f.read_text())
    (out / (f.stem + ".cpp" if f.suffix == ".cu" else f.name)).write_text(text)
