#!/usr/bin/env python3
"""The PyTorch side of bench/side_by_side: the GPT-2 of bench/torch_gpt2_model.py trained with
AdamW in fp32, timed the way bench_train_step times strata's step: untimed warm-up steps, then
whole steps on one batch.

The step is the one a user tuning for speed on a CPU would run, not PyTorch's CPU defaults:
attention through scaled_dot_product_attention, the fused AdamW (--optimizer fused; foreach and
the per-tensor default on request) and foreach gradient clipping, which PyTorch turns off for CPU
tensors unless asked. --compile runs the model through torch.compile (inductor) as well.

Prints one JSON line: {"tokens_per_s": ..., "step_ms": ..., "threads": ..., "torch": ...}.
With --serve: says "ready" after the warm-up, then for each N read from stdin runs N steps and
prints their seconds (0 or end of input: exit), so run.py can interleave it with strata's steps.
"""
import argparse
import json
import math
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--d-model", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--min-time", type=float, default=3.0, help="seconds of timed steps, at least")
    ap.add_argument("--serve", action="store_true", help="run steps on request (see above)")
    ap.add_argument("--optimizer", choices=("fused", "foreach", "default"), default="fused",
                    help="AdamW's implementation: fused kernel, foreach lists, or CPU default (one tensor at a time)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (forward and backward)")
    a = ap.parse_args()

    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": "torch is not installed (pip install torch)"}))
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from torch_gpt2_model import GPT  # bench/torch_gpt2_model.py

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    C, H = a.d_model, a.heads

    model = GPT(layers=a.layers, channels=C, heads=H, vocab=a.vocab, max_seq=a.seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    implementation = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[a.optimizer]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, **implementation)
    forward = torch.compile(model) if a.compile else model
    clip_foreach = a.optimizer != "default"
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    targets = torch.randint(0, a.vocab, (a.batch, a.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=clip_foreach)
        opt.step()
        return loss

    for _ in range(3 if a.compile else 1):  # warm-up: allocations, the optimizer's state, compilation
        step()
    if a.serve:
        print("ready", flush=True)
        for line in sys.stdin:
            n = int(line)
            if n <= 0:
                break
            start = time.perf_counter()
            for _ in range(n):
                loss = step()
            assert math.isfinite(loss.item())
            print(time.perf_counter() - start, flush=True)
        return 0
    steps, start = 0, time.perf_counter()
    while True:
        loss = step()
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= a.min_time and steps >= 3:
            break
    assert math.isfinite(loss.item())
    print(json.dumps({"tokens_per_s": steps * a.batch * a.seq / elapsed, "step_ms": 1000 * elapsed / steps,
                      "steps": steps, "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "optimizer": a.optimizer, "compile": a.compile}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
