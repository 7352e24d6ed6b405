// expect: strata trainer: the model has no `using policy = P;`
// A hand-written model that trains like any other but forgot its policy alias: the trainer names
// the missing member instead of failing deep inside with "no type named 'policy'".
#include <cstdint>

#include "strata/optim/adamw.hpp"
#include "strata/policy/policy.hpp"
#include "strata/train/trainer.hpp"
namespace st = strata;
using P = st::policy<st::host, st::serial, st::fp32>;

struct my_model {
  using T = float;
  double forward(st::tensor_view<const std::int32_t>, st::tensor_view<const std::int32_t>, double) { return 0; }
  void backward() {}
  st::parameter_store<float>& parameters();
};
void train(my_model& m, st::adamw<P>& opt) { st::trainer t(m, opt, st::trainer_options{}); }
