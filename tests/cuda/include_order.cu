// tests/cuda/include_order.cu - the order of strata's kernel includes does not matter, and a CUDA
// program needs no BLAS.
//
// A template that calls kernels::op(Device{}, ...) by its qualified name finds only the overloads
// declared before the template; a CUDA overload declared after it is never considered. The first
// part of this file stands for a layer header: it includes the per-op headers it calls and then
// defines templates calling them. The aggregate kernels/all.hpp comes after those templates, the
// order that used to hide the CUDA overloads. Each template is instantiated with strata::host and
// with a user tag derived from strata::cuda, which converts to no host overload: it compiles only
// because kernels/<op>.hpp declared the CUDA overload before the template.
//
// Built by nvcc with warnings as errors and STRATA_HOST_BLAS=0, and linked against the CUDA
// runtime, cuBLASLt and OpenMP only - not strata::strata, so no OpenBLAS: a host kernel that still
// called cblas_* would leave an undefined symbol and fail the link (tests/cuda/CMakeLists.txt).
//
//   strata_include_order          the host half: linear_forward through the portable GEMM, and
//                                 GELU, against plain loops (ctest cuda.include_order)
//   strata_include_order --gpu    the CUDA half too, against the host half (needs a GPU)
#include "strata/kernels/gelu.hpp"
#include "strata/kernels/linear.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string_view>
#include <vector>

static_assert(STRATA_HOST_BLAS == 0, "this test builds the host GEMM without a BLAS");

namespace include_order_test {

// What a layer does: one call per op, the device a template parameter.
template <class Device, class T>
void project_then_gelu(strata::workspace& ws, T* out, T* pre, const T* inp, const T* weight, const T* bias,
                       std::int64_t N, std::int64_t C, std::int64_t OC) {
  strata::kernels::linear_forward(Device{}, ws, pre, inp, weight, bias, N, C, OC);
  strata::kernels::gelu_forward(Device{}, out, pre, N * OC);
}

}  // namespace include_order_test

// Everything else after the templates: the order that used to hide the CUDA overloads.
#include "strata/kernels/all.hpp"

namespace {

namespace st = strata;
namespace t = include_order_test;

struct my_gpu : st::cuda {};
struct my_cpu : st::host {};

constexpr std::int64_t N = 6, C = 40, OC = 24;

// Inputs the same on both devices: small exact values, so the plain loop below is exact.
void fill(std::vector<float>& inp, std::vector<float>& weight, std::vector<float>& bias) {
  inp.resize(N * C);
  weight.resize(OC * C);
  bias.resize(OC);
  for (std::size_t i = 0; i < inp.size(); ++i) inp[i] = float(int(i % 7) - 3) / 8;
  for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = float(int(i % 5) - 2) / 4;
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = float(i) / 16;
}

int run_host(std::vector<float>& out) {
  std::vector<float> inp, weight, bias, pre(N * OC);
  fill(inp, weight, bias);
  out.assign(N * OC, 0.0f);
  st::memory_ledger ledger;
  st::workspace ws(ledger);
  t::project_then_gelu<my_cpu>(ws, out.data(), pre.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  int failures = 0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < OC; ++o) {
      double s = bias[o];
      for (std::int64_t c = 0; c < C; ++c) s += double(inp[n * C + c]) * double(weight[o * C + c]);
      const double x = s, gelu = 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
      if (pre[n * OC + o] != float(s) || std::fabs(out[n * OC + o] - gelu) > 1e-5 * (1 + std::fabs(gelu))) ++failures;
    }
  std::printf("include_order: host linear (portable GEMM) + GELU: %d of %ld outputs wrong\n", failures, long(N * OC));
  return failures == 0 ? 0 : 1;
}

int run_gpu(const std::vector<float>& host_out) {
  std::vector<float> inp, weight, bias;
  fill(inp, weight, bias);
  st::gpu::device_buffer<float> d_inp(inp.size()), d_weight(weight.size()), d_bias(bias.size()), d_pre(N * OC),
      d_out(N * OC);
  d_inp.upload(inp.data(), inp.size());
  d_weight.upload(weight.data(), weight.size());
  d_bias.upload(bias.data(), bias.size());
  st::memory_ledger ledger;
  st::workspace ws(ledger);
  t::project_then_gelu<my_gpu>(ws, d_out.data(), d_pre.data(), d_inp.data(), d_weight.data(), d_bias.data(), N, C, OC);
  std::vector<float> out(N * OC);
  d_out.download(out.data(), out.size());
  int failures = 0;
  for (std::size_t i = 0; i < out.size(); ++i)
    if (std::fabs(out[i] - host_out[i]) > 1e-5 * (1 + std::fabs(host_out[i]))) ++failures;
  std::printf("include_order: CUDA linear + GELU against the host: %d of %ld outputs wrong\n", failures, long(N * OC));
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<float> host_out;
    int status = run_host(host_out);
    if (argc > 1 && std::string_view(argv[1]) == "--gpu") status |= run_gpu(host_out);
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "include_order: %s\n", e.what());
    return 1;
  }
}
