// tools/plan_setup.hpp - a model family's model planned under one layout, as plan and search ask.
//
// strata/models/families.hpp names each example's dims and model template, fills the dims from
// the flags and describes the shape in words and JSON. The modes are templates on the family:
// every figure is plan_model's sum of that model's own layers' costs, never a formula of the
// tool's. What is here turns a layout into the planner's plan_setup, plans the model on a GPU in
// a precision, and says which tensor and context degrees the model's shape allows.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include <strata/plan/plan.hpp>

#include "plan_text.hpp"
#include "strata/models/families.hpp"

namespace strata_plan {

namespace st = strata;

using strata::models::gpt2_family;
using strata::models::llama_family;
using strata::models::mixtral_family;
using strata::models::neox_family;

inline int storage_bytes_of(const std::string& precision) { return precision == "fp32" ? 4 : 2; }

inline std::string precision_text(const std::string& precision) {
  return precision == "fp32" ? "fp32 (the weights are their own master copy)" : precision + " with fp32 master weights";
}

inline const char* recompute_name(st::recompute_mode r) {
  switch (r) {
    case st::recompute_mode::selective: return "selective";
    case st::recompute_mode::full: return "full";
    default: return "none";
  }
}

inline std::string schedule_tag(st::pipeline_schedule_kind k) {
  switch (k) {
    case st::pipeline_schedule_kind::gpipe: return "gpipe";
    case st::pipeline_schedule_kind::interleaved: return "interleaved_1f1b";
    default: return "one_f_one_b";
  }
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
  if constexpr (requires { m.experts; }) {  // the table's row, as the trainer refuses it
    const auto c = strata::combination{}.with(strata::layer_kind::experts).with(strata::mesh_axis::cp);
    if (const auto* u = strata::refusal_of(c)) return printf_string("--cp %d: ", cp) + strata::refusal_text(*u, c);
  }
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

// One layout as the planner takes it. microbatches: per step and data-parallel rank; ep: the
// expert-parallel degree, within dp x cp.
inline st::plan_setup make_setup(int dp, int cp, const std::string& cp_form, int tp, int pp, int v, int zero, bool sp,
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

}  // namespace strata_plan
