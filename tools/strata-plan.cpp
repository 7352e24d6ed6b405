// strata-plan - what a training layout costs per rank, before anything runs.
//
// Three modes, all built on include/strata/plan/plan.hpp. The shape flags describe one of the
// example models, --model gpt2 (examples/gpt2/gpt2.hpp, the default) or --model llama
// (examples/llama/llama.hpp: grouped-query attention with --kv-heads, SwiGLU of width --ffn, an
// untied head unless --tied), which is planned as any declared model is: plan_model sums its own
// layers' costs under the flags' layout, on a CUDA device in the chosen precision.
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
// Exit codes: 0 done; 1 the plan cannot be made (a layout that does not suit the shape, or a
// search where nothing fits); 2 bad or inconsistent flags.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/core/json_number.hpp>
#include <strata/plan/plan.hpp>

#include "common/cli_checks.hpp"
#include "common/model_families.hpp"

namespace st = strata;

namespace {

// ---------------------------------------------------------------------------------------------
// Text formatting
// ---------------------------------------------------------------------------------------------

std::string printf_string(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printf_string(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// 124475904 -> "124,475,904".
std::string grouped(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

// Decimal gigabytes (1 GB = 1e9 bytes, as the device presets state memory).
std::string gb(double bytes) {
  const double g = bytes / 1e9;
  if (g == 0) return "0";
  if (std::fabs(g) >= 10) return printf_string("%.1f", g);
  if (std::fabs(g) >= 1) return printf_string("%.2f", g);
  return printf_string("%.3g", g);
}

std::string percent(double share) { return printf_string("%.1f%%", 100.0 * share); }

// 3.88e17 -> "388 PFLOP" (unit after an SI prefix).
std::string si(double v, const char* unit) {
  static const char* const prefixes[] = {"", "k", "M", "G", "T", "P", "E", "Z"};
  int k = 0;
  while (std::fabs(v) >= 1000 && k < 7) {
    v /= 1000;
    ++k;
  }
  return printf_string("%.3g %s%s", v, prefixes[k], unit);
}

std::string seconds_text(double s) {
  if (s >= 1000) return printf_string("%.0f s", s);
  if (s >= 1) return printf_string("%.4g s", s);
  if (s >= 1e-3) return printf_string("%.4g ms", s * 1e3);
  return printf_string("%.3g us", s * 1e6);
}

// ---------------------------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------------------------

// A mistake in the flags themselves: reported like CLI11's own and exits 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A parameter count written whole (70000000000) or in exponent form (70e9, 1.3e9).
constexpr double max_param_count = 1e15;
std::int64_t parse_param_count(const std::string& text, std::string* why) {
  const auto parsed = cli_checks::parse_real(text);
  if (!parsed) {
    *why = "expected a parameter count such as 70e9 or 70000000000, got '" + text + "'";
    return 0;
  }
  const double v = *parsed;
  if (v < 1 || v > max_param_count) {
    *why = "must be between 1 and 1e15, got " + text;
    return 0;
  }
  if (v != std::floor(v)) {
    *why = "must be a whole number of parameters, got " + text;
    return 0;
  }
  return static_cast<std::int64_t>(v);
}
CLI::Validator param_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::string why;
        parse_param_count(text, &why);
        return why;
      },
      "N");
}

std::string preset_names() {
  std::string names;
  for (const auto& d : st::hw::presets) names += (names.empty() ? "" : ", ") + std::string(d.name);
  return names;
}
CLI::Validator device_preset() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (st::hw::find(text)) return {};
        return "unknown device '" + text + "'; the presets are " + preset_names();
      },
      "NAME");
}

struct options {
  // model shape
  std::string model = "gpt2";
  example_models::model_shape shape;
  std::int64_t global_batch = 0, micro_batch = 1;
  // layout
  int dp = 1, cp = 1, tp = 1, pp = 1, virtual_chunks = 1, zero = 0;
  int ep = 1;  // Mixtral: experts shared out over ep ranks of the gradient group dp x cp (not a factor of the world)
  bool sp = false;
  std::string cp_form = "ring";
  std::string recompute = "none", precision = "bf16", optimizer = "adamw", schedule;
  std::string hw = "h100_80gb";
  bool json = false;
  // back-of-envelope
  std::string params, master;
  // search
  bool search = false;
  int gpus = 0, top = 10;
  double efficiency = 0.5;
};

// ---------------------------------------------------------------------------------------------
// Planning helpers
// ---------------------------------------------------------------------------------------------

int storage_bytes_of(const std::string& precision) { return precision == "fp32" ? 4 : 2; }

std::string precision_text(const std::string& precision) {
  return precision == "fp32" ? "fp32 (the weights are their own master copy)" : precision + " with fp32 master weights";
}

// ---------------------------------------------------------------------------------------------
// The model families the shape flags describe
// ---------------------------------------------------------------------------------------------
//
// examples/common/model_families.hpp names each example's dims and model template, fills the
// dims from the flags and describes the shape in words and JSON. The modes below are templates
// on the family: every figure is plan_model's sum of that model's own layers' costs, never a
// formula of the tool's.

using example_models::gpt2_family;
using example_models::llama_family;
using example_models::mixtral_family;

// What Llama's layers would refuse of the shape flags, said in the flags' words.
void check_llama_flags(const example_models::model_shape& s) {
  if (s.kv_heads > 0 && s.heads % s.kv_heads != 0)
    throw usage_error("--kv-heads " + std::to_string(s.kv_heads) + " does not divide --heads " +
                      std::to_string(s.heads));
  if ((s.d_model / s.heads) % 2 != 0)
    throw usage_error("the rotary embedding needs an even head size, got --hidden " + std::to_string(s.d_model) +
                      " / --heads " + std::to_string(s.heads) + " = " + std::to_string(s.d_model / s.heads));
}

// A family's model in a precision, on a GPU (its kernels and memory; attention keeps one logsumexp
// per query row, as on the host). plan_model takes the layout from the setup, so the policy's own
// layout is not read.
template <class F, class Precision>
using on_gpu = typename F::template model<st::policy<st::cuda, st::serial, Precision>>;

template <class F>
st::plan_result plan_with(const std::string& precision, const typename F::dims& m, const st::batch& b,
                          const st::plan_setup& s) {
  if (precision == "fp32") return st::plan_model<on_gpu<F, st::fp32>>(m, b, s);
  if (precision == "fp16") return st::plan_model<on_gpu<F, st::mixed<st::fp16, float>>>(m, b, s);
  return st::plan_model<on_gpu<F, st::mixed<st::bf16, float>>>(m, b, s);
}

// Whether a tensor-parallel degree suits the model: the extents its layers list (heads, key/value
// heads, which a degree may also be a multiple of, the FFN width), as plan_model checks them.
template <class F>
bool tensor_degree_fits(const typename F::dims& m, int tp) {
  try {
    st::check_tensor_extents<on_gpu<F, st::mixed<st::bf16, float>>>(m, tp);
    return true;
  } catch (const st::error&) { return false; }
}

// Context parallelism's demands on the shape, in the flags' words (plan mode) or as a yes/no
// (the search): each sequence cuts into 2·cp equal chunks (layers/context_split.hpp), and the
// all-to-all form splits this tensor rank's query heads and key/value heads over cp (attention's
// shape_of: H/t query heads, KV/t key/value heads or one when fewer than tensor ranks).
template <class Dims>
std::int64_t kv_heads_of(const Dims& m) {
  if constexpr (requires { m.kv(); }) return m.kv();
  else return m.heads;  // GPT-2: as many key/value heads as heads
}
template <class Dims>
std::string context_problem(const Dims& m, int tp, int cp, const std::string& form) {
  if (cp == 1) return {};
  if constexpr (requires { m.experts; })
    return printf_string(
        "--cp %d: a mixture of experts under context parallelism is not supported yet (its "
        "per-sequence router statistics would be split over the context group); the trainer "
        "refuses it too",
        cp);
  if (m.seq % (2 * cp) != 0)
    return printf_string("--cp %d cuts each sequence into 2 x %d = %d chunks, which do not divide --seq %lld", cp, cp,
                         2 * cp, (long long)m.seq);
  if (form != "all_to_all" || m.heads % tp != 0) return {};  // a tp that does not suit the heads: the plan says so
  const std::int64_t kv = kv_heads_of(m), heads_t = m.heads / tp, kv_t = kv >= tp ? kv / tp : 1;
  if (heads_t % cp == 0 && kv_t % cp == 0) return {};
  return printf_string(
      "--cp-form all_to_all over --cp %d needs the heads per tensor rank divisible by %d, got %lld query heads "
      "(%lld / --tp %d) and %lld key/value head%s (%lld over --tp %d); use --cp-form ring",
      cp, cp, (long long)heads_t, (long long)m.heads, tp, (long long)kv_t, kv_t == 1 ? "" : "s", (long long)kv, tp);
}

std::string schedule_tag(st::pipeline_schedule_kind k) {
  switch (k) {
    case st::pipeline_schedule_kind::gpipe: return "gpipe";
    case st::pipeline_schedule_kind::interleaved: return "interleaved_1f1b";
    default: return "one_f_one_b";
  }
}

// One layout as the planner takes it. microbatches: per step and data-parallel rank; ep: the
// expert-parallel degree, within dp x cp.
st::plan_setup make_setup(int dp, int cp, const std::string& cp_form, int tp, int pp, int v, int zero, bool sp,
                          std::int64_t microbatches, st::recompute_mode rc, st::optimizer_kind opt,
                          st::pipeline_schedule_kind schedule, int ep) {
  st::plan_setup s;
  s.layout.dp = dp;
  s.layout.cp = cp;
  s.layout.ep = ep;
  s.layout.context_form = cp_form;
  s.layout.tp = tp;
  s.layout.pp = pp;
  s.layout.virtual_chunks = v;
  s.layout.zero_stage = zero;
  s.layout.sequence_parallel = sp;
  s.layout.microbatches = static_cast<int>(std::max<std::int64_t>(microbatches, 1));
  s.layout.schedule = schedule_tag(schedule);
  s.recompute = rc;
  s.optimizer = opt;
  s.schedule = schedule;
  return s;
}

// ---------------------------------------------------------------------------------------------
// The step-time model (the ranking of --search; plan mode prints the same estimate)
// ---------------------------------------------------------------------------------------------
//
// An analytic estimate, meant to order layouts rather than to predict a wall clock:
//
//   peak        = the device's dense peak for the storage precision (16-bit or fp32)
//   gpus        = dp x cp x tp x pp
//   T_compute   = flops_per_rank / (efficiency x peak)
//                 (the plan's flops_per_rank: the busiest pipeline stage's FLOPs of one step,
//                 recomputation included, over its dp x cp x tp ranks)
//   placement   : ranks are numbered tp fastest, then cp, then dp, then pp (policy/mesh_axes.hpp),
//                 so a tp group spans tp consecutive ranks, a cp group has its members tp apart,
//                 a dp group tp·cp apart, a pp group tp·cp·dp apart. A group uses the intra-node
//                 bandwidth and latency when every copy of it lies within one node of
//                 gpus_per_node ranks, and the inter-node ones otherwise.
//   T_tp        = comm_bytes.tp / bw(tp) + latency(tp) x 4 x (layers / pp) x microbatches
//                 (about four tensor-parallel collectives per block and micro-batch; 0 at tp 1)
//   T_cp        = comm_bytes.cp / bw(cp) + latency(cp) x steps x (layers / pp) x microbatches
//                 (0 at cp 1). steps: the exchanges one block's attention waits for per
//                 micro-batch (layers/context_attention.hpp). Ring: cp-1 forward (the K/V
//                 blocks, one hop each) and cp backward (the blocks again with their dK/dV
//                 accumulators, which take one hop more to come home), 2·cp-1; all-to-all: 2
//                 forward (qkv to heads, the output back) and 2 backward, 4. Recomputation
//                 (selective or full) runs the forward exchanges again: + cp-1, or + 2.
//   T_pp        = comm_bytes.pp / bw(pp)
//   T_ep        = comm_bytes.ep / bw(ep) + latency(ep) x steps x (layers / pp) x microbatches
//                 (0 at ep 1; every block of the MoE model has its mixture). The expert group is
//                 ep consecutive members of the gradient group: ep ranks of stride tp. steps: the
//                 all-to-alls one block waits for per micro-batch (layers/moe.hpp): 3 forward
//                 (the counts, the rows to their experts, the outputs back) and 2 backward (the
//                 output gradients out, the input gradients back), 5; full recomputation runs
//                 the forward's 3 again (selective recomputation does not redo the mixture).
//   T_dp        = comm_bytes.dp / bw(dp)   (the gradient group dp x cp, whose members are tp
//                 apart: placed as a group of dp·cp ranks of stride tp; under expert
//                 parallelism the experts' reduction over the expert-data group is in the same
//                 bytes, timed at the same bandwidth; not overlapped with compute: conservative)
//   T_step      = (T_compute + T_tp + T_cp + T_pp + T_ep) / (1 - bubble) + T_dp
//
// comm_bytes are the plan's per-rank ring volumes per step; the embedding group's all-reduce of
// the tied table is not part of the model, and neither is any overlap of the ring's transfers
// with attention's compute (which context_attention posts ahead). Reported with it:
//   tokens_per_s   = global_batch x seq / T_step
//   tflops_per_gpu = model_flops_per_step / T_step / gpus / 1e12   (model FLOPs: no recomputation)
//   mfu            = tflops_per_gpu x 1e12 / peak

struct step_estimate {
  double compute_s = 0, tp_s = 0, cp_s = 0, pp_s = 0, ep_s = 0, dp_s = 0, step_s = 0;
  double tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0;
  bool tp_intra = true, cp_intra = true, dp_intra = true, pp_intra = true, ep_intra = true;
};

// Whether every copy of the group along one axis (members `stride` ranks apart, `size` of them)
// lies within one node, ranks numbered tp fastest, then cp, then dp, then pp.
bool group_within_node(int ranks, int per_node, int stride, int size) {
  if (size <= 1) return true;
  for (int r = 0; r < ranks; ++r) {
    if ((r / stride) % size != 0) continue;  // r is not the first member of its copy
    if (r / per_node != (r + (size - 1) * stride) / per_node) return false;
  }
  return true;
}

template <class Dims>
step_estimate estimate_step(const st::plan_result& r, const st::plan_setup& s, const Dims& m, const st::batch& b,
                            const st::hw::device_spec& d, int storage_bytes, double efficiency) {
  const int tp = s.layout.tp, cp = s.layout.cp, dp = s.layout.dp, pp = s.layout.pp, gpus = tp * cp * dp * pp;
  const int ep = s.layout.ep;
  const double peak = d.peak_flops(storage_bytes);
  step_estimate e;
  e.tp_intra = group_within_node(gpus, d.gpus_per_node, 1, tp);
  e.cp_intra = group_within_node(gpus, d.gpus_per_node, tp, cp);
  // The gradient group dp x cp: cp and dp are adjacent in the rank order, so its members are tp apart.
  e.dp_intra = group_within_node(gpus, d.gpus_per_node, tp, dp * cp);
  e.pp_intra = group_within_node(gpus, d.gpus_per_node, tp * cp * dp, pp);
  // The expert group: ep consecutive members of the gradient group, so tp apart too.
  e.ep_intra = group_within_node(gpus, d.gpus_per_node, tp, ep);
  const auto bw = [&](bool intra) { return intra ? d.intra_node_bandwidth : d.inter_node_bandwidth; };
  const auto latency = [&](bool intra) { return intra ? d.intra_node_latency : d.inter_node_latency; };
  const double block_micro = double(m.layers / pp) * double(r.microbatches);  // blocks x micro-batches

  e.compute_s = r.flops_per_rank / (efficiency * peak);
  if (tp > 1) e.tp_s = r.comm_bytes.tp / bw(e.tp_intra) + latency(e.tp_intra) * 4.0 * block_micro;
  if (cp > 1) {
    const bool ring = s.layout.context_form != "all_to_all";
    const bool again = s.recompute != st::recompute_mode::none;  // the forward's exchanges run again
    const double steps = ring ? (2.0 * cp - 1) + (again ? cp - 1 : 0) : 4.0 + (again ? 2 : 0);
    e.cp_s = r.comm_bytes.cp / bw(e.cp_intra) + latency(e.cp_intra) * steps * block_micro;
  }
  if (pp > 1) e.pp_s = r.comm_bytes.pp / bw(e.pp_intra);
  if (ep > 1) {
    // Counts, rows out, outputs back forward; gradients out and back backward; full
    // recomputation runs the forward's three again.
    const double steps = 5.0 + (s.recompute == st::recompute_mode::full ? 3 : 0);
    e.ep_s = r.comm_bytes.ep / bw(e.ep_intra) + latency(e.ep_intra) * steps * block_micro;
  }
  if (dp * cp > 1) e.dp_s = r.comm_bytes.dp / bw(e.dp_intra);
  e.step_s = (e.compute_s + e.tp_s + e.cp_s + e.pp_s + e.ep_s) / (1.0 - r.bubble_fraction) + e.dp_s;
  e.tokens_per_s = double(b.global) * double(m.seq) / e.step_s;
  e.tflops_per_gpu = r.model_flops_per_step / e.step_s / double(gpus) / 1e12;
  e.mfu = e.tflops_per_gpu * 1e12 / peak;
  return e;
}

// The parameter counts and model-state bytes, in the order both JSON outputs give them.
void add_model_state_fields(nlohmann::ordered_json& out, const st::plan_result& r) {
  out["params_total"] = r.params_total;
  out["params_active"] = r.params_active;
  out["params_per_rank"] = r.params_per_rank;
  out["expert_params_per_rank"] = r.expert_params_per_rank;
  out["params_bytes"] = r.params_bytes;
  out["grads_bytes"] = r.grads_bytes;
  out["master_bytes"] = r.master_bytes;
  out["optimizer_bytes"] = r.optimizer_bytes;
  out["model_state_bytes"] = r.model_state_bytes();
}

nlohmann::ordered_json estimate_json(const step_estimate& e) {
  return {{"step_time_s", st::json_number(e.step_s)},
          {"compute_s", st::json_number(e.compute_s)},
          {"tp_s", st::json_number(e.tp_s)},
          {"cp_s", st::json_number(e.cp_s)},
          {"pp_s", st::json_number(e.pp_s)},
          {"ep_s", st::json_number(e.ep_s)},
          {"dp_s", st::json_number(e.dp_s)},
          {"tokens_per_s", st::json_number(e.tokens_per_s)},
          {"tflops_per_gpu", st::json_number(e.tflops_per_gpu)},
          {"mfu", st::json_number(e.mfu)}};
}

std::string device_text(const st::hw::device_spec& d, int storage_bytes) {
  return printf_string("%s: %g GB, %s/s peak (%s), %d per node, %g GB/s in a node, %g GB/s between nodes",
                       std::string(d.name).c_str(), d.memory_bytes / 1e9,
                       si(d.peak_flops(storage_bytes), "FLOP").c_str(), storage_bytes <= 2 ? "16-bit" : "fp32",
                       d.gpus_per_node, d.intra_node_bandwidth / 1e9, d.inter_node_bandwidth / 1e9);
}

// ---------------------------------------------------------------------------------------------
// Mode 1: the plan of one layout
// ---------------------------------------------------------------------------------------------

template <class F>
int run_plan(const options& o, const typename F::dims& m, const st::hw::device_spec& d) {
  const st::batch b{.micro = o.micro_batch, .global = o.global_batch};
  auto schedule =
      o.virtual_chunks > 1 ? st::pipeline_schedule_kind::interleaved : st::pipeline_schedule_kind::one_f_one_b;
  if (!o.schedule.empty()) schedule = st::parse_pipeline_schedule(o.schedule);
  if (o.virtual_chunks > 1 && schedule != st::pipeline_schedule_kind::interleaved)
    throw usage_error("--virtual " + std::to_string(o.virtual_chunks) +
                      " needs --schedule interleaved, got --schedule " + o.schedule);
  const std::int64_t per_dp = o.dp * o.micro_batch;
  const std::int64_t microbatches = o.global_batch % per_dp == 0 ? o.global_batch / per_dp : 1;
  const auto opt = o.optimizer == "sgd" ? st::optimizer_kind::sgd : st::optimizer_kind::adamw;
  if (const std::string why = context_problem(m, o.tp, o.cp, o.cp_form); !why.empty()) throw usage_error(why);
  if ((o.dp * o.cp) % o.ep != 0)
    throw usage_error(
        printf_string("--ep %d does not divide --dp %d x --cp %d = %d (the expert group lies within the "
                      "gradient group dp x cp)",
                      o.ep, o.dp, o.cp, o.dp * o.cp));
  const st::plan_setup setup = make_setup(o.dp, o.cp, o.cp_form, o.tp, o.pp, o.virtual_chunks, o.zero, o.sp,
                                          microbatches, st::parse_recompute_mode(o.recompute), opt, schedule, o.ep);
  const st::plan_result r = plan_with<F>(o.precision, m, b, setup);
  const int storage = storage_bytes_of(o.precision);
  const bool fits = r.fits(d);
  const step_estimate e = estimate_step(r, setup, m, b, d, storage, o.efficiency);
  const bool sp = o.sp && o.tp > 1;
  const double mem = d.memory_bytes;

  if (o.json) {
    const nlohmann::ordered_json layout = {{"dp", o.dp},
                                           {"cp", o.cp},
                                           {"context_form", o.cp_form},
                                           {"ep", o.ep},
                                           {"tp", o.tp},
                                           {"pp", o.pp},
                                           {"virtual", o.virtual_chunks},
                                           {"zero", o.zero},
                                           {"micro_batch", o.micro_batch},
                                           {"microbatches", r.microbatches},
                                           {"sp", sp},
                                           {"recompute", o.recompute},
                                           {"schedule", std::string(st::schedule_label(schedule))},
                                           {"precision", o.precision},
                                           {"optimizer", o.optimizer}};
    nlohmann::ordered_json out;
    out["model"] = F::name;
    out["shape"] = F::shape_json(m);
    out["hw"] = std::string(d.name);
    out["device_memory_bytes"] = st::json_number(mem);
    out["layout"] = layout;
    out["global_batch"] = o.global_batch;
    add_model_state_fields(out, r);
    out["activation_bytes"] = r.activation_bytes;
    out["activation_peak_bytes"] = r.activation_high_bytes();
    out["activation_bytes_per_microbatch"] = r.activation_bytes_per_microbatch;
    out["in_flight"] = r.in_flight;
    out["comm_buffer_bytes"] = r.comm_buffer_bytes;
    out["total_bytes"] = r.total_bytes();
    out["memory_fraction"] = st::json_number(double(r.total_bytes()) / mem);
    out["fits"] = fits;
    out["flops_per_step"] = st::json_number(r.flops_per_step);
    out["model_flops_per_step"] = st::json_number(r.model_flops_per_step);
    out["flops_per_rank"] = st::json_number(r.flops_per_rank);
    out["comm_bytes"] = {{"dp", st::json_number(r.comm_bytes.dp)},
                         {"cp", st::json_number(r.comm_bytes.cp)},
                         {"tp", st::json_number(r.comm_bytes.tp)},
                         {"pp", st::json_number(r.comm_bytes.pp)},
                         {"embedding", st::json_number(r.comm_bytes.embedding)},
                         {"ep", st::json_number(r.comm_bytes.ep)}};
    out["bubble_fraction"] = st::json_number(r.bubble_fraction);
    out["estimate"] = estimate_json(e);
    out["efficiency"] = st::json_number(o.efficiency);
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }

  const int ranks = o.dp * o.cp * o.tp * o.pp;
  const int replicas = o.dp * o.cp;  // the gradient group, over which ZeRO shards
  const bool cp = o.cp > 1;
  // The context axis appears where it splits (as layout_config::degrees_text writes it).
  const std::string cp_text = cp ? printf_string(" x cp %d", o.cp) : std::string();
  const std::string context_text = cp ? printf_string("context parallel %s, ", o.cp_form.c_str()) : std::string();
  // Expert parallelism: ep ranks of the gradient group share each block's experts out; the ranks
  // ep apart hold the same experts (the expert-data group), over which ZeRO shards them.
  const bool ep = o.ep > 1;
  const int expert_replicas = replicas / o.ep;
  const std::string expert_text =
      ep ? printf_string("expert parallel ep %d within dp%s = %d, ", o.ep, cp ? " x cp" : "", replicas) : std::string();
  const std::string zero_text =
      printf_string("ZeRO-%d%s", o.zero, cp && o.zero > 0 ? printf_string(" over dp x cp = %d", replicas).c_str() : "");
  if (r.params_active != r.params_total)
    std::printf("strata-plan: %s (%s parameters, %s active per token)\n", F::shape_text(m).c_str(),
                grouped(r.params_total).c_str(), grouped(r.params_active).c_str());
  else std::printf("strata-plan: %s (%s parameters)\n", F::shape_text(m).c_str(), grouped(r.params_total).c_str());
  std::printf("layout:   dp %d%s x tp %d x pp %d = %d rank%s, %s%s%s, %s, recompute %s", o.dp, cp_text.c_str(), o.tp,
              o.pp, ranks, ranks == 1 ? "" : "s", context_text.c_str(), expert_text.c_str(), zero_text.c_str(),
              sp ? "sequence parallel" : "no sequence parallelism", o.recompute.c_str());
  if (o.pp > 1 || o.virtual_chunks > 1)
    std::printf(", %s schedule, %d chunk%s per stage", std::string(st::schedule_label(schedule)).c_str(),
                o.virtual_chunks, o.virtual_chunks > 1 ? "s" : "");
  std::printf("\n");
  std::printf("training: %s, %s; global batch %lld = dp %d x %lld micro-batch%s of %lld\n",
              precision_text(o.precision).c_str(), opt == st::optimizer_kind::adamw ? "AdamW" : "SGD with momentum",
              (long long)o.global_batch, o.dp, (long long)r.microbatches, r.microbatches == 1 ? "" : "es",
              (long long)o.micro_batch);
  std::printf("device:   %s\n", device_text(d, storage).c_str());

  const auto shard = [&](int from_stage) {
    if (o.zero < from_stage || replicas == 1) return std::string();
    return printf_string(", ZeRO-%d shard of %d", o.zero, replicas) +
           (ep ? printf_string(", experts over %d", expert_replicas) : std::string());
  };
  // The rows first, then printed with the labels in one column (wider where the ZeRO notes of
  // expert parallelism make a label longer than 50). A row without bytes is a note.
  std::vector<std::pair<std::string, double>> rows;
  const auto row = [&](const std::string& label, double bytes) { rows.emplace_back(label, bytes); };
  row("parameters (" + grouped(r.params_per_rank) + " on this rank" + shard(3) + ")", double(r.params_bytes));
  if (r.expert_params_per_rank > 0)
    row(printf_string("  of them experts: %s (%lld of the %lld per block, ep %d)",
                      grouped(r.expert_params_per_rank).c_str(), (long long)(o.shape.experts / o.ep),
                      (long long)o.shape.experts, o.ep),
        -1);
  row("gradients" + (shard(2).empty() ? std::string() : " (" + shard(2).substr(2) + ")"), double(r.grads_bytes));
  row(r.master_bytes ? "master weights (fp32" + shard(1) + ")" : std::string("master weights (none)"),
      double(r.master_bytes));
  row(printf_string("optimizer moments (%d x fp32%s)", opt == st::optimizer_kind::adamw ? 2 : 1, shard(1).c_str()),
      double(r.optimizer_bytes));
  row("model state", double(r.model_state_bytes()));
  row(printf_string("activations (%d in flight x %s GB)", r.in_flight,
                    gb(double(r.activation_bytes) / std::max(r.in_flight, 1)).c_str()),
      double(r.activation_bytes));
  row("scratch at the step's peak (in-flight gradients, gathers)",
      double(r.activation_high_bytes() - r.activation_bytes));
  row("communication buffers", double(r.comm_buffer_bytes));
  row("total", double(r.total_bytes()));
  int width = 50;
  for (const auto& [label, bytes] : rows)
    if (bytes >= 0) width = std::max(width, int(label.size()));
  std::printf("\nmemory per rank (the busiest)%*s %10s %8s\n", width - 26, "", "GB", "of dev");
  for (const auto& [label, bytes] : rows) {
    if (bytes < 0) std::printf("  %s\n", label.c_str());
    else std::printf("  %-*s %10s %8s\n", width, label.c_str(), gb(bytes).c_str(), percent(bytes / mem).c_str());
  }
  if (fits)
    std::printf("  fits %s: yes, %s GB to spare\n", std::string(d.name).c_str(),
                gb(mem - double(r.total_bytes())).c_str());
  else
    std::printf("  fits %s: NO, %s GB over%s\n", std::string(d.name).c_str(), gb(double(r.total_bytes()) - mem).c_str(),
                double(r.model_state_bytes()) > mem ? " (the model state alone does not fit)" : "");

  const auto flop_row = [](const char* label, double f) {
    std::printf("  %-50s %10.3e %13s\n", label, f, si(f, "FLOP").c_str());
  };
  std::printf("\ncompute per step%*s %10s\n", 37, "", "FLOP");
  flop_row("whole model, with recomputation", r.flops_per_step);
  flop_row("whole model, without recomputation", r.model_flops_per_step);
  flop_row(
      cp ? "per rank (busiest stage over its dp x cp x tp ranks)" : "per rank (busiest stage over its dp x tp ranks)",
      r.flops_per_rank);

  // As the memory rows: collected, then printed in one column at least 50 wide.
  std::vector<std::pair<std::string, double>> comm_rows;
  const auto comm_row = [&](const std::string& label, double bytes) { comm_rows.emplace_back(label, bytes); };
  comm_row(printf_string("dp%s (%d rank%s, %s%s)", cp ? " x cp" : "", replicas, replicas == 1 ? "" : "s",
                         o.zero >= 3   ? "gathers and reduce-scatters per micro-batch"
                         : o.zero == 2 ? "reduce-scatter per micro-batch, gather once"
                                       : "gradient all-reduce",
                         ep ? printf_string("; experts over %d", expert_replicas).c_str() : ""),
           r.comm_bytes.dp);
  comm_row(printf_string("cp (%d rank%s%s)", o.cp, o.cp == 1 ? "" : "s", cp ? (", " + o.cp_form).c_str() : ""),
           r.comm_bytes.cp);
  if (ep) comm_row(printf_string("ep (%d ranks, all-to-alls of the experts' rows)", o.ep), r.comm_bytes.ep);
  comm_row(printf_string("tp (%d rank%s%s)", o.tp, o.tp == 1 ? "" : "s", sp ? ", sequence parallel" : ""),
           r.comm_bytes.tp);
  comm_row(printf_string("pp (%d stage%s, activations and their gradients)", o.pp, o.pp == 1 ? "" : "s"),
           r.comm_bytes.pp);
  comm_row("embedding (tied table, first and last stage)", r.comm_bytes.embedding);
  comm_row("total", r.comm_bytes.total());
  int comm_width = 50;
  for (const auto& [label, bytes] : comm_rows) comm_width = std::max(comm_width, int(label.size()));
  std::printf("\ncommunication per rank per step%*s %10s\n", comm_width - 28, "", "GB");
  for (const auto& [label, bytes] : comm_rows)
    std::printf("  %-*s %10s\n", comm_width, label.c_str(), gb(bytes).c_str());

  std::printf("\npipeline bubble: %s", percent(r.bubble_fraction).c_str());
  if (o.pp > 1)
    std::printf(" ((pp-1)/(virtual x microbatches + pp-1) = %d/%lld)\n", o.pp - 1,
                (long long)(o.virtual_chunks * r.microbatches + o.pp - 1));
  else std::printf(" (no pipeline)\n");
  std::printf("estimate (the --search model at efficiency %g): step %s, %s tokens/s, %.1f TFLOP/s per GPU, MFU %s\n",
              o.efficiency, seconds_text(e.step_s).c_str(), grouped(std::llround(e.tokens_per_s)).c_str(),
              e.tflops_per_gpu, percent(e.mfu).c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Mode 2: the back-of-envelope model state
// ---------------------------------------------------------------------------------------------

int run_model_state(const options& o, const st::hw::device_spec& d) {
  std::string why;
  const std::int64_t n = parse_param_count(o.params, &why);
  if (!why.empty()) throw usage_error("--params: " + why);
  const bool fp32 = o.precision == "fp32";
  // fp32 weights are their own master copy; 16-bit ones keep an fp32 copy unless --master none.
  const std::string master = fp32 ? "none" : (o.master.empty() ? "fp32" : o.master);
  st::model_state_options mo;
  mo.storage_bytes = storage_bytes_of(o.precision);
  mo.master_bytes = master == "fp32" ? 4 : 0;
  mo.moment_bytes = 4;
  mo.optimizer = o.optimizer == "sgd" ? st::optimizer_kind::sgd : st::optimizer_kind::adamw;
  mo.dp = o.dp;
  mo.zero = o.zero;
  const st::plan_result r = st::model_state_plan(n, mo);
  const double total = double(r.model_state_bytes()), mem = d.memory_bytes;
  const double devices = total / mem;
  const int moments = mo.optimizer == st::optimizer_kind::adamw ? 2 : 1;
  const double train_flops = 6.0 * double(n), infer_flops = 2.0 * double(n);

  if (o.json) {
    nlohmann::ordered_json out;
    out["hw"] = std::string(d.name);
    out["device_memory_bytes"] = st::json_number(mem);
    out["precision"] = o.precision;
    out["master"] = master;
    out["optimizer"] = o.optimizer;
    out["dp"] = o.dp;
    out["zero"] = o.zero;
    add_model_state_fields(out, r);
    out["total_bytes"] = r.model_state_bytes();
    out["devices"] = st::json_number(devices);
    out["fits"] = total <= mem;
    out["train_flops_per_token"] = st::json_number(train_flops);
    out["inference_flops_per_token"] = st::json_number(infer_flops);
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }

  std::printf("strata-plan: model state of %s parameters per rank (dp %d, ZeRO-%d), no activations\n",
              grouped(n).c_str(), o.dp, o.zero);
  std::printf("  %s weights and gradients, %s, %s (%d fp32 moment%s)\n\n", o.precision.c_str(),
              fp32               ? "which are their own master copy"
              : master == "fp32" ? "an fp32 master copy"
                                 : "no master copy",
              moments == 2 ? "AdamW" : "SGD with momentum", moments, moments == 2 ? "s" : "");
  const auto row = [](const char* label, double bytes, const std::string& note) {
    std::printf("  %-10s %10s GB%s\n", label, gb(bytes).c_str(), note.c_str());
  };
  row("weights", double(r.params_bytes), printf_string("   (%d bytes each)", mo.storage_bytes));
  row("gradients", double(r.grads_bytes), printf_string("   (%d bytes each)", mo.storage_bytes));
  row("master", double(r.master_bytes), master == "fp32" ? "   (4 bytes each)" : "   (none)");
  row("moments", double(r.optimizer_bytes), printf_string("   (%d x 4 bytes each)", moments));
  row("total", total,
      printf_string("   = %s x %s (%g GB)%s",
                    devices >= 10 ? printf_string("%.1f", devices).c_str() : printf_string("%.3g", devices).c_str(),
                    std::string(d.name).c_str(), mem / 1e9, total <= mem ? ", fits one" : ""));
  std::printf("\nFLOPs per token: training 6N = %.3g, inference 2N = %.3g\n", train_flops, infer_flops);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Mode 3: the search
// ---------------------------------------------------------------------------------------------

struct candidate {
  int dp = 1, cp = 1, tp = 1, pp = 1, v = 1, zero = 0;
  std::string cp_form = "ring";
  std::int64_t micro = 1;
  bool sp = false;
  st::recompute_mode recompute = st::recompute_mode::none;
  st::plan_result plan;
  step_estimate est;
};

const char* recompute_name(st::recompute_mode r) {
  switch (r) {
    case st::recompute_mode::selective: return "selective";
    case st::recompute_mode::full: return "full";
    default: return "none";
  }
}

template <class F>
int run_search(const options& o, const typename F::dims& m, const st::hw::device_spec& d) {
  const int G = o.gpus;
  const auto opt = o.optimizer == "sgd" ? st::optimizer_kind::sgd : st::optimizer_kind::adamw;
  const int storage = storage_bytes_of(o.precision);
  const std::int64_t B = o.global_batch;
  std::vector<candidate> fitting;
  std::int64_t considered = 0;

  // Context-parallel degrees: those whose 2·cp chunks divide the sequence; the ring form always,
  // all-to-all where this tensor rank's query and key/value heads divide by cp.
  std::vector<std::pair<int, std::string>> contexts;
  for (int tp = 1; tp <= std::min(G, d.gpus_per_node); ++tp) {
    if (G % tp || !tensor_degree_fits<F>(m, tp)) continue;
    contexts.clear();
    for (int cp = 1; cp <= G / tp; ++cp) {
      if ((G / tp) % cp || !context_problem(m, tp, cp, "ring").empty()) continue;
      contexts.emplace_back(cp, "ring");
      if (cp > 1 && context_problem(m, tp, cp, "all_to_all").empty()) contexts.emplace_back(cp, "all_to_all");
    }
    for (const auto& [cp, form] : contexts) {
      for (int pp = 1; pp <= G / (tp * cp); ++pp) {
        if ((G / (tp * cp)) % pp || m.layers % pp) continue;
        const int dp = G / (tp * cp * pp);
        if (B % dp) continue;
        if ((dp * cp) % o.ep) continue;  // --ep stays as given: its expert group lies within dp x cp
        for (const int v : {1, 2, 4}) {
          if (v > 1 && (pp == 1 || m.layers % (pp * v))) continue;
          const auto schedule =
              v > 1 ? st::pipeline_schedule_kind::interleaved : st::pipeline_schedule_kind::one_f_one_b;
          for (const std::int64_t micro : {1, 2, 4, 8}) {
            if ((B / dp) % micro) continue;
            const std::int64_t M = B / (dp * micro);
            if (v > 1 && M % pp) continue;
            for (int zero = 0; zero <= 3; ++zero) {
              if (pp > 1 && zero > 1) continue;
              if (dp * cp == 1 && zero > 0) continue;  // nothing to shard over: the same plan as ZeRO-0
              for (const bool sp : {false, true}) {
                if (sp && (tp == 1 || (m.seq / cp) % tp)) continue;
                for (const auto rc :
                     {st::recompute_mode::none, st::recompute_mode::selective, st::recompute_mode::full}) {
                  candidate c{dp, cp, tp, pp, v, zero, form, micro, sp, rc, {}, {}};
                  const st::plan_setup s = make_setup(dp, cp, form, tp, pp, v, zero, sp, M, rc, opt, schedule, o.ep);
                  const st::batch b{.micro = micro, .global = B};
                  try {
                    c.plan = plan_with<F>(o.precision, m, b, s);
                  } catch (const st::error&) {
                    continue;  // a combination the planner refuses is not a candidate
                  }
                  ++considered;
                  if (!c.plan.fits(d)) continue;
                  c.est = estimate_step(c.plan, s, m, b, d, storage, o.efficiency);
                  fitting.push_back(c);
                }
              }
            }
          }
        }
      }
    }
  }

  // Fastest first; equal times prefer fewer bytes, then the simpler layout.
  std::sort(fitting.begin(), fitting.end(), [](const candidate& a, const candidate& b) {
    if (a.est.step_s != b.est.step_s) return a.est.step_s < b.est.step_s;
    if (a.plan.total_bytes() != b.plan.total_bytes()) return a.plan.total_bytes() < b.plan.total_bytes();
    return std::tuple(a.pp, a.cp, a.cp_form, a.tp, a.v, a.zero, a.micro, a.sp, int(a.recompute)) <
           std::tuple(b.pp, b.cp, b.cp_form, b.tp, b.v, b.zero, b.micro, b.sp, int(b.recompute));
  });
  const std::size_t shown = std::min<std::size_t>(fitting.size(), std::size_t(o.top));

  if (fitting.empty()) {
    if (o.json) std::printf("[]\n");
    std::fprintf(stderr,
                 "strata-plan: error: none of the %lld layouts of %d x %s fits its memory (%g GB per GPU); "
                 "try more GPUs or a device with more memory\n",
                 (long long)considered, G, std::string(d.name).c_str(), d.memory_bytes / 1e9);
    return 1;
  }

  if (o.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < shown; ++i) {
      const candidate& c = fitting[i];
      out.push_back({{"model", F::name},
                     {"dp", c.dp},
                     {"cp", c.cp},
                     {"context_form", c.cp_form},
                     {"ep", o.ep},
                     {"tp", c.tp},
                     {"pp", c.pp},
                     {"virtual", c.v},
                     {"zero", c.zero},
                     {"micro_batch", c.micro},
                     {"sp", c.sp},
                     {"recompute", recompute_name(c.recompute)},
                     {"step_time_s", st::json_number(c.est.step_s)},
                     {"tokens_per_s", st::json_number(c.est.tokens_per_s)},
                     {"tflops_per_gpu", st::json_number(c.est.tflops_per_gpu)},
                     {"mfu", st::json_number(c.est.mfu)},
                     {"total_bytes", c.plan.total_bytes()}});
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }

  std::printf("strata-plan --search: %s, global batch %lld\n", F::shape_text(m).c_str(), (long long)B);
  std::printf("on %d x %s\n", G, device_text(d, storage).c_str());
  std::printf("%s, %s; step-time model: compute at %g of peak, ranks placed tp, cp, dp, pp (see --help)\n",
              precision_text(o.precision).c_str(), opt == st::optimizer_kind::adamw ? "AdamW" : "SGD with momentum",
              o.efficiency);
  if (o.ep > 1)
    std::printf(
        "expert parallel ep %d in every layout (within dp x cp: those where it does not divide dp x cp are not "
        "considered)\n",
        o.ep);
  std::printf("%lld layouts considered, %zu fit; the best %zu:\n\n", (long long)considered, fitting.size(), shown);
  std::printf("%3s %4s %3s %-10s %3s %3s %3s %4s %3s %3s %-9s %9s %12s %11s %6s %9s %7s\n", "#", "dp", "cp", "form",
              "tp", "pp", "v", "zero", "mb", "sp", "recompute", "step", "tokens/s", "TFLOP/s/GPU", "MFU", "GB/rank",
              "of dev");
  for (std::size_t i = 0; i < shown; ++i) {
    const candidate& c = fitting[i];
    std::printf("%3zu %4d %3d %-10s %3d %3d %3d %4d %3lld %3s %-9s %9s %12s %11.1f %6s %9s %7s\n", i + 1, c.dp, c.cp,
                c.cp > 1 ? c.cp_form.c_str() : "-", c.tp, c.pp, c.v, c.zero, (long long)c.micro, c.sp ? "on" : "off",
                recompute_name(c.recompute), seconds_text(c.est.step_s).c_str(),
                grouped(std::llround(c.est.tokens_per_s)).c_str(), c.est.tflops_per_gpu, percent(c.est.mfu).c_str(),
                gb(double(c.plan.total_bytes())).c_str(),
                percent(double(c.plan.total_bytes()) / d.memory_bytes).c_str());
  }
  return 0;
}

const char* const search_model_help = R"(
Search step-time model (ranks the layouts; an estimate, not a measurement):
  GPUs = dp x cp x tp x pp
  T_compute = flops_per_rank / (efficiency x peak FLOP/s of the precision)
  ranks are placed tp fastest, then cp, then dp, then pp (cp ranks tp apart, dp ranks tp x cp
  apart, pp ranks tp x cp x dp apart); a group uses the intra-node bandwidth and latency when
  each copy of it lies within one node, the inter-node ones otherwise
  T_tp   = comm_bytes.tp / bw(tp) + latency(tp) x 4 x layers/pp x micro-batches
  T_cp   = comm_bytes.cp / bw(cp) + latency(cp) x steps x layers/pp x micro-batches
           steps per block: ring 2 x cp - 1 (cp - 1 forward, cp backward), all_to_all 4;
           recomputation adds the forward's again (cp - 1, or 2)
  T_pp   = comm_bytes.pp / bw(pp)
  T_ep   = comm_bytes.ep / bw(ep) + latency(ep) x steps x layers/pp x micro-batches
           (mixtral --ep N > 1: the expert group, ep ranks tp apart within dp x cp); steps per
           block: 5 all-to-alls (3 forward, 2 backward), full recomputation 3 more
  T_dp   = comm_bytes.dp / bw(dp x cp)     (the gradient group, experts' reduction included;
           not overlapped)
  T_step = (T_compute + T_tp + T_cp + T_pp + T_ep) / (1 - bubble) + T_dp
  tokens/s = global batch x seq / T_step; TFLOP/s per GPU = model FLOPs / T_step / GPUs
)";

// Plan one layout or search, for the family the flags name.
template <class F>
int run_shape(const options& o, const st::hw::device_spec& d) {
  const typename F::dims shape = F::shape(o.shape);
  return o.search ? run_search<F>(o, shape, d) : run_plan<F>(o, shape, d);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "strata-plan: memory, compute and communication per rank of a training layout of the example GPT-2, Llama or\n"
      "Mixtral (--model), before anything runs.\n"
      "Plan one layout (shape flags), estimate the model state of N parameters (--params), or rank every\n"
      "layout of --gpus devices that fits (--search). Exit codes: 0 done, 1 no plan, 2 bad flags."};
  app.footer(search_model_help);
  const auto positive = cli_checks::integer_at_least(1);

  // Model shape.
  std::vector<CLI::Option*> shape_flags;
  shape_flags.push_back(app.add_option("--model", o.model,
                                       "the example model the shape flags describe: gpt2 "
                                       "(examples/gpt2), llama (examples/llama) or mixtral (examples/mixtral)")
                            ->check(CLI::IsMember({"gpt2", "llama", "mixtral"}))
                            ->capture_default_str());
  shape_flags.push_back(app.add_option("--layers", o.shape.layers, "transformer blocks")->check(positive));
  shape_flags.push_back(app.add_option("--hidden", o.shape.d_model, "model width")->check(positive));
  shape_flags.push_back(
      app.add_option("--heads", o.shape.heads, "attention heads (must divide --hidden)")->check(positive));
  shape_flags.push_back(app.add_option("--seq", o.shape.seq, "sequence length")->check(positive));
  shape_flags.push_back(app.add_option("--vocab", o.shape.vocab, "vocabulary size")->check(positive));
  shape_flags.push_back(app.add_option("--ffn", o.shape.ffn,
                                       "FFN width: gpt2 the MLP's (default 4 x --hidden), llama the "
                                       "SwiGLU's (default 8/3 x --hidden rounded up to 32)")
                            ->check(positive));
  // Llama only (refused with --model gpt2).
  auto* kv_heads = app.add_option("--kv-heads", o.shape.kv_heads,
                                  "llama: key/value heads, dividing --heads (0: as many as "
                                  "heads); tp may also be a multiple of it")
                       ->check(cli_checks::integer_at_least(0));
  auto* tied =
      app.add_flag("--tied", o.shape.tied, "llama: the LM head shares the token embedding's table (default: its own)");
  shape_flags.push_back(kv_heads);
  shape_flags.push_back(tied);
  // Mixtral only (refused with the other models).
  auto* experts = app.add_option("--experts", o.shape.experts, "mixtral: experts per block")
                      ->check(positive)
                      ->capture_default_str();
  auto* top_k = app.add_option("--moe-top-k", o.shape.top_k, "mixtral: experts per token (at most --experts)")
                    ->check(positive)
                    ->capture_default_str();
  auto* shared_ffn = app.add_option("--shared-ffn", o.shape.shared_ffn,
                                    "mixtral: the width of a shared expert every token goes through (0: none)")
                         ->check(cli_checks::integer_at_least(0));
  for (auto* f : {experts, top_k, shared_ffn}) shape_flags.push_back(f);
  // Mixtral's layout: with --search too (every layout keeps it), not with --params.
  auto* expert_parallel = app.add_option("--ep", o.ep,
                                         "mixtral: expert-parallel degree: each block's experts shared out over ep "
                                         "ranks of the gradient group dp x cp (divides dp x cp and --experts)")
                              ->check(positive)
                              ->capture_default_str();
  auto* global_batch =
      app.add_option("--global-batch", o.global_batch, "sequences per step over all ranks")->check(positive);
  shape_flags.push_back(global_batch);

  // Layout (plan mode; --search chooses these itself).
  std::vector<CLI::Option*> layout_flags;
  layout_flags.push_back(app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch")
                             ->check(positive)
                             ->capture_default_str());
  auto* dp = app.add_option("--dp", o.dp, "data-parallel degree")->check(positive)->capture_default_str();
  auto* zero = app.add_option("--zero", o.zero, "ZeRO stage 0-3 (1: optimizer state, 2: + gradients, 3: + weights)")
                   ->check(CLI::IsMember({0, 1, 2, 3}))
                   ->capture_default_str();
  layout_flags.push_back(app.add_option("--cp", o.cp,
                                        "context-parallel degree: each sequence cut into 2 x cp chunks, two per rank "
                                        "(--seq divisible by 2 x cp)")
                             ->check(positive)
                             ->capture_default_str());
  layout_flags.push_back(
      app.add_option("--cp-form", o.cp_form,
                     "how attention reaches the other context ranks: ring (key/value blocks passed "
                     "round) or all_to_all (heads exchanged; the heads per tensor rank divide by cp)")
          ->check(CLI::IsMember({"ring", "all_to_all"}))
          ->capture_default_str());
  layout_flags.push_back(
      app.add_option("--tp", o.tp, "tensor-parallel degree")->check(positive)->capture_default_str());
  layout_flags.push_back(app.add_option("--pp", o.pp, "pipeline stages")->check(positive)->capture_default_str());
  layout_flags.push_back(app.add_option("--virtual", o.virtual_chunks, "model chunks per stage (interleaved schedule)")
                             ->check(positive)
                             ->capture_default_str());
  layout_flags.push_back(app.add_flag("--sp", o.sp, "sequence parallelism in the tensor-parallel group"));
  layout_flags.push_back(app.add_option("--recompute", o.recompute, "activation recomputation: none, selective, full")
                             ->check(CLI::IsMember({"none", "selective", "full"}))
                             ->capture_default_str());
  layout_flags.push_back(app.add_option("--schedule", o.schedule,
                                        "pipeline schedule: gpipe, 1f1b, interleaved (default 1f1b, "
                                        "interleaved when --virtual > 1)")
                             ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"})));

  // Training and device.
  app.add_option("--precision", o.precision, "fp32, bf16 or fp16 (16-bit: with fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw (2 fp32 moments) or sgd (momentum: 1)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--hw", o.hw, "device preset: " + preset_names())->check(device_preset())->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON value instead of the table");
  auto* efficiency =
      app.add_option("--efficiency", o.efficiency, "share of the peak FLOP/s the step-time model assumes")
          ->check(cli_checks::real_in(0, false, 1))
          ->capture_default_str();

  // Back-of-envelope.
  auto* params = app.add_option("--params", o.params, "model-state estimate for N parameters (70e9 or 70000000000)")
                     ->check(param_count());
  app.add_option("--master", o.master,
                 "with --params: fp32 master copy or none (default fp32 for "
                 "16-bit precisions)")
      ->check(CLI::IsMember({"fp32", "none"}))
      ->needs(params);

  // Search.
  auto* search = app.add_flag("--search", o.search, "rank every layout of --gpus devices that fits");
  app.add_option("--gpus", o.gpus, "with --search: number of devices")->check(positive)->needs(search);
  app.add_option("--top", o.top, "with --search: how many layouts to show")
      ->check(positive)
      ->needs(search)
      ->capture_default_str();

  for (auto* f : shape_flags) params->excludes(f);
  for (auto* f : layout_flags) {
    params->excludes(f);
    search->excludes(f);
  }
  params->excludes(search);
  params->excludes(expert_parallel);
  params->excludes(efficiency);
  search->excludes(dp);
  search->excludes(zero);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  const st::hw::device_spec& device = *st::hw::find(o.hw);
  try {
    if (o.model == "gpt2") {
      if (kv_heads->count() > 0)
        throw usage_error("--kv-heads needs --model llama or mixtral (GPT-2 has as many key/value heads as heads)");
      if (tied->count() > 0) throw usage_error("--tied needs --model llama or mixtral (GPT-2's head is always tied)");
    }
    if (o.model != "mixtral")
      for (auto* f : {experts, top_k, shared_ffn, expert_parallel})
        if (f->count() > 0) throw usage_error(f->get_name() + " needs --model mixtral");
    if (o.model == "mixtral" && o.shape.top_k > o.shape.experts)
      throw usage_error("--moe-top-k " + std::to_string(o.shape.top_k) + " is more than --experts " +
                        std::to_string(o.shape.experts));
    if (o.model == "mixtral" && o.shape.experts % o.ep != 0)
      throw usage_error("--ep " + std::to_string(o.ep) + " does not divide --experts " +
                        std::to_string(o.shape.experts) +
                        " (each rank of the expert group holds --experts / --ep of a block's experts)");
    if (!o.params.empty()) return run_model_state(o, device);

    // Plan and search need a shape and a batch.
    std::string missing;
    const std::pair<const char*, std::int64_t> required[] = {
        {"--layers", o.shape.layers}, {"--hidden", o.shape.d_model}, {"--heads", o.shape.heads},
        {"--seq", o.shape.seq},       {"--vocab", o.shape.vocab},    {"--global-batch", o.global_batch}};
    for (const auto& [name, value] : required)
      if (value == 0) missing += (missing.empty() ? "" : ", ") + std::string(name);
    if (o.search && o.gpus == 0) missing += (missing.empty() ? "" : ", ") + std::string("--gpus");
    if (!missing.empty())
      throw usage_error("missing " + missing +
                        " (a plan needs --layers, --hidden, --heads, --seq, --vocab and --global-batch; "
                        "--search also --gpus; or give --params N for the model-state estimate); see --help");
    if (o.search && o.gpus % o.ep != 0)
      throw usage_error("--ep " + std::to_string(o.ep) + " does not divide --gpus " + std::to_string(o.gpus) +
                        " (the expert group lies within dp x cp, which divides the GPUs)");
    STRATA_CHECK(o.shape.d_model % o.shape.heads == 0, "--heads ", o.shape.heads, " does not divide --hidden ",
                 o.shape.d_model);
    if (o.model == "gpt2") return run_shape<gpt2_family>(o, device);
    check_llama_flags(o.shape);
    if (o.model == "mixtral") return run_shape<mixtral_family>(o, device);
    return run_shape<llama_family>(o, device);
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
