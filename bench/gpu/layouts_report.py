#!/usr/bin/env python3
"""layouts_report.py OUT_DIR [SKIPPED]: scripts/gpu-check's multi-rank table.

Reads OUT_DIR/layout_*.json (one strata_gpu_layouts run each), compares every run's per-step
losses with the one-rank run's (fp32: within 1e-5 relative after 5 steps passes), prints one
table and writes it to OUT_DIR/layouts.json. With SKIPPED non-empty, says why there are no rows.
Exit status 1 when a row fails or is missing."""
import json
import os
import sys

ROWS = ["serial", "nccl1", "dp2_zero1", "tp2_sp", "pp2_1f1b", "cp2_ring", "cp2_a2a"]
TOLERANCE = 1e-5


def main():
    out = sys.argv[1]
    skipped = sys.argv[2] if len(sys.argv) > 2 else ""
    table = {"tolerance": TOLERANCE, "rows": []}
    if skipped:
        table["skipped"] = skipped
        print(f"multi-rank rows: skipped: {skipped}")
        json.dump(table, open(os.path.join(out, "layouts.json"), "w"), indent=1)
        return 0
    runs = {}
    for name in ROWS:
        try:
            runs[name] = json.load(open(os.path.join(out, f"layout_{name}.json")))
        except (OSError, ValueError) as e:
            runs[name] = {"error": str(e)}
    reference = runs["serial"].get("losses")
    failed = False
    print(f"{'run':<11} {'layout':<18} {'ranks':>5} {'engine':<6} {'max rel. diff vs 1 rank':>24} {'tokens/s':>10}  result")
    for name in ROWS:
        r = runs[name]
        row = {"run": name, **r}
        if "error" in r or not reference:
            row["result"] = "FAIL (no result)"
            failed = True
            print(f"{name:<11} {'-':<18} {'-':>5} {'-':<6} {'-':>24} {'-':>10}  {row['result']}")
            table["rows"].append(row)
            continue
        losses = r["losses"]
        # A non-finite loss is written as null: no comparison passes it.
        comparable = len(losses) == len(reference) and all(isinstance(x, (int, float)) for x in losses + reference)
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, reference)) if comparable else float("inf")
        ok = diff <= TOLERANCE
        failed |= not ok
        row["max_rel_diff"] = diff
        row["result"] = "ok" if ok else "FAIL"
        table["rows"].append(row)
        print(f"{name:<11} {r['layout']:<18} {r['ranks']:>5} {r['engine']:<6} {diff:>24.2e} {r['tokens_per_s']:>10,.0f}  "
              f"{row['result']}")
    json.dump(table, open(os.path.join(out, "layouts.json"), "w"), indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
