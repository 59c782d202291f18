"""Where a training step's time goes, layer by layer: minidl against PyTorch's profiler.

    python3 bench/bench_layers.py [--models cifar10_quick:100,resnet20:128] [--threads 2]
        [--repeats 3] [--torch-python PY] [--json bench/results/layers-DATE-COMMIT.json]
    python3 bench/bench_layers.py --markdown bench/results/layers-DATE-COMMIT.json

Per net, --repeats rounds of three fresh processes in turn: `python -m minidl bench
--json` (its field `layers`: forward and backward ms per layer over separately timed
steps, fusion on as by default), and bench/torch_nets.py --layers in NCHW and in
channels_last (PyTorch's profiler, torch_layer_times: every module's forward in a
profiler range, each layer's backward the autograd functions its forward ops
created).  A layer's figures are medians over the rounds.  Rows are matched by the
module that holds the layer, its kind and its rank among that module's layers of
that kind, so minidl's "layer1.0.add" meets PyTorch's "layer1.0.add1" (the
residual +); a layer that one side does not have shows "-".  "The rest of the step" is
PyTorch's profiled step less its layers (loss, autograd's bookkeeping, the SGD step);
minidl times its layers in steps of their own, so it has no such figure.
With fusion, minidl's BatchNorm and ReLU layers mostly cost nothing of their own: the
convolutions and the residual additions do their work (bench/NOTES.md).
"""
import argparse
import datetime
import json
import os
import statistics
import sys

from bench_cpu import minidl_command, portable, torch_command  # bench/
from bench_train import RunFailed, default_torch_python, parse_models, run_json
from machine import cpu_model, git_commit

VARIANTS = ("minidl", "torch_nchw", "torch_channels_last")
LABELS = {"minidl": "minidl", "torch_nchw": "PyTorch NCHW",
          "torch_channels_last": "PyTorch channels_last"}


def keyed(layers: list) -> dict:
    """{(parent module, kind, rank among the parent's layers of that kind): layer}."""
    out, seen = {}, {}
    for layer in layers:
        parent = layer["name"].rpartition(".")[0]
        rank = seen[parent, layer["kind"]] = seen.get((parent, layer["kind"]), 0) + 1
        out[parent, layer["kind"], rank] = layer
    return out


def summarise(rounds: list) -> list:
    """Rows in minidl's layer order (then PyTorch's extra layers): name, kind and, per
    variant, the median forward and backward ms over the rounds (None where absent)."""
    runs = {v: [keyed(r[v]["layers"]) for r in rounds] for v in VARIANTS}
    names = {}  # in insertion order: minidl's layers first
    for variant in VARIANTS:
        for run in runs[variant]:
            for key, layer in run.items():
                names.setdefault(key, (layer["name"], layer["kind"]))
    rows = []
    for key, (name, kind) in names.items():
        row = {"name": name, "kind": kind}
        for variant in VARIANTS:
            got = [run[key] for run in runs[variant] if key in run]
            row[variant] = {ph: statistics.median(g[f"{ph}_ms"] for g in got) if got else None
                            for ph in ("forward", "backward")}
        rows.append(row)
    return rows


def kind_totals(rows: list) -> dict:
    """{kind: {variant: [forward ms, backward ms]}} summed over the rows."""
    out = {}
    for row in rows:
        k = out.setdefault(row["kind"], {v: [0.0, 0.0] for v in VARIANTS})
        for v in VARIANTS:
            for i, ph in enumerate(("forward", "backward")):
                k[v][i] += row[v][ph] or 0.0
    return out


def step_ms(rounds: list, variant: str) -> float:
    key = "train_step_ms" if variant == "minidl" else "profiled_step_ms"
    return statistics.median(r[variant][key] for r in rounds)


def _ms(v):
    return "-" if v is None else f"{v:.2f}"


def markdown(data: dict) -> str:
    lines = []
    for net in data["nets"]:
        rows, rounds = net["rows"], net["rounds"]
        head = " | ".join(f"{LABELS[v]} fwd / bwd" for v in VARIANTS)
        steps = ", ".join(f"{LABELS[v]} {step_ms(rounds, v):.1f}" for v in VARIANTS)
        lines += [f"**{net['model']}**, batch {net['batch_size']}, {data['threads']} threads "
                  f"(ms per training step: {steps}; PyTorch's under its profiler)", "",
                  f"| kind | {head} |", "|---|" + "---|" * len(VARIANTS)]
        totals = kind_totals(rows)
        for kind, t in totals.items():
            lines.append(f"| {kind} | " + " | ".join(f"{t[v][0]:.1f} / {t[v][1]:.1f}"
                                                     for v in VARIANTS) + " |")
        rest = [step_ms(rounds, v) - sum(sum(t[v]) for t in totals.values())
                for v in VARIANTS[1:]]
        lines.append("| the rest of the step (loss, optimizer, framework) | - | "
                     + " | ".join(f"{r:.1f}" for r in rest) + " |")
        lines += ["", f"| layer | kind | {head} |", "|---|---|" + "---|" * len(VARIANTS)]
        for row in rows:
            lines.append(f"| {row['name']} | {row['kind']} | " + " | ".join(
                f"{_ms(row[v]['forward'])} / {_ms(row[v]['backward'])}" for v in VARIANTS) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", type=parse_models, default="cifar10_quick:100,resnet20:128",
                   help="comma-separated NAME:BATCH_SIZE (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed (profiled) steps per run")
    p.add_argument("--simd", default="avx512", help="minidl's SIMD level (MINIDL_SIMD)")
    p.add_argument("--torch-python", default=default_torch_python(),
                   help="a Python with torch (default: $TORCH_PYTHON, else this one if it "
                        "has torch)")
    p.add_argument("--json", help="write the rounds, the medians and machine info here")
    p.add_argument("--markdown", metavar="JSON", help="print the tables of a saved run and exit")
    args = p.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return 0
    if not args.torch_python:
        p.error("no Python with torch: pass --torch-python or set TORCH_PYTHON")
    env = dict(os.environ)
    data = {"date": datetime.date.today().isoformat(), "commit": git_commit(),
            "cpu": cpu_model(), "threads": args.threads, "simd": args.simd, "nets": []}
    try:
        for model, batch in args.models:
            cmds = {"minidl": minidl_command(model, batch, args.steps, 3, args.threads, args.simd)}
            for v, cl in (("torch_nchw", False), ("torch_channels_last", True)):
                cmds[v] = torch_command(args.torch_python, model, batch, args.steps, 3,
                                        args.threads, cl) + ["--layers"]
            rounds = []
            for rnd in range(args.repeats):
                rounds.append({v: run_json(cmds[v], f"{model} {v}", env, 1800,
                                           required=("train_step_ms",) if v == "minidl"
                                           else ("profiled_step_ms",))
                               for v in VARIANTS})
                print(f"{model}: round {rnd + 1} of {args.repeats} done", file=sys.stderr)
            data["nets"].append({"model": model, "batch_size": batch, "rounds": rounds,
                                 "rows": summarise(rounds),
                                 "commands": {v: portable(" ".join(c), args.torch_python)
                                              for v, c in cmds.items()}})
    except RunFailed as e:
        print(e, file=sys.stderr)
        return 1
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
