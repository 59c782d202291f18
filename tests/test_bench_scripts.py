"""bench/bench_cpu.py's and bench/bench_layers.py's arithmetic and tables, on made-up
samples (no torch, no timing), bench/bench_gemm.py's SGEMM case, (where torch is
installed) bench/torch_nets.py's per-layer profile, bench/bench_conv.py's off-path
shapes (and PyTorch's, where installed), and bench/'s C programs."""
import json
import os
import shutil
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench")
sys.path.insert(0, BENCH)
import bench_cpu  # noqa: E402


def _run(rnd, variant, train, infer, rss):
    return {"round": rnd, "variant": variant,
            "result": {"train_images_per_s": train, "infer_images_per_s": infer,
                       "peak_rss_mb": rss}}


def _fake_runs():
    # round 1: NCHW is torch's faster layout for training; round 2: channels_last
    return [
        _run(1, "minidl", 300, 900, 90), _run(1, "torch_nchw", 200, 1000, 380),
        _run(1, "torch_channels_last", 100, 500, 360), _run(1, "minidl_1thread", 150, 500, 80),
        _run(2, "minidl", 200, 800, 92), _run(2, "torch_nchw", 100, 400, 370),
        _run(2, "torch_channels_last", 160, 1000, 350), _run(2, "minidl_1thread", 125, 400, 81),
        # an incomplete round: left out of the ratios, kept in the per-variant statistics
        _run(3, "minidl", 1000, 1000, 95),
        {"round": 3, "variant": "torch_nchw", "result": None, "error": "exit status 1"},
    ]


def test_stats_median_min_max():
    assert bench_cpu.stats([3, 1, 2, 10]) == {"median": 2.5, "min": 1, "max": 10,
                                              "samples": [3, 1, 2, 10]}
    assert bench_cpu.stats([])["median"] is None


def test_round_ratios_use_the_faster_layout_of_each_round():
    pairs = bench_cpu.round_ratios(_fake_runs(), "train_images_per_s")
    assert pairs == [(1.5, "torch_nchw"), (1.25, "torch_channels_last")]
    only_nchw = bench_cpu.round_ratios(_fake_runs(), "infer_images_per_s", den=("torch_nchw",))
    assert [p[0] for p in only_nchw] == [0.9, 2.0]


def test_summarise_net():
    s = bench_cpu.summarise_net(_fake_runs())
    assert s["variants"]["minidl"]["train_images_per_s"]["samples"] == [300, 200, 1000]
    assert s["variants"]["torch_nchw"]["peak_rss_mb"]["median"] == 375
    r = s["ratios"]
    assert r["train_vs_torch_best"]["median"] == pytest.approx(1.375)
    assert r["train_torch_best_per_round"] == ["torch_nchw", "torch_channels_last"]
    assert r["infer_vs_torch_best"]["samples"] == [0.9, 0.8]
    assert r["threads_speedup"]["samples"] == [2.0, 1.6]


def test_summarise_gemm_and_verdicts():
    rows = [{"m": 1000, "n": 1000, "k": 1000, "kind": "square",
             "minidl_s": [0.02, 0.025, 0.01], "numpy_s": [0.025, 0.02, 0.02],
             "torch_s": [0.01, 0.05]},  # PyTorch stopped after two rounds
            {"m": 10, "n": 100, "k": 5, "kind": "conv", "minidl_s": [1e-5], "numpy_s": [5e-6]},
            {"m": 16, "n": 27, "k": 4800, "kind": "conv", "label": "resnet20 conv1 bwd-w",
             "trans_a": False, "trans_b": True, "minidl_s": [4e-5], "numpy_s": [4e-5]}]
    g = bench_cpu.summarise_gemm(rows, peak_gflops=200.0)
    assert g[2]["label"] == "resnet20 conv1 bwd-w" and g[2]["trans_b"] is True
    assert bench_cpu.gemm_name(g[2], " x ") == "16 x 27 x 4800 NT (resnet20 conv1 bwd-w)"
    assert g[0]["minidl_gflops"]["median"] == pytest.approx(100.0)   # 2e9 flop / 0.02 s
    assert g[0]["minidl_pct_peak"] == pytest.approx(50.0)
    assert g[0]["vs_numpy"]["samples"] == pytest.approx([1.25, 0.8, 2.0])
    # PyTorch's samples pair with minidl's of the same rounds
    assert g[0]["vs_torch"]["samples"] == pytest.approx([0.5, 2.0])
    assert g[0]["torch_gflops"]["median"] == pytest.approx(120.0)   # 200 and 40 GFLOP/s
    assert g[0]["torch_pct_peak"] == pytest.approx(60.0)
    assert g[1]["torch_gflops"]["median"] is None and g[1]["torch_pct_peak"] is None
    assert bench_cpu.summarise_gemm(rows, None)[0]["minidl_pct_peak"] is None

    nets = {"net": {"batch_size": 8, "summary": bench_cpu.summarise_net(_fake_runs())}}
    v = {(x["goal"], x["subject"]): x for x in bench_cpu.verdicts(nets, g, threads=2)}
    assert v["train_vs_torch", "net, batch 8"]["pass"] is False       # 1.375 < 1.5
    assert v["infer_vs_torch", "net, batch 8"]["pass"] is False
    assert v["threads_speedup", "net, batch 8"]["value"] == pytest.approx(1.8)
    assert v["threads_speedup", "net, batch 8"]["pass"] is True       # 1.8 >= 1.8
    assert v["rss_vs_torch", "net, batch 8"]["value"] == pytest.approx(92 / 355)
    assert v["rss_vs_torch", "net, batch 8"]["pass"] is True
    assert v["gemm_square_pct_peak", "sgemm 1000x1000x1000 (square), 2 threads"]["pass"] is False
    assert v["gemm_vs_numpy", "sgemm 1000x1000x1000 (square), 2 threads"]["pass"] is True  # 1.25
    assert v["gemm_vs_numpy", "sgemm 10x100x5 (conv), 2 threads"]["pass"] is False
    # 2 x 16 x 27 x 4800 flop in 40 us: 103.7 GFLOP/s, 52% of 200
    assert v["gemm_conv_pct_peak", "sgemm 16x27x4800 NT (resnet20 conv1 bwd-w), 2 threads"][
        "value"] == pytest.approx(51.84)
    # no peak measured: the %-of-peak goals are not decided
    v = bench_cpu.verdicts(nets, bench_cpu.summarise_gemm(rows, None), threads=2)
    assert [x["pass"] for x in v if x["goal"].endswith("pct_peak")] == [None, None, None]


def _fake_results():
    nets = {"cifar10_quick": {"batch_size": 100, "runs": _fake_runs()}}
    nets["cifar10_quick"]["summary"] = bench_cpu.summarise_net(nets["cifar10_quick"]["runs"])
    rows = [{"m": 512, "n": 512, "k": 512, "kind": "square", "minidl_s": [0.002, 0.003],
             "numpy_s": [0.003, 0.003], "torch_s": [0.004, 0.003]},
            {"m": 64, "n": 64, "k": 64, "kind": "square", "minidl_s": [1e-5], "numpy_s": [1e-5]}]
    gemm = bench_cpu.summarise_gemm(rows, 100.0)
    return {"benchmark": "cpu",
            "machine": {"cpu": "Test CPU", "date": "2026-01-02T03:04:05", "git_commit": "abcdef123",
                        "minidl_simd": "avx2", "torch_version": "2.13.0+cpu",
                        "loadavg_start": [0.5, 0.4, 0.3], "loadavg_end": [1.0, 0.5, 0.3]},
            "config": {"threads": 2, "repeats": 3},
            "nets": nets, "fma_peak": {"peak_gflops": 100.0},
            "gemm": {"rows": rows, "summary": gemm},
            "verdicts": bench_cpu.verdicts(nets, gemm, threads=2)}


def test_markdown_tables():
    md = bench_cpu.render_markdown(_fake_results())
    assert md.startswith("Test CPU, 2 threads, minidl avx2, PyTorch 2.13.0+cpu, commit abcdef1, "
                         "2026-01-02, 3 rounds")
    assert "| cifar10_quick, 100 | train images/s | 300 [200, 1,000] | 150 [100, 200] | " \
           "130 [100, 160] | 1.38 [1.25, 1.50] |" in md
    assert "| cifar10_quick, 100 | peak RSS MB | 92 | 375 | 355 | |" in md
    assert "2 / 1 thread: 1.80 [1.60, 2.00] |" in md
    # 2 x 512^3 flop in 2 and 3 ms: 134 and 89 GFLOP/s, median 112, 112% of the 100 measured
    # PyTorch in 4 and 3 ms: 67 and 89 GFLOP/s; minidl / PyTorch 2.0 and 1.0
    assert "| 512 x 512 x 512 (square) | 112 [89, 134] | 112% | 89 [89, 89] | 1.25 [1.00, 1.50] " \
           "| 78 [67, 89] | 78% | 1.50 [1.00, 2.00] |" in md
    # a result without PyTorch's column (older files, or no --torch-python)
    assert "| 64 x 64 x 64 (square) | 52 [52, 52] | 52% | 52 [52, 52] | 1.00 [1.00, 1.00] " \
           "| - | - | - |" in md
    assert "| training images/s, minidl / PyTorch's faster layout | cifar10_quick, batch 100 | " \
           "1.38x | >= 1.50x | **fail** |" in md
    assert "| SGEMM, % of the measured FMA peak | sgemm 512x512x512 (square), 2 threads | 112% | " \
           ">= 85% | pass |" in md
    assert md.endswith("5 of 8 goals met.")
    assert "**" not in bench_cpu.format_text(_fake_results())


def test_markdown_command_line(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(_fake_results()))
    out = subprocess.run([sys.executable, os.path.join(BENCH, "bench_cpu.py"), "--markdown",
                          str(path)], capture_output=True, text=True, check=True).stdout
    assert out == bench_cpu.render_markdown(_fake_results()) + "\n"


def test_child_commands_name_simd_and_threads():
    cmd = bench_cpu.minidl_command("resnet20", 128, 10, 3, 1, "avx2", python="py")
    assert cmd[:4] == ["env", "MINIDL_SIMD=avx2", "OMP_NUM_THREADS=1", "py"]
    assert cmd[cmd.index("--threads") + 1] == "1" and "--json" in cmd
    cmd = bench_cpu.torch_command("tpy", "resnet20", 128, 10, 3, 2, channels_last=True)
    assert "OMP_NUM_THREADS=2" in cmd and cmd[-1] == "--channels-last"


def test_torch_gemm_child_that_ends_is_an_error():
    # an interpreter that exits at once: no first line, a clear error, no hang
    with pytest.raises(bench_cpu.RunFailed, match="torch_gemm.py ended"):
        bench_cpu.TorchGemm("false", threads=1)


_STAND_IN = """import json, sys
print(json.dumps({"torch_version": "0.0", "blas": "none"}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["m"] < 0:
        out = {"failed": "ValueError: m < 0"}
    else:
        out = {"seconds": req["m"] * 1e-6, "error": 0.5 if req["m"] == 7 else 1e-7}
    print(json.dumps(out), flush=True)
"""


def test_torch_gemm_client_against_a_stand_in(tmp_path):
    """TorchGemm's side of the protocol, against a child that answers as
    bench/torch_gemm.py does (given as the interpreter, it ignores the script's path)."""
    child = tmp_path / "stand_in"
    child.write_text(f"#!{sys.executable}\n" + _STAND_IN)
    child.chmod(0o755)
    torch = bench_cpu.TorchGemm(str(child), threads=1)
    try:
        assert torch.info == {"torch_version": "0.0", "blas": "none"}
        row = {"m": 5, "n": 40, "k": 7, "trans_a": False, "trans_b": True, "kind": "conv",
               "label": "a layer"}  # a row of run_gemm
        assert torch.seconds(row, min_time=0.01, settle=0, seed=1) == pytest.approx(5e-6)
        with pytest.raises(bench_cpu.RunFailed, match="torch_gemm.py: ValueError: m < 0"):
            torch.seconds({**row, "m": -1}, min_time=0.01, settle=0, seed=1)
        # a product too far from float64 is an error, not a sample
        with pytest.raises(bench_cpu.RunFailed, match=r"7x40x7 NT \(a layer\) is 0.5 from the float64 product"):
            torch.seconds({**row, "m": 7}, min_time=0.01, settle=0, seed=1)
        assert torch.seconds(row, min_time=0.01, settle=0, seed=2) == pytest.approx(5e-6)
    finally:
        torch.close()
    assert torch.proc.returncode == 0


@pytest.mark.external
def test_torch_gemm_child_times_checks_and_reports_errors():
    """The real bench/torch_gemm.py where an interpreter with torch is at hand."""
    from bench_train import default_torch_python
    python = default_torch_python()
    if python is None:
        pytest.skip("no interpreter with torch (set TORCH_PYTHON)")
    child = bench_cpu.TorchGemm(python, threads=1)
    try:
        assert child.info["torch_version"] and child.info["blas"]
        row = {"m": 5, "n": 40, "k": 7, "trans_a": True, "trans_b": True}
        assert 0 < child.seconds(row, min_time=0.001, settle=0, seed=1) < 0.01
        with pytest.raises(bench_cpu.RunFailed, match="torch_gemm.py: RuntimeError"):
            child.seconds({**row, "m": -1}, min_time=0.001, settle=0, seed=1)
        # the child goes on after a failed request
        assert child.seconds(row, min_time=0.001, settle=0, seed=2) > 0
    finally:
        child.close()
    assert child.proc.returncode == 0


def test_gemm_case_records_the_operands_layout():
    import numpy as np
    import bench_gemm
    from minidl import _C
    case = bench_gemm.make_case(np, _C, 5, 40, 7, np.random.default_rng(0), ta=True)
    assert case.error() < 1e-4
    layout = case.layout
    assert 0 <= layout["c_after_b_mod_4k"] < 4096
    assert len(layout["line_offsets"]) == 3
    assert all(0 <= x < 64 and x % 4 == 0 for x in layout["line_offsets"])


def test_gemm_against_another_build_times_the_same_product():
    """--against: another tree's minidl._C (here the one imported, found through its
    tree) computes the same product on the same operands into an output of its own."""
    import os
    import numpy as np
    import bench_gemm
    import minidl
    from minidl import _C
    threads = minidl.get_num_threads()
    try:  # the same library as _C: its thread count is this process's
        other = bench_gemm.load_other(os.path.dirname(os.path.dirname(minidl.__file__)), 1)
        case = bench_gemm.make_case(np, _C, 16, 300, 40, np.random.default_rng(0), other=other)
        assert case.error() < 1e-4
    finally:
        minidl.set_num_threads(threads)
    with pytest.raises(SystemExit, match="no built"):
        bench_gemm.load_other(os.path.dirname(__file__), 1)


def _layers_round(scale):
    """One round of bench_layers.py's three runs, made up: minidl names its residual
    addition "add", PyTorch "add1", and only PyTorch has a Flatten."""
    mdl = [("conv1", "Conv2d"), ("relu", "ReLU"), ("layer1.0.conv1", "Conv2d"),
           ("layer1.0.add", "Add"), ("layer1.0.relu2", "ReLU")]
    tch = [("conv1", "Conv2d"), ("relu1", "ReLU"), ("layer1.0.conv1", "Conv2d"),
           ("layer1.0.add1", "Add"), ("layer1.0.relu1", "ReLU"), ("flatten1", "Flatten")]

    def run(names, f):
        return [{"name": n, "kind": k, "forward_ms": f * (i + 1), "backward_ms": 2 * f * (i + 1)}
                for i, (n, k) in enumerate(names)]
    return {"minidl": {"train_step_ms": 40.0 * scale, "layers": run(mdl, scale)},
            "torch_nchw": {"profiled_step_ms": 400.0 * scale, "layers": run(tch, 2 * scale)},
            "torch_channels_last": {"profiled_step_ms": 300.0 * scale, "layers": run(tch, scale)}}


def test_bench_layers_matches_layers_by_module_kind_and_rank():
    import bench_layers
    rounds = [_layers_round(1.0), _layers_round(3.0), _layers_round(2.0)]
    rows = {r["name"]: r for r in bench_layers.summarise(rounds)}
    # medians over the rounds (scales 1, 3, 2: the median is 2)
    assert rows["conv1"]["minidl"] == {"forward": 2.0, "backward": 4.0}
    assert rows["conv1"]["torch_nchw"] == {"forward": 4.0, "backward": 8.0}
    # "layer1.0.add" (minidl) and "layer1.0.add1" (PyTorch) are one row; the block's
    # first ReLU in PyTorch meets minidl's "layer1.0.relu2", its only one
    assert rows["layer1.0.add"]["torch_channels_last"] == {"forward": 8.0, "backward": 16.0}
    assert rows["layer1.0.relu2"]["torch_nchw"]["forward"] == 20.0
    assert rows["relu"]["torch_nchw"]["forward"] == 8.0
    # a layer only PyTorch has comes last, under its own name, "-" for minidl
    assert list(rows)[-1] == "flatten1" and rows["flatten1"]["minidl"]["forward"] is None
    text = bench_layers.markdown({"threads": 2, "nets": [
        {"model": "resnet20", "batch_size": 8, "rounds": rounds,
         "rows": bench_layers.summarise(rounds)}]})
    assert "| flatten1 | Flatten | - / - | 24.00 / 48.00 | 12.00 / 24.00 |" in text
    # kinds summed; the rest of PyTorch's NCHW step: 800 - (4 + 8 + ... + 24) * 3
    assert "| Conv2d | 8.0 / 16.0 | 16.0 / 32.0 | 8.0 / 16.0 |" in text
    assert "| the rest of the step (loss, optimizer, framework) | - | 548.0 | 474.0 |" in text


@pytest.mark.external
def test_torch_layer_times_names_every_layer():
    """PyTorch's profiler, layer by layer (bench/torch_nets.py --layers): leaf modules
    under their state_dict names, the functional ReLUs and additions by block and rank,
    each with a forward and (the loss aside) a backward of its own."""
    pytest.importorskip("torch")
    import torch_nets
    r = torch_nets.torch_layer_times("resnet20", batch_size=4, steps=1, threads=1, warmup=1)
    rows = {row["name"]: row for row in r["layers"]}
    convs = [n for n, row in rows.items() if row["kind"] == "Conv2d"]
    assert len(convs) == 21 and "layer2.0.downsample.0" in convs
    for name in ("relu1", "layer1.0.relu1", "layer1.0.relu2", "layer3.2.add1", "fc",
                 "layer2.0.bn2", "globalavgpool2d1"):
        assert rows[name]["forward_ms"] > 0 and rows[name]["backward_ms"] > 0, name
    assert {row["kind"] for row in r["layers"]} == {
        "Conv2d", "BatchNorm2d", "ReLU", "Add", "GlobalAvgPool2d", "Flatten", "Linear"}
    assert 0 < sum(row["forward_ms"] + row["backward_ms"] for row in r["layers"]) \
        < r["profiled_step_ms"]
    q = torch_nets.torch_layer_times("cifar10_quick", batch_size=2, steps=1, threads=1,
                                     warmup=0, channels_last=True)
    assert [row["name"] for row in q["layers"]] == [
        "conv1", "pool1", "relu1", "conv2", "relu2", "pool2", "conv3", "relu3", "pool3",
        "flatten1", "ip1", "ip2"]
    # vgg11_bn's modules are named as minidl's layers
    from minidl import models
    v = torch_nets.torch_layer_times("vgg11_bn", batch_size=2, steps=1, threads=1, warmup=0)
    assert [row["name"] for row in v["layers"]] == [
        name for name, _, _ in models.spec("vgg11_bn")["layers"]]


@pytest.mark.external
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_bench_c_programs_build_and_sgemm_c_runs(tmp_path):
    """bench/'s C programs compile as their headers say; sgemm_c times mdl_sgemm for a
    square and for an m x n x k shape and rejects other arguments."""
    flags = subprocess.run([sys.executable, "-m", "minidl", "--cflags", "--libs"],
                           capture_output=True, text=True, check=True).stdout.split()
    for name, extra in [("fma_peak", []), ("omp_wake", ["-fopenmp"]), ("sgemm_c", flags)]:
        subprocess.run(["cc", "-O2", "-Wall", "-Werror", os.path.join(BENCH, name + ".c"),
                        "-o", str(tmp_path / name), *extra], check=True)
    sgemm = str(tmp_path / "sgemm_c")
    for args in (["64", "1", "0.02"], ["16", "100", "27", "2", "0.02"]):
        out = subprocess.run([sgemm, *args], capture_output=True, text=True, check=True)
        assert float(out.stdout) > 0
    assert subprocess.run([sgemm, "64", "1"], capture_output=True).returncode == 2


def test_bench_conv_times_every_off_path_shape_and_direction():
    import importlib.util

    import bench_conv
    sets = [bench_conv.measure(1, 1, "off-path")]
    if importlib.util.find_spec("torch"):
        sets.append(bench_conv.measure_torch(1, 1, "off-path"))
    for res in sets:
        assert list(res) == [row[0] for row in bench_conv.OFF_PATH]
        for row in res.values():
            assert set(row) == set(bench_conv.OPS) and all(v["ms"] > 0 for v in row.values())
