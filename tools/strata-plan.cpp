// strata-plan - what a training layout costs per rank, before anything runs.
//
// Three modes, all built on include/strata/plan/plan.hpp. The shape flags describe one of the
// models of strata/models (families.hpp): --model gpt2 (the default), llama (grouped-query
// attention with --kv-heads, SwiGLU of width --ffn, an untied head unless --tied), mixtral (the
// Llama with --experts) or neox (GPT-NeoX), which is planned as any declared model is: plan_model
// sums its own layers' costs under the flags' layout, on a CUDA device in the chosen precision.
//
//   strata-plan --layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 50304
//               --global-batch 512 --micro-batch 8 --dp 8 --zero 1 [--json]
//   strata-plan --model llama --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336
//               --vocab 128256 --seq 8192 --global-batch 512 --dp 8 --tp 8 [--json]
//   strata-plan ... --seq 131072 --global-batch 8 --cp 2 --tp 4 [--cp-form ring|all_to_all]
//       the plan of one layout: memory per rank by category, FLOPs, communication, bubble
//   strata-plan --model mixtral ... --experts 8 --dp 8 --tp 8 --ep 8
//       a mixture of experts with its experts shared out over ep ranks of the gradient group
//   strata-plan --params 70e9 --precision bf16 --optimizer adamw [--master none] [--json]
//       the back-of-envelope model state of N parameters
//   strata-plan --search --gpus 64 --hw a100_80gb <shape flags> --global-batch 512 [--json]
//       every layout of the GPUs that fits, ranked by a stated step-time model
//
// Each mode is a header here: plan_report.hpp (one layout's plan, the model state of --params),
// plan_search.hpp, plan_calibration.hpp; plan_options.hpp holds the flags and the rules between
// them.
//
// Exit codes: 0 done; 1 the plan cannot be made (a layout that does not suit the shape, or a
// search where nothing fits); 2 bad or inconsistent flags.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include <strata/core/error.hpp>
#include <strata/plan/hardware.hpp>
#include <strata/plan/hardware_json.hpp>
#include <strata/policy/support.hpp>

#include "plan_calibration.hpp"
#include "plan_estimate.hpp"
#include "plan_options.hpp"
#include "plan_report.hpp"
#include "plan_search.hpp"
#include "plan_setup.hpp"

using namespace strata_plan;

namespace {

// The device of --hw, or the one --hw-file describes (read into from_file, which holds it).
const st::hw::device_spec& chosen_device(const options& o, st::hw::named_device& from_file) {
  if (o.hw_file.empty()) return *st::hw::find(o.hw);
  try {
    from_file = st::hw::device_from_json_file(o.hw_file);
  } catch (const st::error& e) { throw usage_error(std::string("--hw-file ") + e.what()); }
  return from_file.get();
}

// Plan one layout or search, for the family the flags name.
template <class F>
int run_shape(const options& o, const st::hw::device_spec& d) {
  const typename F::dims shape = F::shape(o.shape);
  return o.search ? run_search<F>(o, shape, d) : run_plan<F>(o, shape, d);
}

int run_family(const options& o, const st::hw::device_spec& device) {
  if (o.model == "gpt2") return run_shape<gpt2_family>(o, device);
  if (o.model == "neox") return run_shape<neox_family>(o, device);
  check_llama_flags(o.shape);
  if (o.model == "mixtral") return run_shape<mixtral_family>(o, device);
  return run_shape<llama_family>(o, device);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "strata-plan: memory, compute and communication per rank of a training layout of a model of strata/models\n"
      "(--model: GPT-2, Llama, Mixtral or GPT-NeoX), before anything runs.\n"
      "Plan one layout (shape flags), estimate the model state of N parameters (--params), or rank every\n"
      "layout of --gpus devices that fits (--search). Exit codes: 0 done, 1 no plan, 2 bad flags."};
  app.footer(search_model_help);
  const plan_flags flags = add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  note_search_pins(flags, o);
  if (o.supported) {
    std::fputs(st::unsupported_combinations_markdown().c_str(), stdout);
    return 0;
  }
  try {
    st::hw::named_device from_file;
    const st::hw::device_spec& device = chosen_device(o, from_file);
    check_family_flags(o, flags);
    if (!o.calibrate.empty()) return run_calibrate(o);
    if (!o.params.empty()) return run_model_state(o, device);
    check_plan_flags(o);
    return run_family(o, device);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "strata-plan: error: %s\n", e.what());
    return 2;
  } catch (const st::error& e) {
    std::string what = e.what();
    if (what.rfind("plan: ", 0) == 0) what.erase(0, 6);
    std::fprintf(stderr, "strata-plan: error: %s\n", what.c_str());
    return 1;
  }
}
