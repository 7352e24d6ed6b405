#!/usr/bin/env python3
"""Prints scripts/gpu-check's one table from the pieces its programs wrote:

  report.py KERNELS_TSV GPT2_TSV TORCH_JSON

KERNELS_TSV  strata_cuda_gpu_tests --bench --tsv: precision checks, ceilings, kernel rates
GPT2_TSV     strata_gpt2_step --tsv: the strata kernel-sequence GPT-2 124M step
TORCH_JSON   bench/gpu/torch_gpt2.py's JSON line (or an {"error": ...} line)

Then the issue's targets: memory-bound kernels >= 70% of the measured copy bandwidth; GPT-2 124M
bf16 at >= 50% MFU and at least PyTorch's tokens/s. Exit status: 0 when every precision check
passed and every program ran (targets missed are reported, not failed), 1 otherwise.
"""
import json
import math
import sys

COLS = ["kernel", "dtype", "shape", "rel.err", "tol", "ok", "achieved", "unit", "of ceil", "note"]


def read_tsv(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 11:
                    rows.append(parts[:11])
    except OSError:
        pass
    return rows


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


def main(argv):
    if len(argv) != 4:
        print(__doc__)
        return 2
    kernels, gpt2 = read_tsv(argv[1]), read_tsv(argv[2])
    try:
        with open(argv[3]) as f:
            lines = [l for l in f.read().splitlines() if l.strip().startswith("{")]
        torch = json.loads(lines[-1]) if lines else {"error": "no output"}
    except (OSError, ValueError) as e:
        torch = {"error": str(e)}

    table = []
    for section, name, dtype, shape, rel, tol, ok, perf, unit, ofc, note in kernels + gpt2:
        pct = "-" if math.isnan(num(ofc)) else f"{100 * num(ofc):.0f}%"
        table.append([name, dtype, shape, rel, tol, ok, perf, unit, pct, note])
    if "error" in torch:
        table.append(["GPT-2 124M step: PyTorch", "bf16", "-", "-", "-", "FAIL", "-", "tokens/s", "-",
                      "not run: " + str(torch["error"])])
    else:
        mfu = torch.get("mfu")
        table.append(["GPT-2 124M step: PyTorch" + (" (torch.compile)" if torch.get("compiled") else " (eager)"),
                      "bf16", f"B={torch['batch']} T={torch['seq']}", "-", "-", "ok",
                      f"{torch['tokens_per_s']:.0f}", "tokens/s",
                      "-" if mfu is None else f"{100 * mfu:.0f}%",
                      f"MFU {'-' if mfu is None else f'{100 * mfu:.1f}%'}; {torch['step_ms']:.2f} ms/step; "
                      f"loss {torch['loss_first']:.3f} -> {torch['loss_last']:.3f}; torch {torch['torch']}"])
    widths = [max(len(COLS[i]), *(len(r[i]) for r in table)) if table else len(COLS[i]) for i in range(len(COLS))]
    widths[-1] = 0
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*COLS))
    print("  ".join("-" * max(w, 4) for w in widths))
    for r in table:
        print(fmt.format(*r))

    # Targets.
    print()
    failed_checks = [r for r in kernels + gpt2 if r[6] != "ok"]
    mem = [r for r in kernels if r[0] == "bench" and r[8] == "GB/s"]
    low = [r for r in mem if num(r[9]) < 0.70]
    print(f"precision and run checks: {len(kernels) + len(gpt2) - len(failed_checks)} ok, {len(failed_checks)} failed"
          + ("" if not failed_checks else ": " + ", ".join(f"{r[1]} [{r[2]}]" for r in failed_checks)))
    if mem:
        print(f"target memory-bound kernels >= 70% of copy bandwidth: {'MET' if not low else 'MISSED'}"
              + ("" if not low else " by " + ", ".join(f"{r[1]} ({100 * num(r[9]):.0f}%)" for r in low)))
    if gpt2:
        s_tok, s_mfu = num(gpt2[0][7]), num(gpt2[0][9])
        print(f"target GPT-2 124M bf16 MFU >= 50%: {'MET' if s_mfu >= 0.5 else 'MISSED'} (strata {100 * s_mfu:.1f}%)")
        if "error" not in torch:
            t_tok = torch["tokens_per_s"]
            print(f"target tokens/s >= PyTorch's: {'MET' if s_tok >= t_tok else 'MISSED'} "
                  f"(strata {s_tok:.0f}, PyTorch {t_tok:.0f}, ratio {s_tok / t_tok:.2f})")
        print("note: the strata GPT-2 figure times the sequence of strata CUDA kernels that makes one step, "
              "not the layer-integrated trainer (which does not hold device buffers yet)")
    ran = bool(kernels) and bool(gpt2)
    return 0 if ran and not failed_checks else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
