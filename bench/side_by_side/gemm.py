#!/usr/bin/env python3
"""The GEMMs of one medium training step (bench_train_step's 6-layer, 384-wide model: 2048 tokens,
vocabulary 8192), through PyTorch's BLAS (torch.mm: MKL in the PyPI wheels) and through the
OpenBLAS of strata's default build, in one process, interleaved: the question behind the fp32 ratio of
bench/side_by_side/run.py, since that step is GEMM-bound.

Prints the two rates over the whole set (medians of --rounds, each side timed in alternation) and,
per shape, the median of OpenBLAS's time over PyTorch's. OpenBLAS is given the core strata's
kernels/host/blas_core.hpp selects on a CPU newer than the library (unless OPENBLAS_CORETYPE is
set). A developer tool, not part of CI (docs/profiling.md); needs torch, and calls OpenBLAS through
ctypes.
"""
import argparse
import ctypes
import ctypes.util
import os
import statistics
import sys
import time


def best_core():
    """What blas_core.hpp selects: Cooperlake with AVX-512 BF16, SkylakeX with AVX-512, Haswell with AVX2 + FMA."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return None
    if all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl")):
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    return "Haswell" if "avx2" in flags and "fma" in flags else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--openblas", default=ctypes.util.find_library("openblas") or "libopenblas.so.0")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed (pip install torch): nothing to compare against")
        return 0
    if "OPENBLAS_CORETYPE" not in os.environ and best_core():
        os.environ["OPENBLAS_CORETYPE"] = best_core()  # read when the library loads
    ob = ctypes.CDLL(a.openblas)
    ob.openblas_get_corename.restype = ctypes.c_char_p
    ob.openblas_set_num_threads(a.threads)
    torch.set_num_threads(a.threads)

    T = 2048  # batch 8 x sequence 256
    shapes = []  # (trans_a, trans_b, M, N, K) as strata's linear layers call them
    for out_f, in_f in [(1152, 384), (384, 384), (1536, 384), (384, 1536), (8192, 384)]:
        shapes += [(False, True, T, out_f, in_f),   # forward: x . W^T
                   (False, False, T, in_f, out_f),  # input gradient: dy . W
                   (True, False, out_f, in_f, T)]   # weight gradient: dy^T . x
    operands = []
    for ta, tb, M, N, K in shapes:
        A = torch.randn(K, M) if ta else torch.randn(M, K)
        B = torch.randn(N, K) if tb else torch.randn(K, N)
        operands.append((A, B, torch.zeros(M, N)))

    def pytorch(i):
        (ta, tb, *_), (A, B, C) = shapes[i], operands[i]
        torch.mm(A.t() if ta else A, B.t() if tb else B, out=C)

    def openblas(i):
        (ta, tb, M, N, K), (A, B, C) = shapes[i], operands[i]
        ob.cblas_sgemm(101, 112 if ta else 111, 112 if tb else 111, M, N, K, ctypes.c_float(1.0),
                       ctypes.c_void_p(A.data_ptr()), M if ta else K, ctypes.c_void_p(B.data_ptr()),
                       K if tb else N, ctypes.c_float(0.0), ctypes.c_void_p(C.data_ptr()), N)

    def timed(f, indices):
        start = time.perf_counter()
        for i in indices:
            f(i)
        return time.perf_counter() - start

    every = range(len(shapes))
    timed(pytorch, every), timed(openblas, every)  # warm-up
    t_pt, t_ob = [], []
    for r in range(a.rounds):
        pairs = [(pytorch, t_pt), (openblas, t_ob)]
        for f, times in (pairs if r % 2 == 0 else pairs[::-1]):
            times.append(timed(f, every))
    flops = sum(2.0 * M * N * K for _, _, M, N, K in shapes)
    ratios = sorted(o / p for o, p in zip(t_ob, t_pt))
    print(f"torch {torch.__version__} ({a.threads} threads) against OpenBLAS core {ob.openblas_get_corename().decode()}")
    print(f"all {len(shapes)} GEMMs: PyTorch {flops / statistics.median(t_pt) / 1e9:.0f} GFLOP/s, OpenBLAS "
          f"{flops / statistics.median(t_ob) / 1e9:.0f}; OpenBLAS time / PyTorch time by round, median "
          f"{statistics.median(ratios):.2f} (range {ratios[0]:.2f}-{ratios[-1]:.2f})")
    for i, (ta, tb, M, N, K) in enumerate(shapes):
        r = []
        for k in range(max(5, a.rounds)):
            first, second = (pytorch, openblas) if k % 2 == 0 else (openblas, pytorch)
            t1, t2 = timed(first, [i]), timed(second, [i])
            r.append(t2 / t1 if first is pytorch else t1 / t2)
        print(f"  {'T' if ta else 'N'}{'T' if tb else 'N'} M {M:5d} N {N:5d} K {K:5d}: OpenBLAS / PyTorch time {statistics.median(r):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
