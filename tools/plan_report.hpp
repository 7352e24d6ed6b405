// tools/plan_report.hpp - what strata-plan prints of a plan: the plan of one layout (a table, or
// one JSON value) with where its step's time goes (--explain, --explain-svg), and the
// back-of-envelope model state of N parameters (--params).
//
// The table reads top to bottom as a reader checks a layout: the shape, the layout and the
// device, then memory per rank by category against the device's, compute, communication per
// axis, the bubble and the step-time estimate. The JSON carries the same figures, for scripts.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/core/json_number.hpp>
#include <strata/plan/plan.hpp>

#include "plan_estimate.hpp"
#include "plan_options.hpp"
#include "plan_setup.hpp"
#include "plan_text.hpp"

namespace strata_plan {

// The parameter counts and model-state bytes, in the order both JSON outputs give them.
inline void add_model_state_fields(nlohmann::ordered_json& out, const st::plan_result& r) {
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

// ---------------------------------------------------------------------------------------------
// --explain: where one step's time goes
// ---------------------------------------------------------------------------------------------

struct time_row {
  std::string label;
  double seconds;
};

inline std::vector<time_row> time_rows(const st::step_time& t, const st::plan_setup& s) {
  const auto where = [](bool intra) { return intra ? "NVLink" : "network"; };
  const auto ranks = [](int n) { return printf_string("%d rank%s", n, n == 1 ? "" : "s"); };
  const st::layout_config& L = s.layout;
  std::vector<time_row> rows = {
      {"GEMMs", t.gemm_s},
      {"attention", t.attention_s},
      {"memory-bound (norms, activations, residual, rotary, embedding, loss)", t.memory_s},
      {std::string("recomputation (") + recompute_name(s.recompute) + ")", t.recompute_s},
      {"optimizer", t.optimizer_s},
      {printf_string("tp exposed (%s, %s)", ranks(L.tp).c_str(), where(t.tp_intra)), t.tp_s},
      {printf_string("cp exposed (%s, %s)", ranks(L.cp).c_str(), where(t.cp_intra)), t.cp_s},
      {printf_string("ep exposed (%s, %s)", ranks(L.ep).c_str(), where(t.ep_intra)), t.ep_s},
      {printf_string("dp exposed (dp x cp = %s, %s)", ranks(L.dp * L.cp).c_str(), where(t.dp_intra)), t.dp_s},
      {printf_string("pp sends at the bubble's edges (%d stage%s, %s)", L.pp, L.pp == 1 ? "" : "s", where(t.pp_intra)),
       t.pp_s},
      {"pipeline bubble", t.bubble_s},
  };
  return rows;
}

// A horizontal bar per row, scaled to the step, as a standalone SVG.
inline std::string time_svg(const std::vector<time_row>& rows, double step) {
  const int label_w = 430, bar_w = 420, row_h = 22, top = 34;
  const int height = top + row_h * int(rows.size()) + 12;
  std::string svg = printf_string(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n",
      label_w + bar_w + 120, height);
  svg += printf_string("<text x=\"8\" y=\"20\" font-weight=\"bold\">one step: %s</text>\n", seconds_text(step).c_str());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const int y = top + row_h * int(i);
    const double share = step > 0 ? rows[i].seconds / step : 0;
    std::string label;
    for (const char ch : rows[i].label)
      label += ch == '&' ? std::string("&amp;") : ch == '<' ? std::string("&lt;") : std::string(1, ch);
    svg += printf_string("<text x=\"8\" y=\"%d\">%s</text>\n", y + 15, label.c_str());
    svg += printf_string("<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"16\" fill=\"#4a7ab5\"/>\n", label_w, y + 3,
                         std::max(0.0, share) * bar_w);
    svg += printf_string("<text x=\"%.1f\" y=\"%d\">%s (%s)</text>\n", label_w + std::max(0.0, share) * bar_w + 6,
                         y + 15, seconds_text(rows[i].seconds).c_str(), percent(share).c_str());
  }
  return svg + "</svg>\n";
}

inline void explain_step(const options& o, const st::step_time& t, const st::plan_setup& s) {
  const std::vector<time_row> rows = time_rows(t, s);
  if (o.explain) {
    std::printf("\nwhere one step's time goes (busiest rank; communication counted where it is exposed)\n");
    for (const auto& row : rows)
      std::printf("  %-62s %10s %7s\n", row.label.c_str(), seconds_text(row.seconds).c_str(),
                  percent(t.step_s > 0 ? row.seconds / t.step_s : 0).c_str());
    std::printf("  %-62s %10s\n", "step", seconds_text(t.step_s).c_str());
  }
  if (!o.explain_svg.empty()) {
    std::FILE* f = std::fopen(o.explain_svg.c_str(), "w");
    STRATA_CHECK(f != nullptr, "--explain-svg: cannot write ", o.explain_svg);
    const std::string svg = time_svg(rows, t.step_s);
    const bool ok = std::fwrite(svg.data(), 1, svg.size(), f) == svg.size();
    STRATA_CHECK(std::fclose(f) == 0 && ok, "--explain-svg: writing ", o.explain_svg, " failed");
  }
}

// ---------------------------------------------------------------------------------------------
// The plan of one layout
// ---------------------------------------------------------------------------------------------

// One layout as the flags give it, planned and estimated.
struct layout_plan {
  st::pipeline_schedule_kind schedule;
  st::optimizer_kind optimizer;
  bool sp;  // sequence parallelism in effect: only over more than one tensor rank
  st::plan_setup setup;
  st::plan_result result;
  step_estimate estimate;
};

template <class F>
layout_plan plan_layout(const options& o, const typename F::dims& m, const st::hw::device_spec& d) {
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
  return {schedule, opt, o.sp && o.tp > 1, setup, r, estimate_step(r, setup, m, b, d)};
}

template <class F>
void print_plan_json(const options& o, const typename F::dims& m, const st::hw::device_spec& d, const layout_plan& p) {
  const st::plan_result& r = p.result;
  const double mem = d.memory_bytes;
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
                                         {"sp", p.sp},
                                         {"recompute", o.recompute},
                                         {"schedule", std::string(st::schedule_label(p.schedule))},
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
  out["fits"] = r.fits(d);
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
  out["estimate"] = estimate_json(p.estimate);
  std::printf("%s\n", out.dump().c_str());
}

// The table's first lines: the model, the layout, training and the device.
template <class F>
void print_plan_heading(const options& o, const typename F::dims& m, const st::hw::device_spec& d,
                        const layout_plan& p) {
  const st::plan_result& r = p.result;
  const int ranks = o.dp * o.cp * o.tp * o.pp;
  const int replicas = o.dp * o.cp;  // the gradient group, over which ZeRO shards
  const bool cp = o.cp > 1;
  // The context axis appears where it splits (as layout_config::degrees_text writes it).
  const std::string cp_text = cp ? printf_string(" x cp %d", o.cp) : std::string();
  const std::string context_text = cp ? printf_string("context parallel %s, ", o.cp_form.c_str()) : std::string();
  // Expert parallelism: ep ranks of the gradient group share each block's experts out; the ranks
  // ep apart hold the same experts (the expert-data group), over which ZeRO shards them.
  const std::string expert_text =
      o.ep > 1 ? printf_string("expert parallel ep %d within dp%s = %d, ", o.ep, cp ? " x cp" : "", replicas)
               : std::string();
  const std::string zero_text =
      printf_string("ZeRO-%d%s", o.zero, cp && o.zero > 0 ? printf_string(" over dp x cp = %d", replicas).c_str() : "");
  if (r.params_active != r.params_total)
    std::printf("strata-plan: %s (%s parameters, %s active per token)\n", F::shape_text(m).c_str(),
                grouped(r.params_total).c_str(), grouped(r.params_active).c_str());
  else std::printf("strata-plan: %s (%s parameters)\n", F::shape_text(m).c_str(), grouped(r.params_total).c_str());
  std::printf("layout:   dp %d%s x tp %d x pp %d = %d rank%s, %s%s%s, %s, recompute %s", o.dp, cp_text.c_str(), o.tp,
              o.pp, ranks, ranks == 1 ? "" : "s", context_text.c_str(), expert_text.c_str(), zero_text.c_str(),
              p.sp ? "sequence parallel" : "no sequence parallelism", o.recompute.c_str());
  if (o.pp > 1 || o.virtual_chunks > 1)
    std::printf(", %s schedule, %d chunk%s per stage", std::string(st::schedule_label(p.schedule)).c_str(),
                o.virtual_chunks, o.virtual_chunks > 1 ? "s" : "");
  std::printf("\n");
  std::printf("training: %s, %s; global batch %lld = dp %d x %lld micro-batch%s of %lld\n",
              precision_text(o.precision).c_str(),
              p.optimizer == st::optimizer_kind::adamw ? "AdamW" : "SGD with momentum", (long long)o.global_batch, o.dp,
              (long long)r.microbatches, r.microbatches == 1 ? "" : "es", (long long)o.micro_batch);
  std::printf("device:   %s\n", device_text(d, storage_bytes_of(o.precision)).c_str());
}

// Memory per rank by category, against the device's, and whether it fits.
inline void print_plan_memory(const options& o, const st::hw::device_spec& d, const layout_plan& p) {
  const st::plan_result& r = p.result;
  const double mem = d.memory_bytes;
  const int replicas = o.dp * o.cp;
  const bool ep = o.ep > 1;
  const int expert_replicas = replicas / o.ep;
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
  row(printf_string("optimizer moments (%d x fp32%s)", p.optimizer == st::optimizer_kind::adamw ? 2 : 1,
                    shard(1).c_str()),
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
  if (r.fits(d))
    std::printf("  fits %s: yes, %s GB to spare\n", std::string(d.name).c_str(),
                gb(mem - double(r.total_bytes())).c_str());
  else
    std::printf("  fits %s: NO, %s GB over%s\n", std::string(d.name).c_str(), gb(double(r.total_bytes()) - mem).c_str(),
                double(r.model_state_bytes()) > mem ? " (the model state alone does not fit)" : "");
}

inline void print_plan_compute(const options& o, const st::plan_result& r) {
  const auto flop_row = [](const char* label, double f) {
    std::printf("  %-50s %10.3e %13s\n", label, f, si(f, "FLOP").c_str());
  };
  std::printf("\ncompute per step%*s %10s\n", 37, "", "FLOP");
  flop_row("whole model, with recomputation", r.flops_per_step);
  flop_row("whole model, without recomputation", r.model_flops_per_step);
  flop_row(o.cp > 1 ? "per rank (busiest stage over its dp x cp x tp ranks)"
                    : "per rank (busiest stage over its dp x tp ranks)",
           r.flops_per_rank);
}

// Communication per rank per step, by axis.
inline void print_plan_communication(const options& o, const layout_plan& p) {
  const st::plan_result& r = p.result;
  const int replicas = o.dp * o.cp;
  const bool cp = o.cp > 1, ep = o.ep > 1;
  // As the memory rows: collected, then printed in one column at least 50 wide.
  std::vector<std::pair<std::string, double>> comm_rows;
  const auto comm_row = [&](const std::string& label, double bytes) { comm_rows.emplace_back(label, bytes); };
  comm_row(printf_string("dp%s (%d rank%s, %s%s)", cp ? " x cp" : "", replicas, replicas == 1 ? "" : "s",
                         o.zero >= 3   ? "gathers and reduce-scatters per micro-batch"
                         : o.zero == 2 ? "reduce-scatter per micro-batch, gather once"
                                       : "gradient all-reduce",
                         ep ? printf_string("; experts over %d", replicas / o.ep).c_str() : ""),
           r.comm_bytes.dp);
  comm_row(printf_string("cp (%d rank%s%s)", o.cp, o.cp == 1 ? "" : "s", cp ? (", " + o.cp_form).c_str() : ""),
           r.comm_bytes.cp);
  if (ep) comm_row(printf_string("ep (%d ranks, all-to-alls of the experts' rows)", o.ep), r.comm_bytes.ep);
  comm_row(printf_string("tp (%d rank%s%s)", o.tp, o.tp == 1 ? "" : "s", p.sp ? ", sequence parallel" : ""),
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
}

// The pipeline bubble and the step-time estimate, the table's last lines.
inline void print_plan_estimate(const options& o, const layout_plan& p) {
  const st::plan_result& r = p.result;
  const step_estimate& e = p.estimate;
  std::printf("\npipeline bubble: %s", percent(r.bubble_fraction).c_str());
  if (o.pp > 1)
    std::printf(" ((pp-1)/(virtual x microbatches + pp-1) = %d/%lld)\n", o.pp - 1,
                (long long)(o.virtual_chunks * r.microbatches + o.pp - 1));
  else std::printf(" (no pipeline)\n");
  std::printf(
      "estimate (the --search time model): step %s, %s tokens/s, %.1f TFLOP/s per GPU (%.1f counting "
      "recomputation), MFU %s\n",
      seconds_text(e.time.step_s).c_str(), grouped(std::llround(e.tokens_per_s)).c_str(), e.tflops_per_gpu,
      e.hardware_tflops_per_gpu, percent(e.mfu).c_str());
}

template <class F>
int run_plan(const options& o, const typename F::dims& m, const st::hw::device_spec& d) {
  const layout_plan p = plan_layout<F>(o, m, d);
  if (o.json) {
    print_plan_json<F>(o, m, d, p);
    return 0;
  }
  print_plan_heading<F>(o, m, d, p);
  print_plan_memory(o, d, p);
  print_plan_compute(o, p.result);
  print_plan_communication(o, p);
  print_plan_estimate(o, p);
  if (o.explain || !o.explain_svg.empty()) explain_step(o, p.estimate.time, p.setup);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The back-of-envelope model state
// ---------------------------------------------------------------------------------------------

inline int run_model_state(const options& o, const st::hw::device_spec& d) {
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

}  // namespace strata_plan
