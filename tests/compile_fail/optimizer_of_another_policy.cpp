// expect: the optimizer's storage type differs from the model's
// An optimizer instantiated for another precision than the model's cannot be paired with it.
#include <strata/optim/adamw.hpp>
#include <strata/parallel/sequential_model.hpp>
#include <strata/train/trainer.hpp>

#include "strata/models/gpt2.hpp"
namespace st = strata;

using P32 = st::policy<st::host, st::serial, st::fp32>;
using PBF16 = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;
void train(st::sequential_model<strata::models::gpt2::model<P32>>& model, st::adamw<PBF16>& opt) {
  st::trainer t(model, opt, st::trainer_options{});
}
