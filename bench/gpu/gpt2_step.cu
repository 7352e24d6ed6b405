// bench/gpu/gpt2_step.cu - one GPT-2 124M training step (seq 1024, bf16, fp32 master weights
// and AdamW moments) as the sequence of strata CUDA kernels that makes it, timed.
//
//   strata_gpt2_step [--batch B] [--steps S] [--tsv FILE] [--calibration FILE]
//
// --calibration writes the planner's device measurements (bf16 GEMM times over 30 shapes and a
// device copy's bandwidth) for strata-plan --calibrate (docs/planner.md, "The time model").
//
// THIS IS A KERNEL-SEQUENCE STEP, NOT strata's layer-integrated trainer: the layers and the
// trainer do not hold device buffers yet. The program lays out GPT-2's parameters, gradients and
// activations in device memory itself and calls the kernels in the order the layers would:
// embedding, 12 x (layernorm, qkv linear, attention, projection, residual + layernorm, fc linear
// + GELU, projection, residual + layernorm), LM head (tied to wte), fused softmax cross-entropy,
// then the backward of each in reverse, the global gradient norm, the device-side amp step and
// AdamW over the flat parameter buffer. Every step trains on the same batch, so the printed loss
// must fall: a smoke test that forward and backward fit together.
//
// Reported: tokens/s and MFU, with FLOPs per token = 6 P + 6 L C T (P = 124,475,904 parameters
// with the vocabulary padded to 50304; attention's 12 L C T halved for causality), the same
// formula bench/gpu/torch_gpt2.py uses. Peak: 989.4 TFLOP/s bf16 dense on H100/H200 SXM (by
// device name), and the measured cuBLASLt GEMM ceiling (8192^3).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_harness.cuh"
#include "strata/kernels/all.hpp"

using namespace strata_gpu_test;
namespace st = strata;
namespace k = strata::kernels;
using st::bf16;

namespace {

constexpr std::int64_t L = 12, C = 768, NH = 12, V = 50257, Vp = 50304, maxT = 1024;

// Offsets of one GPT-2 layer's parameters in the flat buffer (llm.c's order).
struct layer_params {
  std::int64_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};
struct param_layout {
  std::int64_t wte, wpe, lnfw, lnfb, total;
  layer_params layer[L];
};

param_layout make_layout() {
  param_layout p{};
  std::int64_t off = 0;
  auto take = [&off](std::int64_t n) {
    const std::int64_t at = off;
    off += n;
    return at;
  };
  p.wte = take(Vp * C);
  p.wpe = take(maxT * C);
  for (auto& l : p.layer) {
    l.ln1w = take(C);
    l.ln1b = take(C);
    l.qkvw = take(3 * C * C);
    l.qkvb = take(3 * C);
    l.projw = take(C * C);
    l.projb = take(C);
    l.ln2w = take(C);
    l.ln2b = take(C);
    l.fcw = take(4 * C * C);
    l.fcb = take(4 * C);
    l.fcprojw = take(4 * C * C);
    l.fcprojb = take(C);
  }
  p.lnfw = take(C);
  p.lnfb = take(C);
  p.total = off;
  return p;
}

struct layer_acts {
  dvec<bf16> ln1, qkv, atty, attproj, resid2, ln2, fch, fch_gelu, fcproj, x_out;
  dvec<float> ln1_mean, ln1_rstd, lse, ln2_mean, ln2_rstd;
};

double peak_tflops(const std::string& name) {
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.4;
  if (name.find("A100") != std::string::npos) return 312.0;
  return NAN;
}

double gemm_ceiling_tflops() {
  const std::int64_t n = 8192;
  // Random operands, as in the step: a GEMM on zeros runs faster than on data.
  dvec<bf16> A(random_vec<bf16>(static_cast<std::size_t>(n * n), -1, 1, 80)),
      B(random_vec<bf16>(static_cast<std::size_t>(n * n), -1, 1, 81)), Cm(static_cast<std::size_t>(n * n));
  const double ms = time_ms(
      [&] {
        k::cuda_detail::lt_matmul<bf16>("gemm ceiling", false, true, n, n, n, 1.0f, A.get(), n, B.get(), n, 0.0f,
                                        Cm.get(), n);
      },
      10);
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
}

// The time model's measurements (strata-plan --calibrate reads them): bf16 GEMMs over shapes that
// span the efficiency's rise with k and the tile waves, and a device-to-device copy's bandwidth
// (bytes read plus written per second).
void write_calibration(const char* path, const std::string& device_name) {
  const std::int64_t largest = 8192 * 16384;
  dvec<bf16> A(random_vec<bf16>(static_cast<std::size_t>(largest), -1, 1, 82)),
      Bm(random_vec<bf16>(static_cast<std::size_t>(largest), -1, 1, 83)), Cm(static_cast<std::size_t>(largest));
  std::string gemms;
  for (const std::int64_t m : {2048, 8192})
    for (const std::int64_t n : {1024, 4096, 12288})
      for (const std::int64_t kk : {64, 256, 1024, 4096, 12288}) {
        const double ms = time_ms(
            [&] {
              k::cuda_detail::lt_matmul<bf16>("calibration", false, true, m, n, kk, 1.0f, A.get(), kk, Bm.get(), kk,
                                              0.0f, Cm.get(), n);
            },
            5);
        char row[160];
        std::snprintf(row, sizeof row, "%s\n  {\"m\": %lld, \"n\": %lld, \"k\": %lld, \"seconds\": %.6e}",
                      gemms.empty() ? "" : ",", (long long)m, (long long)n, (long long)kk, ms * 1e-3);
        gemms += row;
      }
  const std::size_t bytes = static_cast<std::size_t>(largest) * sizeof(bf16);
  const double copy_ms = time_ms(
      [&] {
        STRATA_CUDA_CHECK(cudaMemcpyAsync(Cm.get(), A.get(), bytes, cudaMemcpyDeviceToDevice, gpu::current_stream()));
      },
      5);
  const bool hopper = device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos;
  std::FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path);
    return;
  }
  std::fprintf(f,
               "{\"base\": \"%s\", \"name\": \"%s measured\", \"storage_bytes\": 2,\n \"gemms\": [%s],\n"
               " \"memory_bandwidth\": %.4e}\n",
               device_name.find("H200") != std::string::npos ? "h200_141gb"
               : hopper                                      ? "h100_80gb"
                                                             : "a100_80gb",
               device_name.c_str(), gemms.c_str(), 2.0 * double(bytes) / (copy_ms * 1e-3));
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t B = 16;
  int steps = 10;
  const std::int64_t T = 1024;
  const char* tsv = nullptr;
  const char* calibration = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) B = std::stoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--tsv" && i + 1 < argc) tsv = argv[++i];
    else if (a == "--calibration" && i + 1 < argc) calibration = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--batch B] [--steps S] [--tsv FILE] [--calibration FILE]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("strata_gpt2_step: no CUDA device found\n");
    return 2;
  }
  try {
    cudaDeviceProp prop{};
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const std::int64_t N = B * T;
    const param_layout P = make_layout();
    std::printf(
        "strata GPT-2 124M kernel-sequence step on %s: B = %lld, T = %lld, %lld parameters, bf16 + fp32 master\n",
        prop.name, (long long)B, (long long)T, (long long)P.total);

    // Parameters: normal(0, 0.02)-ish (uniform with that deviation), LayerNorm weights 1, biases 0.
    std::vector<bf16> h_params(static_cast<std::size_t>(P.total));
    {
      rng r(1337);
      const float a = 0.02f * std::sqrt(3.0f);
      for (auto& x : h_params) x = bf16(r.uniform(-a, a));
      auto fill = [&](std::int64_t off, std::int64_t n, float v) {
        for (std::int64_t i = 0; i < n; ++i) h_params[std::size_t(off + i)] = bf16(v);
      };
      for (const auto& l : P.layer) {
        fill(l.ln1w, C, 1);
        fill(l.ln1b, C, 0);
        fill(l.ln2w, C, 1);
        fill(l.ln2b, C, 0);
        fill(l.qkvb, 3 * C, 0);
        fill(l.projb, C, 0);
        fill(l.fcb, 4 * C, 0);
        fill(l.fcprojb, C, 0);
      }
      fill(P.lnfw, C, 1);
      fill(P.lnfb, C, 0);
      fill(P.wte + V * C, (Vp - V) * C, 0);  // padded vocabulary rows
    }
    dvec<bf16> params(h_params), grads(static_cast<std::size_t>(P.total));
    dvec<float> master(static_cast<std::size_t>(P.total)), m(static_cast<std::size_t>(P.total)),
        v(static_cast<std::size_t>(P.total));
    k::convert_array(st::cuda{}, master.get(), params.get(), P.total);
    h_params.clear();
    h_params.shrink_to_fit();

    // One fixed batch of tokens (targets: the next token).
    std::vector<std::int32_t> h_tok(static_cast<std::size_t>(N + 1));
    {
      rng r(7);
      for (auto& t : h_tok) t = std::int32_t(r.next() % std::uint64_t(V));
    }
    dvec<std::int32_t> tokens(std::vector<std::int32_t>(h_tok.begin(), h_tok.end() - 1));
    dvec<std::int32_t> targets(std::vector<std::int32_t>(h_tok.begin() + 1, h_tok.end()));

    // Activations.
    const std::size_t nc = std::size_t(N * C), rows = std::size_t(N);
    dvec<bf16> encoded(nc), lnf(nc), logits(std::size_t(N * Vp));
    dvec<float> lnf_mean(rows), lnf_rstd(rows), losses(rows);
    std::vector<layer_acts> acts(L);
    for (auto& a : acts) {
      a.ln1 = dvec<bf16>(nc);
      a.qkv = dvec<bf16>(3 * nc);
      a.atty = dvec<bf16>(nc);
      a.attproj = dvec<bf16>(nc);
      a.resid2 = dvec<bf16>(nc);
      a.ln2 = dvec<bf16>(nc);
      a.fch = dvec<bf16>(4 * nc);
      a.fch_gelu = dvec<bf16>(4 * nc);
      a.fcproj = dvec<bf16>(nc);
      a.x_out = dvec<bf16>(nc);
      a.ln1_mean = dvec<float>(rows);
      a.ln1_rstd = dvec<float>(rows);
      a.lse = dvec<float>(std::size_t(B * NH * T));
      a.ln2_mean = dvec<float>(rows);
      a.ln2_rstd = dvec<float>(rows);
    }
    // Backward scratch.
    dvec<bf16> dres(nc), dln(nc), datty(nc), dqkv(3 * nc), dfch(4 * nc), dfch_gelu(4 * nc);

    st::memory_ledger ledger;
    st::workspace ws(ledger);
    st::step_rules amp_opt;
    amp_opt.max_norm = 1.0;
    gpu::amp amp(amp_opt, 1.0);
    const k::adamw_hyper hyper{6e-4, amp_opt.beta1, amp_opt.beta2, 1e-8, 0.1};
    const cudaStream_t s = gpu::current_stream();
    const st::cuda D{};
    bf16* w = params.get();
    bf16* g = grads.get();

    auto step = [&] {
      {
        gpu::nvtx_range r("forward");
        k::embedding_forward(D, encoded.get(), tokens.get(), w + P.wte, w + P.wpe, B, T, C, V);
        k::layernorm_forward(D, acts[0].ln1.get(), acts[0].ln1_mean.get(), acts[0].ln1_rstd.get(), encoded.get(),
                             w + P.layer[0].ln1w, w + P.layer[0].ln1b, N, C, 1e-5f);
        for (std::int64_t l = 0; l < L; ++l) {
          auto& a = acts[std::size_t(l)];
          const auto& p = P.layer[l];
          const bf16* x_in = l == 0 ? encoded.get() : acts[std::size_t(l - 1)].x_out.get();
          k::linear_forward<bf16>(D, ws, a.qkv.get(), a.ln1.get(), w + p.qkvw, w + p.qkvb, N, C, 3 * C);
          k::attention_forward(D, a.atty.get(), a.lse.get(), a.qkv.get(), B, T, C, NH);
          k::linear_forward<bf16>(D, ws, a.attproj.get(), a.atty.get(), w + p.projw, w + p.projb, N, C, C);
          k::residual_layernorm_forward(D, a.resid2.get(), a.ln2.get(), a.ln2_mean.get(), a.ln2_rstd.get(), x_in,
                                        a.attproj.get(), w + p.ln2w, w + p.ln2b, N, C, 1e-5f);
          k::linear_gelu_forward<bf16>(D, ws, a.fch_gelu.get(), a.fch.get(), a.ln2.get(), w + p.fcw, w + p.fcb, N, C,
                                       4 * C);
          k::linear_forward<bf16>(D, ws, a.fcproj.get(), a.fch_gelu.get(), w + p.fcprojw, w + p.fcprojb, N, 4 * C, C);
          if (l + 1 < L) {
            auto& nx = acts[std::size_t(l + 1)];
            k::residual_layernorm_forward(D, a.x_out.get(), nx.ln1.get(), nx.ln1_mean.get(), nx.ln1_rstd.get(),
                                          a.resid2.get(), a.fcproj.get(), w + P.layer[l + 1].ln1w,
                                          w + P.layer[l + 1].ln1b, N, C, 1e-5f);
          } else {
            k::residual_layernorm_forward(D, a.x_out.get(), lnf.get(), lnf_mean.get(), lnf_rstd.get(), a.resid2.get(),
                                          a.fcproj.get(), w + P.lnfw, w + P.lnfb, N, C, 1e-5f);
          }
        }
        k::linear_forward<bf16>(D, ws, logits.get(), lnf.get(), w + P.wte, nullptr, N, C, Vp);
        k::cross_entropy_forward_backward(D, losses.get(), logits.get(), targets.get(), N, V, Vp, 1.0f / float(N),
                                          amp.state());
      }
      {
        gpu::nvtx_range r("backward");
        STRATA_CUDA_CHECK(cudaMemsetAsync(g, 0, std::size_t(P.total) * sizeof(bf16), s));
        // Every kernel writes its input's gradient; each residual's two gradients are added by
        // residual_forward, the layernorm's held in datty (free at those points).
        k::linear_backward<bf16>(D, ws, dln.get(), g + P.wte, nullptr, logits.get(), lnf.get(), w + P.wte, N, C, Vp);
        k::layernorm_backward(D, dres.get(), g + P.lnfw, g + P.lnfb, dln.get(), acts[L - 1].x_out.get(), w + P.lnfw,
                              lnf_mean.get(), lnf_rstd.get(), N, C);
        for (std::int64_t l = L - 1; l >= 0; --l) {
          auto& a = acts[std::size_t(l)];
          const auto& p = P.layer[l];
          const bf16* x_in = l == 0 ? encoded.get() : acts[std::size_t(l - 1)].x_out.get();
          // x_out = resid2 + fcproj: dres is d(x_out) = d(fcproj), and flows on into d(resid2)
          k::linear_backward<bf16>(D, ws, dfch_gelu.get(), g + p.fcprojw, g + p.fcprojb, dres.get(), a.fch_gelu.get(),
                                   w + p.fcprojw, N, 4 * C, C);
          k::gelu_backward(D, dfch.get(), a.fch.get(), dfch_gelu.get(), N * 4 * C);
          k::linear_backward<bf16>(D, ws, dln.get(), g + p.fcw, g + p.fcb, dfch.get(), a.ln2.get(), w + p.fcw, N, C,
                                   4 * C);
          k::layernorm_backward(D, datty.get(), g + p.ln2w, g + p.ln2b, dln.get(), a.resid2.get(), w + p.ln2w,
                                a.ln2_mean.get(), a.ln2_rstd.get(), N, C);
          k::residual_forward(D, dres.get(), dres.get(), datty.get(), N * C);
          // resid2 = x_in + attproj: dres is d(resid2) = d(attproj), and flows on into d(x_in)
          k::linear_backward<bf16>(D, ws, datty.get(), g + p.projw, g + p.projb, dres.get(), a.atty.get(), w + p.projw,
                                   N, C, C);
          k::attention_backward(D, dqkv.get(), datty.get(), a.qkv.get(), a.lse.get(), B, T, C, NH, a.atty.get());
          k::linear_backward<bf16>(D, ws, dln.get(), g + p.qkvw, g + p.qkvb, dqkv.get(), a.ln1.get(), w + p.qkvw, N, C,
                                   3 * C);
          k::layernorm_backward(D, datty.get(), g + p.ln1w, g + p.ln1b, dln.get(), x_in, w + p.ln1w, a.ln1_mean.get(),
                                a.ln1_rstd.get(), N, C);
          k::residual_forward(D, dres.get(), dres.get(), datty.get(), N * C);
        }
        k::embedding_backward(D, g + P.wte, g + P.wpe, dres.get(), tokens.get(), B, T, C);
      }
      {
        gpu::nvtx_range r("optimizer");
        k::grad_norm_squared(D, g, P.total, amp.state());
        k::advance_step(D, amp.state(), amp.options());
        k::adamw_update(D, master.get(), w, g, m.get(), v.get(), P.total, hyper, amp.state());
      }
    };

    auto mean_loss = [&] {
      const auto h = losses.host();
      double sum = 0;
      for (float x : h) sum += x;
      return sum / double(h.size());
    };
    step();
    gpu::check_device_errors();
    const double first_loss = mean_loss();
    step();
    const double ms = time_ms(step, steps, 0);
    gpu::check_device_errors();
    const double last_loss = mean_loss();
    const st::step_state st_ = amp.read();

    const double tokens_per_s = double(N) / (ms * 1e-3);
    const double flops_per_token = 6.0 * double(P.total) + 6.0 * double(L) * double(C) * double(T);
    const double tflops = flops_per_token * tokens_per_s / 1e12;
    const double peak = peak_tflops(prop.name);
    const double ceiling = gemm_ceiling_tflops();
    if (calibration) write_calibration(calibration, prop.name);
    std::printf(
        "step %.2f ms, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of %.1f TFLOP/s peak, %.1f%% of the measured "
        "%.1f TFLOP/s GEMM ceiling\n",
        ms, tokens_per_s, tflops, 100 * tflops / peak, peak, 100 * tflops / ceiling, ceiling);
    std::printf(
        "loss on the fixed batch: %.4f at step 1 -> %.4f after %d more steps; grad norm %.3f; optimizer steps %d\n",
        first_loss, last_loss, steps + 1, st_.norm, st_.step);
    const bool sane = std::isfinite(first_loss) && std::isfinite(last_loss) && last_loss < first_loss &&
                      std::abs(first_loss - std::log(double(V))) < 1.0;
    if (tsv) {
      result_row r;
      r.section = "gpt2";
      r.name = "GPT-2 124M step: strata kernel sequence";
      r.dtype = "bf16";
      r.shape = "B=" + std::to_string(B) + " T=" + std::to_string(T);
      r.pass = sane;
      r.perf = tokens_per_s;
      r.unit = "tokens/s";
      r.of_ceiling = tflops / peak;
      char note[256];
      std::snprintf(note, sizeof note,
                    "MFU %.1f%% (of %.0f peak; %.0f%% of GEMM ceiling); %.2f ms/step; loss %.3f -> %.3f; "
                    "kernel sequence, not the layer-integrated trainer",
                    100 * tflops / peak, peak, 100 * tflops / ceiling, ms, first_loss, last_loss);
      r.note = note;
      write_tsv({r}, tsv);
    }
    if (!sane) {
      std::printf("strata_gpt2_step: the loss did not behave (expected ~ln(V) = %.2f at the start, then falling)\n",
                  std::log(double(V)));
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("strata_gpt2_step: %s\n", e.what());
    return 1;
  }
}
