#!/usr/bin/env python3
"""strata's host training step against PyTorch eager, side by side on the same CPU.

For each shape of bench_train_step (gpt2_train's default "small" and the 6-layer "medium"),
starts three servers that hold a model each and run training steps on request: strata fp32 and
bf16 (bench_train_step --serve) and the PyTorch GPT-2 of torch_gpt2.py (same shape, batch,
AdamW, clipping, thread count; --serve). Each round asks every server in turn, in a rotating
order, for about --slice seconds of steps, so the three sides are timed within seconds of each
other: on a shared machine the speed of all of them drifts by 20% and more from one minute to
the next, and runs minutes apart compare the machine, not the code. Prints each side's median
tokens/s, and the ratios strata fp32 / PyTorch and bf16 / fp32 within each round with their
median. A developer tool, not part of CI (docs/profiling.md):

  cmake --build build --target bench_train_step
  python3 bench/side_by_side/run.py --build build --threads 2 --rounds 15

Without torch installed, the PyTorch column says so and the strata columns still print.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

SHAPES = {  # name: layers, d_model, heads, seq, vocab, batch (bench_train_step's shapes)
    "small": (3, 96, 4, 64, 256, 16),
    "medium": (6, 384, 6, 256, 8192, 8),
}


class Server:
    """A process that builds one model, says "ready", then answers each N with N steps' seconds."""

    def __init__(self, name, argv, env):
        self.name = name
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline().strip()
        self.skipped = None
        if first != "ready":
            self.skipped = json.loads(first).get("skipped", first) if first.startswith("{") else f"no server: {first!r}"
            self.proc.wait()

    def seconds(self, steps):
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"side_by_side: the {self.name} server stopped")
        return float(line)

    def close(self):
        if self.skipped is None:
            self.proc.stdin.write("0\n")
            self.proc.stdin.close()
            self.proc.wait()


def measure(shape, a, binary, env):
    layers, d, heads, seq, vocab, batch = shape
    name = next(k for k, v in SHAPES.items() if v == shape)
    torch_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_gpt2.py")
    torch_argv = [sys.executable, torch_script, "--layers", str(layers), "--d-model", str(d), "--heads", str(heads),
                  "--seq", str(seq), "--vocab", str(vocab), "--batch", str(batch), "--threads", str(a.threads),
                  "--optimizer", a.torch_optimizer, "--serve"]
    servers = [Server("fp32", [binary, "--serve", name, "fp32"], env),
               Server("torch", torch_argv, env),
               Server("bf16", [binary, "--serve", name, "bf16"], env)]
    if a.compile:
        servers.insert(2, Server("compiled", torch_argv + ["--compile"], env))
    live = [s for s in servers if s.skipped is None]
    # Steps per request: about --slice seconds each, from one timed step.
    steps = {s.name: max(1, round(a.slice / s.seconds(1))) for s in live}
    rates = {s.name: [] for s in servers}
    for r in range(a.rounds):
        for s in live[r % len(live):] + live[:r % len(live)]:
            rates[s.name].append(steps[s.name] * batch * seq / s.seconds(steps[s.name]))
    for s in servers:
        s.close()
    median = lambda xs: statistics.median(xs) if xs else None
    by_round = lambda num, den: [x / y for x, y in zip(rates.get(num, []), rates.get(den, []))]
    row = {"shape": name, "dims": shape, "threads": a.threads, "rounds": a.rounds, "tokens_per_s": rates,
           "skipped": {s.name: s.skipped for s in servers if s.skipped is not None}}
    for s in servers:
        row[f"{s.name}_tokens_per_s"] = median(rates[s.name])
    for num, den in (("fp32", "torch"), ("fp32", "compiled"), ("bf16", "fp32")):
        row[f"{num}_over_{den}_by_round"] = by_round(num, den)
        row[f"{num}_over_{den}"] = median(row[f"{num}_over_{den}_by_round"])
    return row


def paths(binary, env, threads):
    """Which BLAS and GEMM path each side runs: strata's from bench_train_step --describe, PyTorch's
    from its build configuration and the CPU capability its kernels dispatch to."""
    described = {}
    try:
        described["strata"] = json.loads(subprocess.run([binary, "--describe"], env=env, capture_output=True,
                                                        text=True, check=True).stdout)
    except (subprocess.CalledProcessError, json.JSONDecodeError) as e:
        described["strata"] = {"error": str(e)}
    probe = ("import json, torch, re\n"
             "cfg = torch.__config__.show()\n"
             "blas = re.search(r'BLAS_INFO=(\\w+)', cfg)\n"
             "mkl = re.search(r'Math Kernel Library Version ([\\d.]+)', cfg)\n"
             "dnn = re.search(r'MKL-DNN v([\\d.]+)', cfg)\n"
             "print(json.dumps({'torch': torch.__version__, 'blas': (blas.group(1) if blas else '?') + "
             "(' ' + mkl.group(1) if mkl else ''), 'onednn': dnn.group(1) if dnn else None, "
             "'cpu_capability': torch.backends.cpu.get_cpu_capability(), "
             "'fp32_gemm': 'sgemm (' + (blas.group(1) if blas else '?') + '), AVX-512 FMA' if "
             "torch.backends.cpu.get_cpu_capability().startswith('AVX512') else 'sgemm'}))\n")
    try:
        described["torch"] = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                                       text=True, check=True).stdout)
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        described["torch"] = {"skipped": "torch is not installed"}
    return described


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="strata's build directory (holds bench/bench_train_step)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15, help="rounds; each times every side once")
    ap.add_argument("--slice", type=float, default=1.0, help="seconds of steps per request, about")
    ap.add_argument("--shapes", default="small,medium")
    ap.add_argument("--torch-optimizer", choices=("fused", "foreach", "default"), default="fused",
                    help="PyTorch's AdamW: fused (the default here), foreach, or its per-tensor CPU default")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="leave out the torch.compile column (it compiles for a minute or two per shape)")
    ap.add_argument("--json", help="also write the results here as JSON")
    a = ap.parse_args()

    binary = os.path.join(a.build, "bench", "bench_train_step")
    if not os.access(binary, os.X_OK):
        sys.exit(f"side_by_side: no {binary}; build it first: cmake --build {a.build} --target bench_train_step")
    # Each side under its own OpenMP defaults (and whatever the caller set): a passive wait policy
    # puts every thread to sleep between parallel regions, which costs both sides a third to a
    # half of the small shape's speed and is not what either runs by default.
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    described = paths(binary, env, a.threads)
    rows = [measure(SHAPES[name], a, binary, env) for name in a.shapes.split(",")]

    cell = lambda x, fmt: "-" if x is None else format(x, fmt)
    print(f"PyTorch: AdamW {a.torch_optimizer}, clipping foreach, scaled_dot_product_attention; "
          f"{a.threads} threads; medians of {a.rounds} interleaved rounds")
    for side, d in described.items():
        print(f"{side}: " + ", ".join(f"{k} {v}" for k, v in d.items()))
    print("| shape (layers, d, heads, seq, vocab, batch) | PyTorch eager tok/s | PyTorch compiled tok/s "
          "| strata fp32 tok/s | strata bf16 tok/s | fp32 / eager | fp32 / compiled | bf16 / fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} {tuple(r['dims'])} | {cell(r.get('torch_tokens_per_s'), ',.0f')} "
              f"| {cell(r.get('compiled_tokens_per_s'), ',.0f')} | {cell(r['fp32_tokens_per_s'], ',.0f')} "
              f"| {cell(r['bf16_tokens_per_s'], ',.0f')} | {cell(r['fp32_over_torch'], '.2f')} "
              f"| {cell(r['fp32_over_compiled'], '.2f')} | {cell(r['bf16_over_fp32'], '.2f')} |")
    for r in rows:
        for side, why in r["skipped"].items():
            print(f"{r['shape']}: {side} skipped: {why}")
        for num, den in (("fp32", "torch"), ("fp32", "compiled"), ("bf16", "fp32")):
            each = sorted(r[f"{num}_over_{den}_by_round"])
            if each:
                print(f"{r['shape']}: {num} / {den} by round, sorted: {', '.join(f'{x:.2f}' for x in each)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"paths": described, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
