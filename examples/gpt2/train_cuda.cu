// The one-GPU trainer without MPI (train_cuda.hpp): any of fp32, bf16, fp16.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include <strata/kernels/all.hpp>
#include <strata/optim/adamw.hpp>
#include <strata/parallel/sequential_model.hpp>
#include <strata/plan/plan.hpp>
#include <strata/train/corpus.hpp>
#include <strata/train/metrics.hpp>
#include <strata/train/progress.hpp>
#include <strata/train/token_data.hpp>
#include <strata/train/trainer.hpp>

#include "train_cuda.hpp"

namespace gpt2 {
namespace {

namespace st = strata;

template <class Model>
int train_with(const cuda_run& o, const typename Model::config& shape, const cudaDeviceProp& prop) {
  using P = typename Model::policy;
  // The declaration built on this rank: the serial model, its memory on the device.
  st::memory_ledger ledger(st::gpu::device_memory());
  st::sequential_model<Model> net(ledger, shape, st::seed{o.seed});
  st::adamw<P> opt(net, {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  const auto order = st::parse_data_order(o.data_order);
  st::token_stream data = o.data.empty() ? st::token_stream(st::byte_tokens(st::generate_corpus()), o.seed, order)
                                         : st::token_stream::from_glob(o.data, shape.vocab, o.seed, order);
  st::trainer_options topt;
  topt.micro_batch = o.micro_batch;
  topt.schedule = {o.lr, o.lr / 10, std::min(o.warmup, o.steps), o.steps};
  topt.grad_clip = o.grad_clip;
  st::trainer train(net, opt, topt);

  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
  const auto plan = st::plan_model<Model>(shape, {.micro = micro, .global = o.batch}, st::plan_setup{});
  const auto* device = o.hw.empty() ? nullptr : st::hw::find(o.hw);
  STRATA_CHECK(o.hw.empty() || device, "gpt2_train: --hw ", o.hw, " is not a known device");
  std::printf(
      "gpt2_train: %s, %lld layers, %lld heads, d_model %lld, seq %lld, vocab %lld: %lld parameters, %s on %s\n",
      o.llama ? "llama" : "gpt2", (long long)shape.layers, (long long)shape.heads, (long long)shape.d_model,
      (long long)shape.seq, (long long)shape.vocab, (long long)net.parameters().size(), o.precision.c_str(), prop.name);
  std::unique_ptr<st::metrics_file> metrics;
  if (!o.metrics.empty()) metrics = std::make_unique<st::metrics_file>(o.metrics);
  st::progress progress(o.steps, st::parse_progress_style(o.progress));
  for (int s = 0; s < o.steps; ++s) {
    const auto r = train.step(data.next_batch(o.batch, shape.seq));
    progress.update(s + 1, r, " | cuda");
    if (s + 1 == o.steps) progress.end_line();
    if (metrics)
      metrics->write(r, ledger,
                     {.model_flops_per_step = plan.model_flops_per_step,
                      .peak_flops = device ? device->peak_flops(int(sizeof(typename P::storage))) : 0.0,
                      .skipped_steps = train.scaler().skipped_steps()});
  }
  st::gpu::check_device_errors();
  std::printf("device memory: %.1f MB at the peak (%s)\n", double(ledger.total_peak()) / 1e6,
              "parameters, gradients, optimizer state, activations");
  return 0;
}

}  // namespace

int train_on_cuda(const cuda_run& o) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  STRATA_CHECK(rc == cudaSuccess && count > 0, "gpt2_train: --device cuda: no CUDA device (",
               rc == cudaSuccess ? std::string("none found") : std::string(cudaGetErrorString(rc)), ")");
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const auto in = [&]<class Precision>(Precision) {
    using P = st::policy<st::cuda, st::serial, Precision>;
    return o.llama ? train_with<strata::models::llama::model<P>>(o, *o.llama, prop)
                   : train_with<strata::models::gpt2::model<P>>(o, o.shape, prop);
  };
  if (o.precision == "fp32") return in(st::fp32{});
  if (o.precision == "bf16") return in(st::mixed<st::bf16, float>{});
  return in(st::mixed<st::fp16, float>{});
}

}  // namespace gpt2
