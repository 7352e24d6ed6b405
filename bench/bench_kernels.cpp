// Host kernel throughput at GPT-small-ish sizes (rows N = B*T = 1024, C = 768, 12 heads), and
// the Llama family's kernels beside them (RMSNorm, RoPE, SwiGLU, grouped-query attention with
// 8 query heads sharing 2 key/value heads of 64).
//
// GEMM-bound ops report "GFLOPS"; memory-bound ops report "GBps", counting each tensor's bytes
// once (the minimum traffic). Activation-sized tensors (N*C floats, 3 MB) stay in L3, so their
// GBps is cache bandwidth; the 16M-element optimizer and reduction arrays go to DRAM.
// BM_cblas_sgemm runs the raw CBLAS (OpenBLAS, or MKL in a build with STRATA_HOST_BLAS_VENDOR=MKL)
// at exactly the GEMM shapes linear_forward/backward issue,
// so the overhead of strata's wrapper (and of the bf16 widening copies) shows as a ratio.
// Each benchmark runs for a short minimum time so the whole suite takes well under a minute.
// Rates are per wall-clock second (UseRealTime): the kernels run on several threads.
//
// Run it as  OMP_WAIT_POLICY=passive ./bench_kernels . With a BLAS on a thread pool of its own
// (OpenBLAS's pthreads build), libgomp's idle threads spin after each parallel region and
// compete with the BLAS's for the same cores, which roughly halves the GEMM rates of linear_*
// (not of BM_cblas_sgemm, which has no OpenMP region around it).
#include <benchmark/benchmark.h>

#include "strata/kernels/host/blas_core.hpp"  // the CBLAS header of strata's BLAS

#include <chrono>
#include <cstdint>
#include <vector>

#include "strata/core/init.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/all.hpp"

namespace {

namespace k = strata::kernels;
using strata::host;

constexpr std::int64_t B = 4, T = 256, N = B * T, C = 768, NH = 12;
constexpr std::int64_t V = 50257, Vp = 50304, CE_rows = 128;  // GPT-2 vocab, padded to 128
constexpr double min_time = 0.2;
// Every benchmark here: a short minimum time, per wall-clock second (the kernels run on several
// threads), in milliseconds or microseconds.
void timed_ms(benchmark::internal::Benchmark* b) { b->MinTime(min_time)->UseRealTime()->Unit(benchmark::kMillisecond); }
void timed_us(benchmark::internal::Benchmark* b) { b->MinTime(min_time)->UseRealTime()->Unit(benchmark::kMicrosecond); }

template <class T_>
std::vector<T_> random_array(std::int64_t n, std::uint64_t stream, double scale = 1.0) {
  std::vector<T_> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = strata::convert<T_>(float(scale * (2 * strata::counter_uniform(99, stream, i) - 1)));
  return v;
}

void set_rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void report_flops(benchmark::State& state, double flops) { set_rate(state, "GFLOPS", flops); }
void report_bytes(benchmark::State& state, double bytes) { set_rate(state, "GBps", bytes); }

// --- GEMM: strata linear vs the raw CBLAS at the same shapes ---------------------------------

// Args: {OC}. out[N, OC] = inp[N, C] . weight[OC, C]^T + bias
template <class T_>
void BM_linear_forward(benchmark::State& state) {
  const std::int64_t OC = state.range(0);
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  auto inp = random_array<T_>(N * C, 1), w = random_array<T_>(OC * C, 2, 0.05), b = random_array<T_>(OC, 3);
  std::vector<T_> out(static_cast<std::size_t>(N * OC));
  for (auto _ : state) {
    k::linear_forward(host{}, ws, out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    benchmark::DoNotOptimize(out.data());
  }
  report_flops(state, 2.0 * N * C * OC);
}

template <class T_>
void BM_linear_backward(benchmark::State& state) {
  const std::int64_t OC = state.range(0);
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  auto inp = random_array<T_>(N * C, 1), w = random_array<T_>(OC * C, 2, 0.05), dout = random_array<T_>(N * OC, 4);
  std::vector<T_> dinp(inp.size()), dw(w.size()), db(static_cast<std::size_t>(OC));
  for (auto _ : state) {
    k::linear_backward(host{}, ws, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
    benchmark::DoNotOptimize(dw.data());
  }
  report_flops(state, 4.0 * N * C * OC);  // two GEMMs; the bias sum is negligible
}

// Args: {M, N, K, trans_a, trans_b, beta}: exactly one cblas_sgemm call, row-major.
void BM_cblas_sgemm(benchmark::State& state) {
  const int M = int(state.range(0)), Nn = int(state.range(1)), K = int(state.range(2));
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  const float beta = float(state.range(5));
  auto a = random_array<float>(std::int64_t(M) * K, 5), b = random_array<float>(std::int64_t(K) * Nn, 6);
  std::vector<float> c(static_cast<std::size_t>(std::int64_t(M) * Nn));
  strata::kernels::blas_core::ensure_selected();  // the core or threading layer, as kernels::gemm has it
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, Nn, K, 1.0f, a.data(),
                ta ? M : K, b.data(), tb ? K : Nn, beta, c.data(), Nn);
    benchmark::DoNotOptimize(c.data());
  }
  report_flops(state, 2.0 * M * Nn * K);
}

// --- Mixture of experts: the grouped GEMM against one dense GEMM of the same FLOPs ------------

// The N tokens' top-2 pairs (2N rows) over 8 experts, unevenly (the busiest expert gets 5x the
// idlest's rows, as an unbalanced router gives), through each expert's [OC, C] weight; and the
// same 2N rows through one [OC, C] weight. Each iteration times both, so the ratio
// "grouped/dense" (GFLOP/s of the grouped over the dense) comes from one run, on one machine state.
template <class T_>
void BM_grouped_linear_vs_dense(benchmark::State& state) {
  constexpr std::int64_t E = 8, rows = 2 * N;
  const std::int64_t OC = state.range(0);
  const std::int64_t share[E] = {5, 1, 3, 2, 4, 1, 2, 2};  // out of 20
  std::vector<std::int64_t> offsets{0};
  for (std::int64_t e = 0; e < E; ++e) offsets.push_back(offsets.back() + rows * share[e] / 20);
  offsets.back() = rows;
  strata::memory_ledger ledger;
  strata::workspace ws(ledger);
  auto x = random_array<T_>(rows * C, 1);
  std::vector<std::vector<T_>> weights;
  std::vector<const T_*> w;
  for (std::int64_t e = 0; e < E; ++e) {
    weights.push_back(random_array<T_>(OC * C, 10 + std::uint64_t(e), 0.05));
    w.push_back(weights.back().data());
  }
  std::vector<T_> y(static_cast<std::size_t>(rows * OC));
  double grouped_s = 0, dense_s = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    k::grouped_linear_forward(host{}, ws, y.data(), x.data(), w.data(), offsets.data(), E, C, OC);
    benchmark::DoNotOptimize(y.data());
    const auto t1 = std::chrono::steady_clock::now();
    k::linear_forward(host{}, ws, y.data(), x.data(), w[0], static_cast<const T_*>(nullptr), rows, C, OC);
    benchmark::DoNotOptimize(y.data());
    const auto t2 = std::chrono::steady_clock::now();
    grouped_s += std::chrono::duration<double>(t1 - t0).count();
    dense_s += std::chrono::duration<double>(t2 - t1).count();
  }
  const double flops = 2.0 * double(rows) * double(C) * double(OC) * double(state.iterations());
  state.counters["grouped_GFLOPS"] = flops / grouped_s * 1e-9;
  state.counters["dense_GFLOPS"] = flops / dense_s * 1e-9;
  state.counters["grouped/dense"] = dense_s / grouped_s;
}

// --- Attention: causal loops over one logsumexp per row, FLOPs of the causal half -----------

template <class T_>
void BM_attention_forward(benchmark::State& state) {
  auto qkv = random_array<T_>(N * 3 * C, 7);
  std::vector<T_> out(static_cast<std::size_t>(N * C));
  std::vector<strata::acc_t<T_>> att(static_cast<std::size_t>(B * NH * T));
  for (auto _ : state) {
    k::attention_forward(host{}, out.data(), att.data(), qkv.data(), B, T, C, NH);
    benchmark::DoNotOptimize(out.data());
  }
  report_flops(state, 2.0 * 2.0 * B * C * (T * (T + 1) / 2));  // q.k and p.v over t2 <= t
}

template <class T_>
void BM_attention_backward(benchmark::State& state) {
  auto qkv = random_array<T_>(N * 3 * C, 7), dout = random_array<T_>(N * C, 8);
  std::vector<T_> out(static_cast<std::size_t>(N * C)), dqkv(qkv.size());
  std::vector<strata::acc_t<T_>> att(static_cast<std::size_t>(B * NH * T));
  k::attention_forward(host{}, out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (auto _ : state) {
    // With the forward's output, as the layer calls it (without, backward redoes the forward).
    k::attention_backward(host{}, dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, out.data());
    benchmark::DoNotOptimize(dqkv.data());
  }
  // dP, dV, dQ, dK; the recomputed scores (a fifth product) are not counted.
  report_flops(state, 4.0 * 2.0 * B * C * (T * (T + 1) / 2));
}

// Grouped-query attention, Llama-style: 8 query heads of 64 share 2 key/value heads.
constexpr k::attention_shape gqa{.batch = B, .seq = T, .heads = 8, .kv_heads = 2, .head_dim = 64};
constexpr double gqa_causal_flops = 2.0 * B * gqa.heads * gqa.head_dim * (T * (T + 1) / 2);  // one causal product

template <class T_>
void BM_gqa_attention_forward(benchmark::State& state) {
  auto qkv = random_array<T_>(N * gqa.row_width(), 7);
  std::vector<T_> out(static_cast<std::size_t>(N * gqa.q_width()));
  std::vector<strata::acc_t<T_>> lse(static_cast<std::size_t>(B * gqa.heads * T));
  for (auto _ : state) {
    k::attention_forward(host{}, out.data(), lse.data(), qkv.data(), gqa);
    benchmark::DoNotOptimize(out.data());
  }
  report_flops(state, 2.0 * gqa_causal_flops);  // q.k and p.v
}

template <class T_>
void BM_gqa_attention_backward(benchmark::State& state) {
  auto qkv = random_array<T_>(N * gqa.row_width(), 7), dout = random_array<T_>(N * gqa.q_width(), 8);
  std::vector<T_> out(dout.size()), dqkv(qkv.size());
  std::vector<strata::acc_t<T_>> lse(static_cast<std::size_t>(B * gqa.heads * T));
  k::attention_forward(host{}, out.data(), lse.data(), qkv.data(), gqa);
  for (auto _ : state) {
    k::attention_backward(host{}, dqkv.data(), dout.data(), qkv.data(), lse.data(), out.data(), gqa);
    benchmark::DoNotOptimize(dqkv.data());
  }
  report_flops(state, 4.0 * gqa_causal_flops);  // dP, dV, dQ, dK, as for the MHA backward above
}

// Attention at a training step's shapes. Args: {B, T, heads, head_dim, backward}: the forward
// alone (backward 0), or forward then backward (1), as a training step runs them. FLOPs: the
// causal q.k and p.v (forward) plus dP, dV, dQ, dK (backward); the recomputed scores are not
// counted.
template <class T_>
void BM_attention_step(benchmark::State& state) {
  const k::attention_shape s{.batch = state.range(0),
                             .seq = state.range(1),
                             .heads = state.range(2),
                             .kv_heads = state.range(2),
                             .head_dim = state.range(3)};
  const bool backward = state.range(4) != 0;
  auto qkv = random_array<T_>(s.batch * s.seq * s.row_width(), 7),
       dout = random_array<T_>(s.batch * s.seq * s.q_width(), 8);
  std::vector<T_> out(dout.size()), dqkv(qkv.size());
  std::vector<strata::acc_t<T_>> lse(static_cast<std::size_t>(s.batch * s.heads * s.seq));
  for (auto _ : state) {
    k::attention_forward(host{}, out.data(), lse.data(), qkv.data(), s);
    if (backward) k::attention_backward(host{}, dqkv.data(), dout.data(), qkv.data(), lse.data(), out.data(), s);
    benchmark::DoNotOptimize(out.data());
    benchmark::DoNotOptimize(dqkv.data());
  }
  const double product = 2.0 * s.batch * s.heads * s.head_dim * (s.seq * (s.seq + 1) / 2);  // one causal product
  report_flops(state, (backward ? 6.0 : 2.0) * product);
}

// --- Memory-bound ops ----------------------------------------------------------------------

template <class T_>
void BM_layernorm_forward(benchmark::State& state) {
  auto inp = random_array<T_>(N * C, 9), w = random_array<T_>(C, 10), b = random_array<T_>(C, 11);
  std::vector<T_> out(inp.size());
  std::vector<strata::acc_t<T_>> mean(static_cast<std::size_t>(N)), rstd(mean.size());
  for (auto _ : state) {
    k::layernorm_forward(host{}, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                         strata::acc_t<T_>(1e-5));
    benchmark::DoNotOptimize(out.data());
  }
  report_bytes(state, 2.0 * N * C * sizeof(T_));
}

template <class T_>
void BM_layernorm_backward(benchmark::State& state) {
  auto inp = random_array<T_>(N * C, 9), w = random_array<T_>(C, 10), b = random_array<T_>(C, 11),
       dout = random_array<T_>(N * C, 12);
  std::vector<T_> out(inp.size()), dinp(inp.size()), dw(w.size()), db(b.size());
  std::vector<strata::acc_t<T_>> mean(static_cast<std::size_t>(N)), rstd(mean.size());
  k::layernorm_forward(host{}, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                       strata::acc_t<T_>(1e-5));
  for (auto _ : state) {
    k::layernorm_backward(host{}, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                          rstd.data(), N, C);
    benchmark::DoNotOptimize(dinp.data());
  }
  report_bytes(state, 4.0 * N * C * sizeof(T_));  // inp, dout, dinp read and written
}

template <class T_>
void BM_rmsnorm_forward(benchmark::State& state) {
  auto inp = random_array<T_>(N * C, 9), w = random_array<T_>(C, 10);
  std::vector<T_> out(inp.size());
  std::vector<strata::acc_t<T_>> rstd(static_cast<std::size_t>(N));
  for (auto _ : state) {
    k::rmsnorm_forward(host{}, out.data(), rstd.data(), inp.data(), w.data(), N, C, strata::acc_t<T_>(1e-5));
    benchmark::DoNotOptimize(out.data());
  }
  report_bytes(state, 2.0 * N * C * sizeof(T_));
}

template <class T_>
void BM_rmsnorm_backward(benchmark::State& state) {
  auto inp = random_array<T_>(N * C, 9), w = random_array<T_>(C, 10), dout = random_array<T_>(N * C, 12);
  std::vector<T_> out(inp.size()), dinp(inp.size()), dw(w.size());
  std::vector<strata::acc_t<T_>> rstd(static_cast<std::size_t>(N));
  k::rmsnorm_forward(host{}, out.data(), rstd.data(), inp.data(), w.data(), N, C, strata::acc_t<T_>(1e-5));
  for (auto _ : state) {
    k::rmsnorm_backward(host{}, dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
    benchmark::DoNotOptimize(dinp.data());
  }
  report_bytes(state, 4.0 * N * C * sizeof(T_));  // inp, dout, dinp read and written
}

// RoPE in place on the GQA qkv buffer: the q and k heads read and written (the table included).
template <class T_>
void BM_rope_forward(benchmark::State& state) {
  auto qkv = random_array<T_>(N * gqa.row_width(), 7);
  for (auto _ : state) {
    k::rope_forward(host{}, qkv.data(), gqa, 10000.0);
    benchmark::DoNotOptimize(qkv.data());
  }
  report_bytes(state, 2.0 * N * (gqa.q_width() + gqa.kv_width()) * sizeof(T_));
}

// SwiGLU on a Llama-style MLP hidden width H = 8C/3 rounded to 2048.
constexpr std::int64_t swiglu_H = 2048;

template <class T_>
void BM_swiglu_forward(benchmark::State& state) {
  auto gate_up = random_array<T_>(N * 2 * swiglu_H, 13, 3.0);
  std::vector<T_> out(static_cast<std::size_t>(N * swiglu_H));
  for (auto _ : state) {
    k::swiglu_forward(host{}, out.data(), gate_up.data(), N, swiglu_H);
    benchmark::DoNotOptimize(out.data());
  }
  report_bytes(state, 3.0 * N * swiglu_H * sizeof(T_));  // gate and up read, out written
}

template <class T_>
void BM_swiglu_backward(benchmark::State& state) {
  auto gate_up = random_array<T_>(N * 2 * swiglu_H, 13, 3.0), dout = random_array<T_>(N * swiglu_H, 14);
  std::vector<T_> dgate_up(gate_up.size());
  for (auto _ : state) {
    k::swiglu_backward(host{}, dgate_up.data(), dout.data(), gate_up.data(), N, swiglu_H);
    benchmark::DoNotOptimize(dgate_up.data());
  }
  report_bytes(state, 5.0 * N * swiglu_H * sizeof(T_));  // gate_up and dout read, dgate_up written
}

// GELU on the MLP's hidden activations [N, 4C].
template <class T_>
void BM_gelu_forward(benchmark::State& state) {
  const std::int64_t n = N * 4 * C;
  auto inp = random_array<T_>(n, 13, 3.0);
  std::vector<T_> out(inp.size());
  for (auto _ : state) {
    k::gelu_forward(host{}, out.data(), inp.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  report_bytes(state, 2.0 * n * sizeof(T_));
}

template <class T_>
void BM_gelu_backward(benchmark::State& state) {
  const std::int64_t n = N * 4 * C;
  auto inp = random_array<T_>(n, 13, 3.0), dout = random_array<T_>(n, 14);
  std::vector<T_> dinp(inp.size());
  for (auto _ : state) {
    k::gelu_backward(host{}, dinp.data(), inp.data(), dout.data(), n);
    benchmark::DoNotOptimize(dinp.data());
  }
  report_bytes(state, 4.0 * n * sizeof(T_));
}

template <class T_>
void BM_residual_forward(benchmark::State& state) {
  const std::int64_t n = N * C;
  auto a = random_array<T_>(n, 15), b = random_array<T_>(n, 16);
  std::vector<T_> out(a.size());
  for (auto _ : state) {
    k::residual_forward(host{}, out.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  report_bytes(state, 3.0 * n * sizeof(T_));
}

template <class T_>
void BM_residual_backward(benchmark::State& state) {
  const std::int64_t n = N * C;
  auto dout = random_array<T_>(n, 17);
  std::vector<T_> da(dout.size()), db(dout.size());
  for (auto _ : state) {
    k::residual_backward(host{}, da.data(), db.data(), dout.data(), n);
    benchmark::DoNotOptimize(da.data());
  }
  report_bytes(state, 5.0 * n * sizeof(T_));
}

std::vector<std::int32_t> token_ids(std::int64_t count) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t(strata::counter_bits(99, 18, i) % V);
  return ids;
}

template <class T_>
void BM_embedding_forward(benchmark::State& state) {
  auto tokens = token_ids(N);
  auto wte = random_array<T_>(V * C, 19), wpe = random_array<T_>(T * C, 20);
  std::vector<T_> out(static_cast<std::size_t>(N * C));
  for (auto _ : state) {
    k::embedding_forward(host{}, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
    benchmark::DoNotOptimize(out.data());
  }
  report_bytes(state, (2.0 * N * C + double(T * C)) * sizeof(T_));  // rows read, out written, wpe
}

template <class T_>
void BM_embedding_backward(benchmark::State& state) {
  auto tokens = token_ids(N);
  auto dout = random_array<T_>(N * C, 21);
  std::vector<T_> dwte(static_cast<std::size_t>(V * C)), dwpe(static_cast<std::size_t>(T * C));
  for (auto _ : state) {
    k::embedding_backward(host{}, dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    benchmark::DoNotOptimize(dwte.data());
  }
  report_bytes(state, (3.0 * N * C + 2.0 * T * C) * sizeof(T_));  // dout, dwte rows r+w, dwpe r+w
}

// Fused loss and gradient over a [CE_rows, Vp] logits block (the full vocabulary).
template <class T_>
void BM_cross_entropy_forward_backward(benchmark::State& state) {
  const auto logits0 = random_array<T_>(CE_rows * Vp, 22, 4.0);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(CE_rows));
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = std::int32_t((i * 7919) % V);
  std::vector<T_> logits = logits0;
  std::vector<strata::acc_t<T_>> losses(targets.size());
  for (auto _ : state) {
    // Overwritten in place: it reads gradients as logits from the second iteration on, which
    // costs the same (the loss values are not used here).
    k::cross_entropy_forward_backward(host{}, losses.data(), logits.data(), targets.data(), CE_rows, V, Vp,
                                      strata::acc_t<T_>(1.0 / CE_rows));
    benchmark::DoNotOptimize(logits.data());
  }
  report_bytes(state, 2.0 * CE_rows * Vp * sizeof(T_));
}

// One AdamW step over a GPT-small-sized shard (16M parameters); T_ weights, float master.
template <class T_>
void BM_adamw_update(benchmark::State& state) {
  const std::int64_t n = std::int64_t(1) << 24;
  auto master = random_array<float>(n, 23), grad_f = random_array<float>(n, 24, 1e-2);
  std::vector<T_> grad(grad_f.size()), weights(grad_f.size());
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = strata::convert<T_>(grad_f[i]);
  std::vector<float> m(master.size()), v(master.size());
  const k::adamw_hyper hyper{.lr = 6e-4, .weight_decay = 0.1};
  int step = 0;
  for (auto _ : state) {
    k::adamw_update(host{}, master.data(), weights.data(), grad.data(), m.data(), v.data(), n, hyper, ++step, 1.0);
    benchmark::DoNotOptimize(master.data());
  }
  report_bytes(state, n * (3.0 * 2 * sizeof(float) + 2.0 * sizeof(T_)));  // master, m, v r+w; grad; weights
}

template <class T_>
void BM_sum_of_squares(benchmark::State& state) {
  const std::int64_t n = std::int64_t(1) << 24;
  auto x = random_array<T_>(n, 25);
  for (auto _ : state) benchmark::DoNotOptimize(k::sum_of_squares(host{}, x.data(), n));
  report_bytes(state, double(n) * sizeof(T_));
}

template <class T_>
void BM_all_finite(benchmark::State& state) {
  const std::int64_t n = std::int64_t(1) << 24;
  auto x = random_array<T_>(n, 26);
  for (auto _ : state) benchmark::DoNotOptimize(k::all_finite(host{}, x.data(), n));
  report_bytes(state, double(n) * sizeof(T_));
}

template <class T_>
void BM_scale_in_place(benchmark::State& state) {
  const std::int64_t n = std::int64_t(1) << 24;
  auto x = random_array<T_>(n, 27);
  for (auto _ : state) {
    k::scale_in_place(host{}, x.data(), n, 1.0);
    benchmark::DoNotOptimize(x.data());
  }
  report_bytes(state, 2.0 * n * sizeof(T_));
}

template <class To, class From>
void BM_convert_array(benchmark::State& state) {
  const std::int64_t n = std::int64_t(1) << 24;
  auto src = random_array<From>(n, 28);
  std::vector<To> dst(src.size());
  for (auto _ : state) {
    k::convert_array(host{}, dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
  }
  report_bytes(state, double(n) * (sizeof(To) + sizeof(From)));
}

using strata::bf16;

// linear at the attention projection (OC = C) and the MLP up-projection (OC = 4C).

// --- The building blocks against the hand-written kernels they replaced ----------------------
// residual, SwiGLU and RMSNorm are written with kernels/elementwise.hpp and kernels/rowwise.hpp;
// their hand-written host loops, as they were, are kept here as the baseline. Each benchmark
// runs both, alternately in the same loop, and reports each one's time per call and
// ratio = hand-written time / building-block time (>= 1: the building block is as fast or faster).
namespace hand_written {
using strata::acc_t;
using strata::convert;

template <class T>
void residual_forward(T* out, const T* a, const T* b, std::int64_t n) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) out[i] = convert<T>(convert<A>(a[i]) + convert<A>(b[i]));
}

template <class T>
void residual_backward(T* da, T* db, const T* dout, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    if (da) da[i] = dout[i];
    if (db) db[i] = dout[i];
  }
}

template <class T>
void swiglu_forward(T* out, const T* gate_up, std::int64_t N_, std::int64_t H) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (N_ * H > 65536)
  for (std::int64_t n = 0; n < N_; ++n) {
    const T* z = gate_up + n * 2 * H;
    const T* u = z + H;
    T* y = out + n * H;
    for (std::int64_t i = 0; i < H; ++i) {
      const A zi = convert<A>(z[i]);
      const A sig = A(1) / (A(1) + k::exp_fast(-zi));
      y[i] = convert<T>(zi * sig * convert<A>(u[i]));
    }
  }
}

template <class T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, std::int64_t N_, std::int64_t H) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (N_ * H > 65536)
  for (std::int64_t n = 0; n < N_; ++n) {
    const T* z = gate_up + n * 2 * H;
    const T* u = z + H;
    const T* dy = dout + n * H;
    T* dz = dgate_up + n * 2 * H;
    T* du = dz + H;
    for (std::int64_t i = 0; i < H; ++i) {
      const A zi = convert<A>(z[i]), g = convert<A>(dy[i]);
      const A sig = A(1) / (A(1) + k::exp_fast(-zi));
      dz[i] = convert<T>(g * convert<A>(u[i]) * sig * (A(1) + zi * (A(1) - sig)));
      du[i] = convert<T>(g * zi * sig);
    }
  }
}

template <class T>
void rmsnorm_forward(T* out, acc_t<T>* rstd, const T* inp, const T* weight, std::int64_t N_, std::int64_t C_,
                     acc_t<T> eps) {
#pragma omp parallel for schedule(static) if (N_ * C_ > 16384)
  for (std::int64_t n = 0; n < N_; ++n) {
    const auto s = k::rmsnorm_detail::normalise_row(out + n * C_, inp + n * C_, weight, C_, eps);
    if (rstd) rstd[n] = s;
  }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const acc_t<T>* rstd,
                      std::int64_t N_, std::int64_t C_) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (N_ * C_ > 16384)
  for (std::int64_t n = 0; n < N_; ++n) {
    const T* x = inp + n * C_;
    const T* dy = dout + n * C_;
    T* dx = dinp + n * C_;
    const A s = rstd[n];
    const A dnorm_norm_mean =
        k::layernorm_detail::sum_in_lanes<A>(
            C_, [=](std::int64_t c) { return convert<A>(dy[c]) * convert<A>(weight[c]) * (convert<A>(x[c]) * s); }) /
        A(C_);
    for (std::int64_t c = 0; c < C_; ++c) {
      const A norm = convert<A>(x[c]) * s;
      const A dnorm = convert<A>(dy[c]) * convert<A>(weight[c]);
      dx[c] = convert<T>(s * (dnorm - norm * dnorm_norm_mean));
    }
  }
  constexpr std::int64_t block = 64;
  const std::int64_t blocks = (C_ + block - 1) / block;
#pragma omp parallel for schedule(static) if (N_ * C_ > 16384)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t lo = b * block, hi = lo + block < C_ ? lo + block : C_;
    A dw[block] = {};
    for (std::int64_t n = 0; n < N_; ++n) {
      const T* x = inp + n * C_;
      const T* dy = dout + n * C_;
      const A s = rstd[n];
      for (std::int64_t c = lo; c < hi; ++c) dw[c - lo] += convert<A>(dy[c]) * (convert<A>(x[c]) * s);
    }
    for (std::int64_t c = lo; c < hi; ++c) dweight[c] = convert<T>(convert<A>(dweight[c]) + dw[c - lo]);
  }
}
}  // namespace hand_written

// Times hand() and built() alternately, one call each per iteration; the iteration time is the
// building block's (manual time), the counters say both and their ratio.
template <class Hand, class Built>
void side_by_side(benchmark::State& state, Hand hand, Built built, double bytes) {
  using clock = std::chrono::steady_clock;
  hand(), built();  // warm
  double t_hand = 0, t_built = 0;
  for (auto _ : state) {
    const auto t0 = clock::now();
    hand();
    const auto t1 = clock::now();
    built();
    const auto t2 = clock::now();
    const double h = std::chrono::duration<double>(t1 - t0).count(), b = std::chrono::duration<double>(t2 - t1).count();
    t_hand += h, t_built += b;
    state.SetIterationTime(b);
  }
  const double n = double(state.iterations());
  state.counters["hand_us"] = 1e6 * t_hand / n;
  state.counters["built_us"] = 1e6 * t_built / n;
  state.counters["ratio"] = t_hand / t_built;
  state.counters["GBps"] = benchmark::Counter(bytes * n / t_built * 1e-9);
}
void side_by_side_us(benchmark::internal::Benchmark* b) {
  b->MinTime(min_time)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

template <class T_>
void BM_built_residual_forward(benchmark::State& state) {
  const std::int64_t n = N * C;
  auto a = random_array<T_>(n, 15), b = random_array<T_>(n, 16);
  std::vector<T_> out(a.size()), out2(a.size());
  side_by_side(
      state, [&] { hand_written::residual_forward(out2.data(), a.data(), b.data(), n); },
      [&] { k::residual_forward(host{}, out.data(), a.data(), b.data(), n); }, 3.0 * n * sizeof(T_));
}

template <class T_>
void BM_built_residual_backward(benchmark::State& state) {
  const std::int64_t n = N * C;
  auto dout = random_array<T_>(n, 17);
  std::vector<T_> da(dout.size()), db(dout.size());
  side_by_side(
      state, [&] { hand_written::residual_backward(da.data(), db.data(), dout.data(), n); },
      [&] { k::residual_backward(host{}, da.data(), db.data(), dout.data(), n); }, 3.0 * n * sizeof(T_));
}

template <class T_>
void BM_built_swiglu_forward(benchmark::State& state) {
  auto gate_up = random_array<T_>(N * 2 * swiglu_H, 13, 3.0);
  std::vector<T_> out(static_cast<std::size_t>(N * swiglu_H));
  side_by_side(
      state, [&] { hand_written::swiglu_forward(out.data(), gate_up.data(), N, swiglu_H); },
      [&] { k::swiglu_forward(host{}, out.data(), gate_up.data(), N, swiglu_H); }, 3.0 * N * swiglu_H * sizeof(T_));
}

template <class T_>
void BM_built_swiglu_backward(benchmark::State& state) {
  auto gate_up = random_array<T_>(N * 2 * swiglu_H, 13, 3.0), dout = random_array<T_>(N * swiglu_H, 14);
  std::vector<T_> dgate_up(gate_up.size());
  side_by_side(
      state, [&] { hand_written::swiglu_backward(dgate_up.data(), dout.data(), gate_up.data(), N, swiglu_H); },
      [&] { k::swiglu_backward(host{}, dgate_up.data(), dout.data(), gate_up.data(), N, swiglu_H); },
      5.0 * N * swiglu_H * sizeof(T_));
}

template <class T_>
void BM_built_rmsnorm_forward(benchmark::State& state) {
  auto inp = random_array<T_>(N * C, 9), w = random_array<T_>(C, 10);
  std::vector<T_> out(inp.size());
  std::vector<strata::acc_t<T_>> rstd(static_cast<std::size_t>(N));
  const auto eps = strata::acc_t<T_>(1e-5);
  side_by_side(
      state, [&] { hand_written::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps); },
      [&] { k::rmsnorm_forward(host{}, out.data(), rstd.data(), inp.data(), w.data(), N, C, eps); },
      2.0 * N * C * sizeof(T_));
}

template <class T_>
void BM_built_rmsnorm_backward(benchmark::State& state) {
  auto inp = random_array<T_>(N * C, 9), w = random_array<T_>(C, 10), dout = random_array<T_>(N * C, 12);
  std::vector<T_> out(inp.size()), dinp(inp.size()), dw(w.size());
  std::vector<strata::acc_t<T_>> rstd(static_cast<std::size_t>(N));
  k::rmsnorm_forward(host{}, out.data(), rstd.data(), inp.data(), w.data(), N, C, strata::acc_t<T_>(1e-5));
  side_by_side(
      state,
      [&] {
        hand_written::rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
      },
      [&] {
        k::rmsnorm_backward(host{}, dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
      },
      4.0 * N * C * sizeof(T_));
}

BENCHMARK_TEMPLATE(BM_linear_forward, float)->Arg(C)->Arg(4 * C)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_linear_forward, bf16)->Arg(C)->Arg(4 * C)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_linear_backward, float)->Arg(C)->Arg(4 * C)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_linear_backward, bf16)->Arg(C)->Arg(4 * C)->Apply(timed_ms);
// The GEMMs above, raw: forward {N, OC, C, no, trans, beta 1}; backward dinp {N, C, OC, no, no, 1}
// and dweight {OC, C, N, trans, no, 1}.
BENCHMARK(BM_cblas_sgemm)
    ->ArgNames({"M", "N", "K", "ta", "tb", "beta"})
    ->Args({N, C, C, 0, 1, 1})
    ->Args({N, C, C, 0, 0, 1})
    ->Args({C, C, N, 1, 0, 1})
    ->Args({N, 4 * C, C, 0, 1, 1})
    ->Args({N, C, 4 * C, 0, 0, 1})
    ->Args({4 * C, C, N, 1, 0, 1})
    ->Apply(timed_ms);

BENCHMARK_TEMPLATE(BM_attention_forward, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_attention_forward, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_attention_backward, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_attention_backward, bf16)->Apply(timed_ms);

BENCHMARK_TEMPLATE(BM_gqa_attention_forward, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_gqa_attention_forward, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_gqa_attention_backward, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_gqa_attention_backward, bf16)->Apply(timed_ms);

BENCHMARK_TEMPLATE(BM_attention_step, float)
    ->ArgNames({"B", "T", "H", "d", "bwd"})
    ->Args({8, 256, 6, 64, 0})
    ->Args({8, 256, 6, 64, 1})
    ->Args({8, 64, 4, 24, 0})
    ->Args({8, 64, 4, 24, 1})
    ->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_attention_step, bf16)
    ->ArgNames({"B", "T", "H", "d", "bwd"})
    ->Args({8, 256, 6, 64, 0})
    ->Args({8, 256, 6, 64, 1})
    ->Args({8, 64, 4, 24, 0})
    ->Args({8, 64, 4, 24, 1})
    ->Apply(timed_ms);

BENCHMARK_TEMPLATE(BM_layernorm_forward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_layernorm_forward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_layernorm_backward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_layernorm_backward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_rmsnorm_forward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_rmsnorm_forward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_rmsnorm_backward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_rmsnorm_backward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_rope_forward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_rope_forward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_swiglu_forward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_swiglu_forward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_swiglu_backward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_swiglu_backward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_grouped_linear_vs_dense, float)->Arg(C)->Arg(4 * C)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_grouped_linear_vs_dense, bf16)->Arg(C)->Arg(4 * C)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_gelu_forward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_gelu_forward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_gelu_backward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_gelu_backward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_residual_forward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_residual_forward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_residual_backward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_residual_backward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_embedding_forward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_embedding_forward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_embedding_backward, float)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_embedding_backward, bf16)->Apply(timed_us);
BENCHMARK_TEMPLATE(BM_cross_entropy_forward_backward, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_cross_entropy_forward_backward, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_adamw_update, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_adamw_update, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_sum_of_squares, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_sum_of_squares, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_all_finite, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_all_finite, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_scale_in_place, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_scale_in_place, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_convert_array, bf16, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_convert_array, float, bf16)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_convert_array, strata::fp16, float)->Apply(timed_ms);
BENCHMARK_TEMPLATE(BM_convert_array, float, strata::fp16)->Apply(timed_ms);

BENCHMARK_TEMPLATE(BM_built_residual_forward, float)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_residual_forward, bf16)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_residual_backward, float)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_residual_backward, bf16)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_swiglu_forward, float)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_swiglu_forward, bf16)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_swiglu_backward, float)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_swiglu_backward, bf16)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_rmsnorm_forward, float)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_rmsnorm_forward, bf16)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_rmsnorm_backward, float)->Apply(side_by_side_us);
BENCHMARK_TEMPLATE(BM_built_rmsnorm_backward, bf16)->Apply(side_by_side_us);

}  // namespace

BENCHMARK_MAIN();
