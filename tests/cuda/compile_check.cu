// Compiled by nvcc, never run here (CI has no GPU): checks that
//  1. every strata header, through <strata/strata.hpp>, compiles as CUDA C++20 host code;
//  2. the STRATA_HD conversions of strata/core/dtype.hpp compile to device code for sm_90:
//     the kernel below narrows float to bf16 and fp16 on the device and widens them back;
//  3. the assembly templates get through nvcc's front end when instantiated: a model declared
//     here, built by strata::training under a host policy with every axis dynamic (so the
//     tensor-parallel and pipeline paths of sequential_model are compiled, not only the serial
//     one), and by sequential_model + adamw + trainer under a cuda policy; the same for a
//     Llama-shaped model (RMSNorm, rotary grouped-query attention, SwiGLU, untied head), whose
//     layers reach the CUDA rmsnorm, rope, swiglu and grouped-query attention kernels; and the
//     generator's cached path over both. The functions are defined, never called.
#include <strata/strata.hpp>

#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

namespace strata_cuda_test {

// in[n] -> out_bf16[n], out_fp16[n]; widened[2i], widened[2i + 1]: the bf16 and fp16 values
// converted back to float. Uses the constructors, convert<>, from_float/to_float and from_bits.
__global__ void narrow_and_widen(const float* in, strata::bf16* out_bf16, strata::fp16* out_fp16, float* widened,
                                 std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = in[i];
  const strata::bf16 b(x);
  const strata::fp16 h = strata::convert<strata::fp16>(x);
  out_bf16[i] = strata::bf16::from_bits(strata::bf16::from_float(x));
  out_fp16[i] = strata::fp16::from_bits(h.bits);
  widened[2 * i] = static_cast<float>(b);
  widened[2 * i + 1] = strata::convert<float>(h);  // fp16::to_float
}

// bf16 -> fp16 through float, both directions of convert<> on the device.
__global__ void bf16_to_fp16(const strata::bf16* in, strata::fp16* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = strata::convert<strata::fp16>(in[i]);
}

// Host launchers, so the kernels are referenced and their host stubs are compiled too.
cudaError_t launch_narrow_and_widen(const float* in, strata::bf16* out_bf16, strata::fp16* out_fp16, float* widened,
                                    std::int64_t n, cudaStream_t stream) {
  const unsigned threads = 256;
  const auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
  narrow_and_widen<<<blocks, threads, 0, stream>>>(in, out_bf16, out_fp16, widened, n);
  return cudaGetLastError();
}

cudaError_t launch_bf16_to_fp16(const strata::bf16* in, strata::fp16* out, std::int64_t n, cudaStream_t stream) {
  const unsigned threads = 256;
  const auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
  bf16_to_fp16<<<blocks, threads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

// A declared model (layers/sequential.hpp), the shape of GPT-2.
template <class P>
struct tiny_model {
  using policy = P;
  struct config {
    std::int64_t vocab = 64, seq = 16, layers = 2, heads = 2, d_model = 32;
  };
  static constexpr auto layers(const config& c) {
    return strata::sequential(
        strata::layer<strata::embedding<P>>("", {.vocab = c.vocab, .max_seq = c.seq, .channels = c.d_model}),
        strata::blocks<strata::transformer_block<P>>(
            "h", c.layers, {.channels = c.d_model, .heads = c.heads, .hidden = 4 * c.d_model}),
        strata::layer<strata::layernorm<P>>("ln_f", {.channels = c.d_model}),
        strata::layer<strata::lm_head<P>>("lm_head", {.vocab = c.vocab, .channels = c.d_model, .tied_to = "wte"}));
  }
};

// A declared Llama-shaped model: no position table, 4 query heads sharing 2 key/value heads.
template <class P>
struct tiny_llama {
  using policy = P;
  struct config {
    std::int64_t vocab = 64, seq = 16, layers = 2, heads = 4, kv_heads = 2, d_model = 32, ffn = 96;
  };
  static constexpr auto layers(const config& c) {
    return strata::sequential(
        strata::layer<strata::embedding<P>>("", {.vocab = c.vocab, .max_seq = 0, .channels = c.d_model}),
        strata::blocks<strata::llama_block<P>>("h", c.layers,
                                               {.channels = c.d_model,
                                                .heads = c.heads,
                                                .hidden = c.ffn,
                                                .kv_heads = c.kv_heads,
                                                .rope_theta = 10000.0,
                                                .bias = false}),
        strata::layer<strata::rmsnorm<P>>("norm", {.channels = c.d_model}),
        strata::layer<strata::lm_head<P>>("lm_head", {.vocab = c.vocab, .channels = c.d_model}));
  }
};

using host_layout = strata::parallel<strata::data<strata::dynamic, strata::zero<1>>, strata::tensor<strata::dynamic>,
                                     strata::pipeline<strata::dynamic>>;
using host_policy = strata::policy<strata::host, host_layout, strata::mixed<strata::bf16, float>>;
using cuda_policy = strata::policy<strata::cuda, strata::serial, strata::mixed<strata::bf16, float>>;

double assembled_host_step(strata::world& w, const strata::token_batch& b) {
  strata::training<tiny_model<host_policy>> run(w, {});
  const auto r = run.step(b);
  return r.loss + run.plan({.micro = 1, .global = 4}).flops_per_step + double(run.serial_weights().size());
}

double cuda_step(const strata::token_batch& b) {
  using model = tiny_model<cuda_policy>;
  strata::memory_ledger ledger(strata::gpu::device_memory());
  strata::sequential_model<model> net(ledger, {}, strata::seed{1});
  strata::adamw<cuda_policy> opt(net, {});
  strata::trainer train(net, opt, strata::trainer_options{});
  const auto r = train.step(b);
  return r.loss + strata::plan_model<model>({}, {.micro = 1, .global = 4}, strata::plan_setup{}).flops_per_step;
}

double cuda_llama_step(const strata::token_batch& b) {
  using model = tiny_llama<cuda_policy>;
  strata::memory_ledger ledger(strata::gpu::device_memory());
  strata::sequential_model<model> net(ledger, {}, strata::seed{1});
  strata::adamw<cuda_policy> opt(net, {});
  strata::trainer train(net, opt, strata::trainer_options{});
  const auto r = train.step(b);
  return r.loss + strata::plan_model<model>({}, {.micro = 1, .global = 4}, strata::plan_setup{}).flops_per_step;
}

double assembled_host_llama_step(strata::world& w, const strata::token_batch& b) {
  strata::training<tiny_llama<host_policy>> run(w, {});
  return run.step(b).loss;
}

// Generation (train/generate.hpp): the cached path of every layer, on the host under an assembled
// run and under a cuda policy (where the cache is refused at run time: no device kernel yet, so
// the uncached reference is what runs there).
std::size_t assembled_host_generate(strata::world& w, const std::vector<std::int32_t>& prompt) {
  strata::training<tiny_llama<host_policy>> run(w, {});
  strata::generator gen(run);
  return gen.generate(prompt, {.new_tokens = 4, .sample = {.temperature = 0.8, .top_k = 8, .seed = 1}}).size();
}
std::size_t cuda_generate(const std::vector<std::int32_t>& prompt) {
  strata::memory_ledger ledger(strata::gpu::device_memory());
  strata::sequential_model<tiny_model<cuda_policy>> net(ledger, {}, strata::seed{1});
  strata::generator gen(net);
  return gen.generate(prompt, {.new_tokens = 4}).size() +
         gen.generate(prompt, {.new_tokens = 4, .cache = false}).size();
}

}  // namespace strata_cuda_test
