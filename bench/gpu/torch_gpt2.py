#!/usr/bin/env python3
"""GPT-2 124M training step in PyTorch: the comparison scripts/gpu-check runs beside strata's
kernel-sequence step (bench/gpu/gpt2_step.cu), at the same shapes.

The model of bench/torch_gpt2_model.py (the CPU comparison's too) at GPT-2 124M's shape, as
nanoGPT runs it: vocabulary padded to 50304, bf16 autocast over fp32 weights, fused AdamW
(lr 6e-4, betas 0.9/0.95, weight decay 0.1), global grad-norm clipping at 1.0, torch.compile.
Every step trains on one fixed random batch (as the strata side does).

MFU uses the formula strata's benchmark uses: FLOPs per token = 6 P + 6 L C T (P = all
parameters, 124,475,904; attention's 12 L C T halved for causality), against 989.4 TFLOP/s bf16
dense on H100/H200 SXM (by device name).

Prints one JSON line: {"impl": "pytorch", "tokens_per_s": ..., "mfu": ..., ...}.
"""
import argparse
import json
import math
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()

    try:
        import torch
    except ImportError as e:
        print(json.dumps({"impl": "pytorch", "error": f"PyTorch is not importable: {e}"}))
        return 3
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from torch_gpt2_model import GPT  # bench/torch_gpt2_model.py

    if not torch.cuda.is_available():
        print(json.dumps({"impl": "pytorch", "error": "no CUDA device"}))
        return 2

    L, C, NH, V, Vp, T, B = 12, 768, 12, 50257, 50304, args.seq, args.batch

    torch.manual_seed(1337)
    dev = "cuda"
    model = GPT(layers=L, channels=C, heads=NH, vocab=Vp, max_seq=1024).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    compiled = not args.no_compile
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator(device="cpu").manual_seed(7)
    data = torch.randint(0, V, (B * T + 1,), generator=g)
    x = data[:-1].view(B, T).to(dev)
    y = data[1:].view(B, T).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t0 = time.time()
    first = None
    for _ in range(args.warmup):
        loss = step()
        if first is None:
            first = loss.item()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        loss = step()
    stop.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(stop) / args.steps
    last = loss.item()

    name = torch.cuda.get_device_name(0)
    peak = 989.4 if ("H100" in name or "H200" in name) else (312.0 if "A100" in name else float("nan"))
    tokens_per_s = B * T / (ms * 1e-3)
    flops_per_token = 6 * n_params + 6 * L * C * T
    tflops = flops_per_token * tokens_per_s / 1e12
    print(json.dumps({
        "impl": "pytorch", "torch": torch.__version__, "device": name, "compiled": compiled,
        "batch": B, "seq": T, "params": n_params, "step_ms": ms, "tokens_per_s": tokens_per_s,
        "tflops": tflops, "peak_tflops": peak, "mfu": tflops / peak if peak == peak else None,
        "loss_first": first, "loss_last": last, "warmup_s": warm_s,
    }))
    return 0 if math.isfinite(last) else 1


if __name__ == "__main__":
    sys.exit(main())
