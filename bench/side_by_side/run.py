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
    servers = [Server("fp32", [binary, "--serve", name, "fp32"], env),
               Server("torch", [sys.executable, torch_script, "--layers", str(layers), "--d-model", str(d),
                                "--heads", str(heads), "--seq", str(seq), "--vocab", str(vocab), "--batch", str(batch),
                                "--threads", str(a.threads), "--serve"], env),
               Server("bf16", [binary, "--serve", name, "bf16"], env)]
    live = [s for s in servers if s.skipped is None]
    # Steps per request: about --slice seconds each, from one timed step.
    steps = {s.name: max(1, round(a.slice / s.seconds(1))) for s in live}
    rates = {s.name: [] for s in servers}
    for r in range(a.rounds):
        for s in live[r % len(live):] + live[:r % len(live)]:
            rates[s.name].append(steps[s.name] * batch * seq / s.seconds(steps[s.name]))
    for s in servers:
        s.close()
    ratios = [f / t for f, t in zip(rates["fp32"], rates["torch"])]
    bf16_ratios = [b / f for b, f in zip(rates["bf16"], rates["fp32"])]
    median = lambda xs: statistics.median(xs) if xs else None
    return {"shape": name, "dims": shape, "threads": a.threads, "rounds": a.rounds, "tokens_per_s": rates,
            "torch_tokens_per_s": median(rates["torch"]), "strata_fp32_tokens_per_s": median(rates["fp32"]),
            "strata_bf16_tokens_per_s": median(rates["bf16"]), "fp32_over_torch_by_round": ratios,
            "fp32_over_torch": median(ratios), "bf16_over_fp32_by_round": bf16_ratios,
            "bf16_over_fp32": median(bf16_ratios), "torch_skipped": servers[1].skipped}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="strata's build directory (holds bench/bench_train_step)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15, help="rounds; each times every side once")
    ap.add_argument("--slice", type=float, default=1.0, help="seconds of steps per request, about")
    ap.add_argument("--shapes", default="small,medium")
    ap.add_argument("--json", help="also write the results here as JSON")
    a = ap.parse_args()

    binary = os.path.join(a.build, "bench", "bench_train_step")
    if not os.access(binary, os.X_OK):
        sys.exit(f"side_by_side: no {binary}; build it first: cmake --build {a.build} --target bench_train_step")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    rows = [measure(SHAPES[name], a, binary, env) for name in a.shapes.split(",")]

    print(f"| shape (layers, d, heads, seq, vocab, batch) | PyTorch eager tok/s | strata fp32 tok/s | strata bf16 tok/s "
          f"| fp32 / PyTorch | bf16 / fp32 |  ({a.threads} threads; medians of {a.rounds} interleaved rounds)")
    print("|---|---|---|---|---|---|")
    for r in rows:
        torch_cell = f"{r['torch_tokens_per_s']:,.0f}" if r["torch_tokens_per_s"] else f"skipped: {r['torch_skipped']}"
        ratio = f"{r['fp32_over_torch']:.2f}" if r["fp32_over_torch"] else "-"
        print(f"| {r['shape']} {tuple(r['dims'])} | {torch_cell} | {r['strata_fp32_tokens_per_s']:,.0f} | "
              f"{r['strata_bf16_tokens_per_s']:,.0f} | {ratio} | {r['bf16_over_fp32']:.2f} |")
    for r in rows:
        for key, label in (("fp32_over_torch_by_round", "fp32 / PyTorch"), ("bf16_over_fp32_by_round", "bf16 / fp32")):
            if r[key]:
                each = sorted(r[key])
                print(f"{r['shape']}: {label} by round, sorted: {', '.join(f'{x:.2f}' for x in each)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
