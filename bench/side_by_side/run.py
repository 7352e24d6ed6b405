#!/usr/bin/env python3
"""strata's host training step against PyTorch eager, side by side on the same CPU.

For each shape of bench_train_step (gpt2_train's default "small" and the 6-layer "medium"),
runs strata fp32, strata bf16 and the PyTorch GPT-2 of torch_gpt2.py (same shape, batch, AdamW,
clipping, thread count) in alternating rounds, keeps each one's best tokens/s, and prints one
table with the ratio strata / PyTorch. A developer tool, not part of CI (docs/profiling.md):

  cmake --build build --target bench_train_step
  python3 bench/side_by_side/run.py --build build --threads 2 --rounds 3

Without torch installed, the PyTorch column says so and the strata columns still print.
"""
import argparse
import json
import os
import subprocess
import sys

SHAPES = {  # name: layers, d_model, heads, seq, vocab, batch (bench_train_step's shapes)
    "small": (3, 96, 4, 64, 256, 16),
    "medium": (6, 384, 6, 256, 8192, 8),
}


def strata_tokens_per_s(binary, precision, shape, env, min_time):
    layers, d, heads, seq, vocab, batch = shape
    pattern = f"train_step/{precision}/layers:{layers}/d:{d}/heads:{heads}/seq:{seq}/vocab:{vocab}/batch:{batch}/"
    out = subprocess.run([binary, f"--benchmark_filter=^{pattern}", "--benchmark_format=json",
                          f"--benchmark_min_time={min_time}"],
                         env=env, check=True, capture_output=True, text=True).stdout
    runs = json.loads(out)["benchmarks"]
    if not runs:
        sys.exit(f"side_by_side: {binary} ran no benchmark matching {pattern}")
    return runs[0]["tokens_per_s"]


def torch_tokens_per_s(shape, threads, env, min_time):
    layers, d, heads, seq, vocab, batch = shape
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_gpt2.py")
    out = subprocess.run([sys.executable, script, "--layers", str(layers), "--d-model", str(d), "--heads", str(heads),
                          "--seq", str(seq), "--vocab", str(vocab), "--batch", str(batch), "--threads", str(threads),
                          "--min-time", str(min_time)], env=env, check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result.get("tokens_per_s"), result.get("skipped")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="strata's build directory (holds bench/bench_train_step)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; each side keeps its best")
    ap.add_argument("--min-time", type=float, default=3.0, help="seconds per measurement, at least")
    ap.add_argument("--shapes", default="small,medium")
    ap.add_argument("--json", help="also write the table here as JSON")
    a = ap.parse_args()

    binary = os.path.join(a.build, "bench", "bench_train_step")
    if not os.access(binary, os.X_OK):
        sys.exit(f"side_by_side: no {binary}; build it first: cmake --build {a.build} --target bench_train_step")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))

    rows = []
    for name in a.shapes.split(","):
        shape = SHAPES[name]
        best = {"fp32": 0.0, "bf16": 0.0, "torch": 0.0}
        skipped = None
        for _ in range(a.rounds):
            best["fp32"] = max(best["fp32"], strata_tokens_per_s(binary, "fp32", shape, env, a.min_time))
            tps, skipped = torch_tokens_per_s(shape, a.threads, env, a.min_time)
            if tps:
                best["torch"] = max(best["torch"], tps)
            best["bf16"] = max(best["bf16"], strata_tokens_per_s(binary, "bf16", shape, env, a.min_time))
        rows.append({"shape": name, "dims": shape, "threads": a.threads, "torch_tokens_per_s": best["torch"] or None,
                     "strata_fp32_tokens_per_s": best["fp32"], "strata_bf16_tokens_per_s": best["bf16"],
                     "fp32_over_torch": best["fp32"] / best["torch"] if best["torch"] else None,
                     "bf16_over_fp32": best["bf16"] / best["fp32"], "torch_skipped": skipped})

    print(f"| shape (layers, d, heads, seq, vocab, batch) | PyTorch eager tok/s | strata fp32 tok/s | strata bf16 tok/s "
          f"| fp32 / PyTorch | bf16 / fp32 |  ({a.threads} threads, best of {a.rounds})")
    print("|---|---|---|---|---|---|")
    for r in rows:
        torch_cell = f"{r['torch_tokens_per_s']:,.0f}" if r["torch_tokens_per_s"] else f"skipped: {r['torch_skipped']}"
        ratio = f"{r['fp32_over_torch']:.2f}" if r["fp32_over_torch"] else "-"
        print(f"| {r['shape']} {tuple(r['dims'])} | {torch_cell} | {r['strata_fp32_tokens_per_s']:,.0f} | "
              f"{r['strata_bf16_tokens_per_s']:,.0f} | {ratio} | {r['bf16_over_fp32']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
