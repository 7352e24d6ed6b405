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
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/core/json_number.hpp>
#include <strata/plan/calibration.hpp>
#include <strata/plan/hardware_json.hpp>
#include <strata/plan/plan.hpp>
#include <strata/plan/time_model.hpp>

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
  std::string hw = "h100_80gb", hw_file;
  bool json = false;
  bool explain = false;
  std::string explain_svg;
  // back-of-envelope
  std::string params, master;
  // search
  bool search = false;
  int gpus = 0, top = 10;
  // With --search, the settings given pin every candidate to them (e.g. a published run's).
  bool pin_zero = false, pin_cp = false, pin_recompute = false, pin_sp = false, pin_schedule = false;
  std::vector<int> rank_layout;  // tp, pp, dp: where that layout ranks, and how much faster the first is
  // calibration
  std::string calibrate;
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
// plan/time_model.hpp: GEMMs by shape, attention, memory-bound work and the optimizer on the
// device, communication by the links each group crosses, overlap by axis, the bubble. Reported
// with it:
//   tokens_per_s            = global_batch x seq / T_step
//   tflops_per_gpu          = model_flops_per_step / T_step / gpus / 1e12   (no recomputation)
//   hardware_tflops_per_gpu = flops_per_step / T_step / gpus / 1e12         (recomputation counted)
//   mfu                     = tflops_per_gpu x 1e12 / peak

struct step_estimate {
  st::step_time time;
  double tokens_per_s = 0, tflops_per_gpu = 0, hardware_tflops_per_gpu = 0, mfu = 0;
};

template <class Dims>
step_estimate estimate_step(const st::plan_result& r, const st::plan_setup& s, const Dims& m, const st::batch& b,
                            const st::hw::device_spec& d) {
  const int gpus = s.layout.tp * s.layout.cp * s.layout.dp * s.layout.pp;
  step_estimate e;
  e.time = st::estimate_step_time(r, s, d);
  const double step = e.time.step_s;
  e.tokens_per_s = double(b.global) * double(m.seq) / step;
  e.tflops_per_gpu = r.model_flops_per_step / step / double(gpus) / 1e12;
  e.hardware_tflops_per_gpu = r.flops_per_step / step / double(gpus) / 1e12;
  e.mfu = e.tflops_per_gpu * 1e12 / d.peak_flops(r.storage_bytes);
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
  const st::step_time& t = e.time;
  return {{"step_time_s", st::json_number(t.step_s)},
          {"compute_s", st::json_number(t.compute_s())},
          {"gemm_s", st::json_number(t.gemm_s)},
          {"attention_s", st::json_number(t.attention_s)},
          {"memory_s", st::json_number(t.memory_s)},
          {"recompute_s", st::json_number(t.recompute_s)},
          {"optimizer_s", st::json_number(t.optimizer_s)},
          {"tp_s", st::json_number(t.tp_s)},
          {"cp_s", st::json_number(t.cp_s)},
          {"pp_s", st::json_number(t.pp_s)},
          {"ep_s", st::json_number(t.ep_s)},
          {"dp_s", st::json_number(t.dp_s)},
          {"bubble_s", st::json_number(t.bubble_s)},
          {"tokens_per_s", st::json_number(e.tokens_per_s)},
          {"tflops_per_gpu", st::json_number(e.tflops_per_gpu)},
          {"hardware_tflops_per_gpu", st::json_number(e.hardware_tflops_per_gpu)},
          {"mfu", st::json_number(e.mfu)}};
}

std::string device_text(const st::hw::device_spec& d, int storage_bytes) {
  return printf_string("%s: %g GB, %s/s peak (%s), %d per node, %g GB/s in a node, %g GB/s between nodes",
                       std::string(d.name).c_str(), d.memory_bytes / 1e9,
                       si(d.peak_flops(storage_bytes), "FLOP").c_str(), storage_bytes <= 2 ? "16-bit" : "fp32",
                       d.gpus_per_node, d.intra_node_bandwidth / 1e9, d.inter_node_bandwidth / 1e9);
}

// ---------------------------------------------------------------------------------------------
// --explain: where one step's time goes
// ---------------------------------------------------------------------------------------------

const char* recompute_name(st::recompute_mode r) {
  switch (r) {
    case st::recompute_mode::selective: return "selective";
    case st::recompute_mode::full: return "full";
    default: return "none";
  }
}

struct time_row {
  std::string label;
  double seconds;
};

std::vector<time_row> time_rows(const st::step_time& t, const st::plan_setup& s) {
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
std::string time_svg(const std::vector<time_row>& rows, double step) {
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

void explain_step(const options& o, const st::step_time& t, const st::plan_setup& s) {
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
// Mode 4: a device from measurements (--calibrate)
// ---------------------------------------------------------------------------------------------
//
// Reads {"base": preset, "name": ..., "storage_bytes": 2, "gemms": [{"m", "n", "k", "seconds"}],
// and optionally the measured "memory_bandwidth" (a device-to-device copy's bytes/s) and
// "intra_node_bandwidth" / "inter_node_bandwidth" (collectives' bus bandwidth, bytes/s)}, and
// prints the device JSON --hw-file reads: the GEMM figures fitted (plan/calibration.hpp), and
// measured bandwidths taken as reached (their efficiency 1).

int run_calibrate(const options& o) {
  std::ifstream in(o.calibrate);
  if (!in.good()) throw usage_error("--calibrate " + o.calibrate + ": cannot open the file");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const auto bad = [&](const std::string& why) { return usage_error("--calibrate " + o.calibrate + ": " + why); };
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  nlohmann::json base = nlohmann::json::object();
  for (const char* key : {"base", "name"})
    if (j.contains(key)) base[key] = j[key];
  st::hw::named_device start =
      st::hw::device_from_json(base.contains("base") ? base : nlohmann::json{{"base", o.hw}}, o.calibrate);
  const int storage = j.value("storage_bytes", 2);
  if (storage != 2 && storage != 4) throw bad("\"storage_bytes\" is 2 or 4");
  if (!j.contains("gemms") || !j["gemms"].is_array() || j["gemms"].empty())
    throw bad("\"gemms\" lists the measured GEMMs: [{\"m\": .., \"n\": .., \"k\": .., \"seconds\": ..}]");
  std::vector<st::gemm_sample> samples;
  for (const auto& g : j["gemms"]) {
    for (const char* key : {"m", "n", "k", "seconds"})
      if (!g.contains(key) || !g[key].is_number())
        throw bad(std::string("a GEMM without a number \"") + key + "\": " + g.dump());
    samples.push_back({{g["m"].get<std::int64_t>(), g["n"].get<std::int64_t>(), g["k"].get<std::int64_t>()},
                       g["seconds"].get<double>()});
  }
  st::hw::device_spec d = start.get();
  const auto measured = [&](const char* key, double& field, double& efficiency) {
    if (!j.contains(key)) return;
    if (!j[key].is_number() || j[key].get<double>() <= 0)
      throw bad(std::string("\"") + key + "\" is a positive number");
    field = j[key].get<double>();
    efficiency = 1;
  };
  double link_efficiency = d.link_efficiency;
  measured("memory_bandwidth", d.memory_bandwidth, d.memory_efficiency);
  measured("intra_node_bandwidth", d.intra_node_bandwidth, link_efficiency);
  measured("inter_node_bandwidth", d.inter_node_bandwidth, link_efficiency);
  d.link_efficiency = link_efficiency;
  const st::gemm_fit fit = st::calibrate_gemms(d, samples, storage);
  const st::hw::device_spec& c = fit.device;
  std::fprintf(stderr,
               "strata-plan --calibrate: %d of %zu GEMMs fitted (the rest memory-bound): efficiency %.3f, k_half %.0f, "
               "floor %.1f us, rms error %.1f%%\n",
               fit.samples_used, samples.size(), c.gemm_efficiency, c.gemm_k_half, 1e6 * c.gemm_floor_seconds,
               100 * (std::exp(fit.rms_log_error) - 1));
  nlohmann::ordered_json out;
  if (base.contains("base")) out["base"] = base["base"];
  else out["base"] = o.hw;
  out["name"] = start.name;
  out["gemm_efficiency"] = st::json_number(c.gemm_efficiency);
  out["gemm_k_half"] = st::json_number(c.gemm_k_half);
  out["gemm_floor_seconds"] = st::json_number(c.gemm_floor_seconds);
  out["memory_bandwidth"] = st::json_number(c.memory_bandwidth);
  out["memory_efficiency"] = st::json_number(c.memory_efficiency);
  out["intra_node_bandwidth"] = st::json_number(c.intra_node_bandwidth);
  out["inter_node_bandwidth"] = st::json_number(c.inter_node_bandwidth);
  out["link_efficiency"] = st::json_number(c.link_efficiency);
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
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
  const step_estimate e = estimate_step(r, setup, m, b, d);
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
  std::printf(
      "estimate (the --search time model): step %s, %s tokens/s, %.1f TFLOP/s per GPU (%.1f counting "
      "recomputation), MFU %s\n",
      seconds_text(e.time.step_s).c_str(), grouped(std::llround(e.tokens_per_s)).c_str(), e.tflops_per_gpu,
      e.hardware_tflops_per_gpu, percent(e.mfu).c_str());
  if (o.explain || !o.explain_svg.empty()) explain_step(o, e.time, setup);
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
      if (o.pin_cp && cp != o.cp) continue;
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
          if (o.pin_schedule && (v > 1) != (o.schedule == "interleaved")) continue;
          const auto schedule =
              v > 1 ? st::pipeline_schedule_kind::interleaved : st::pipeline_schedule_kind::one_f_one_b;
          for (const std::int64_t micro : {1, 2, 4, 8}) {
            if ((B / dp) % micro) continue;
            const std::int64_t M = B / (dp * micro);
            if (v > 1 && M % pp) continue;
            for (int zero = 0; zero <= 3; ++zero) {
              if (o.pin_zero && zero != o.zero) continue;
              if (pp > 1 && zero > 1) continue;
              if (dp * cp == 1 && zero > 0) continue;  // nothing to shard over: the same plan as ZeRO-0
              for (const bool sp : {false, true}) {
                if (sp && (tp == 1 || (m.seq / cp) % tp)) continue;
                if (o.pin_sp && sp != o.sp) continue;
                for (const auto rc :
                     {st::recompute_mode::none, st::recompute_mode::selective, st::recompute_mode::full}) {
                  if (o.pin_recompute && rc != st::parse_recompute_mode(o.recompute)) continue;
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
                  c.est = estimate_step(c.plan, s, m, b, d);
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
    if (a.est.time.step_s != b.est.time.step_s) return a.est.time.step_s < b.est.time.step_s;
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
                     {"step_time_s", st::json_number(c.est.time.step_s)},
                     {"tokens_per_s", st::json_number(c.est.tokens_per_s)},
                     {"tflops_per_gpu", st::json_number(c.est.tflops_per_gpu)},
                     {"hardware_tflops_per_gpu", st::json_number(c.est.hardware_tflops_per_gpu)},
                     {"mfu", st::json_number(c.est.mfu)},
                     {"total_bytes", c.plan.total_bytes()}});
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }

  std::printf("strata-plan --search: %s, global batch %lld\n", F::shape_text(m).c_str(), (long long)B);
  std::printf("on %d x %s\n", G, device_text(d, storage).c_str());
  std::printf("%s, %s; step-time model per op, ranks placed tp, cp, dp, pp (see --help)\n",
              precision_text(o.precision).c_str(), opt == st::optimizer_kind::adamw ? "AdamW" : "SGD with momentum");
  if (o.ep > 1)
    std::printf(
        "expert parallel ep %d in every layout (within dp x cp: those where it does not divide dp x cp are not "
        "considered)\n",
        o.ep);
  std::string pins;
  const auto pin = [&](bool given, const std::string& text) {
    if (given) pins += (pins.empty() ? "" : ", ") + text;
  };
  pin(o.pin_cp, "cp " + std::to_string(o.cp));
  pin(o.pin_zero, "ZeRO-" + std::to_string(o.zero));
  pin(o.pin_sp, o.sp ? "sequence parallel" : "no sequence parallelism");
  pin(o.pin_recompute, o.recompute + " recomputation");
  pin(o.pin_schedule, "the " + o.schedule + " schedule");
  if (!pins.empty()) std::printf("every layout with %s (as given)\n", pins.c_str());
  std::printf("%lld layouts considered, %zu fit; the best %zu:\n\n", (long long)considered, fitting.size(), shown);
  std::printf("%3s %4s %3s %-10s %3s %3s %3s %4s %3s %3s %-9s %9s %12s %11s %6s %9s %7s\n", "#", "dp", "cp", "form",
              "tp", "pp", "v", "zero", "mb", "sp", "recompute", "step", "tokens/s", "TFLOP/s/GPU", "MFU", "GB/rank",
              "of dev");
  for (std::size_t i = 0; i < shown; ++i) {
    const candidate& c = fitting[i];
    std::printf("%3zu %4d %3d %-10s %3d %3d %3d %4d %3lld %3s %-9s %9s %12s %11.1f %6s %9s %7s\n", i + 1, c.dp, c.cp,
                c.cp > 1 ? c.cp_form.c_str() : "-", c.tp, c.pp, c.v, c.zero, (long long)c.micro, c.sp ? "on" : "off",
                recompute_name(c.recompute), seconds_text(c.est.time.step_s).c_str(),
                grouped(std::llround(c.est.tokens_per_s)).c_str(), c.est.tflops_per_gpu, percent(c.est.mfu).c_str(),
                gb(double(c.plan.total_bytes())).c_str(),
                percent(double(c.plan.total_bytes()) / d.memory_bytes).c_str());
  }
  if (!o.rank_layout.empty()) {
    const int tp = o.rank_layout[0], pp = o.rank_layout[1], dp = o.rank_layout[2];
    const auto it = std::find_if(fitting.begin(), fitting.end(),
                                 [&](const candidate& c) { return c.tp == tp && c.pp == pp && c.dp == dp; });
    if (it == fitting.end()) {
      std::printf("\ntp %d pp %d dp %d: no layout with these degrees fits\n", tp, pp, dp);
      return 1;
    }
    std::printf("\ntp %d pp %d dp %d ranks %td of %zu (its best: %s); the first is %.1f%% faster\n", tp, pp, dp,
                it - fitting.begin() + 1, fitting.size(), seconds_text(it->est.time.step_s).c_str(),
                100.0 * (it->est.time.step_s / fitting.front().est.time.step_s - 1));
  }
  return 0;
}

const char* const search_model_help = R"(
Step-time model (ranks the layouts; an estimate, not a measurement; docs/planner.md):
  GPUs = dp x cp x tp x pp; ranks placed tp fastest, then cp, then dp, then pp
  per micro-batch on the busiest stage:
    GEMMs by shape: waves of 128 x 256 output tiles over the SMs at gemm_efficiency x k/(k + k_half),
    each at least gemm_floor_seconds
    attention at attention_efficiency x peak; norms, activations, residual, rotary, embedding
    and loss at memory_efficiency x memory bandwidth; recomputation as its extra work
  communication at link_efficiency x the bandwidth of the links a group crosses (NVLink within
  a node, the network across), plus a latency per ring step:
    tp exposed (but a device's tensor_overlap share); cp ring hidden behind attention where it
    is shorter; ep exposed; pp sends only at the bubble's edges; dp buckets hidden behind
    backward but the last (ZeRO-1's weight gather exposed)
  T_step = M x micro-batch + bubble (p-1)/V micro-batches + edge sends + dp exposed + optimizer
  tokens/s = global batch x seq / T_step; TFLOP/s per GPU = model FLOPs / T_step / GPUs
  --explain prints where the time goes, --explain-svg FILE draws it; --hw-file FILE reads a
  device (a preset with figures replaced: {"base": "a100_80gb", "gemm_efficiency": 0.78})
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
  auto* context = app.add_option("--cp", o.cp,
                                 "context-parallel degree: each sequence cut into 2 x cp chunks, two per rank "
                                 "(--seq divisible by 2 x cp)")
                      ->check(positive)
                      ->capture_default_str();
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
  auto* sequence = app.add_flag("--sp,!--no-sp", o.sp, "sequence parallelism in the tensor-parallel group");
  auto* recompute = app.add_option("--recompute", o.recompute, "activation recomputation: none, selective, full")
                        ->check(CLI::IsMember({"none", "selective", "full"}))
                        ->capture_default_str();
  auto* schedule = app.add_option("--schedule", o.schedule,
                                  "pipeline schedule: gpipe, 1f1b, interleaved (default 1f1b, "
                                  "interleaved when --virtual > 1); with --search: 1f1b or interleaved only")
                       ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  layout_flags.push_back(schedule);
  // With --search these pin every candidate instead of choosing a layout.
  const std::vector<CLI::Option*> search_pins = {context, sequence, recompute, zero, schedule};
  for (auto* f : {context, sequence, recompute}) layout_flags.push_back(f);

  // Training and device.
  app.add_option("--precision", o.precision, "fp32, bf16 or fp16 (16-bit: with fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw (2 fp32 moments) or sgd (momentum: 1)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--hw", o.hw, "device preset: " + preset_names())->check(device_preset())->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON value instead of the table");
  auto* hw_file = app.add_option("--hw-file", o.hw_file,
                                 "a device as JSON: a preset (\"base\") with figures replaced, or a whole device_spec");
  hw_file->excludes(app.get_option("--hw"));
  auto* explain = app.add_flag("--explain", o.explain, "print where one step's time goes");
  auto* explain_svg = app.add_option("--explain-svg", o.explain_svg, "draw where one step's time goes as SVG bars");

  // Back-of-envelope.
  auto* params = app.add_option("--params", o.params, "model-state estimate for N parameters (70e9 or 70000000000)")
                     ->check(param_count());
  app.add_option("--master", o.master,
                 "with --params: fp32 master copy or none (default fp32 for "
                 "16-bit precisions)")
      ->check(CLI::IsMember({"fp32", "none"}))
      ->needs(params);

  // Calibration.
  auto* calibrate = app.add_option("--calibrate", o.calibrate,
                                   "print a device JSON for --hw-file from measurements on a device (GEMM times, "
                                   "bandwidths; docs/planner.md)");

  // Search.
  auto* search = app.add_flag("--search", o.search, "rank every layout of --gpus devices that fits");
  app.add_option("--gpus", o.gpus, "with --search: number of devices")->check(positive)->needs(search);
  app.add_option("--rank-layout", o.rank_layout,
                 "with --search: where the layout of these tensor, pipeline and data-parallel degrees ranks "
                 "(TP,PP,DP), and how much faster the first is")
      ->delimiter(',')
      ->expected(3)
      ->check(positive)
      ->needs(search);
  app.add_option("--top", o.top, "with --search: how many layouts to show")
      ->check(positive)
      ->needs(search)
      ->capture_default_str();

  for (auto* f : shape_flags) params->excludes(f);
  for (auto* f : layout_flags) {
    params->excludes(f);
    if (std::find(search_pins.begin(), search_pins.end(), f) == search_pins.end()) search->excludes(f);
  }
  params->excludes(search);
  calibrate->excludes(params);
  calibrate->excludes(search);
  calibrate->excludes(hw_file);
  for (auto* f : shape_flags) calibrate->excludes(f);
  for (auto* f : layout_flags) calibrate->excludes(f);
  params->excludes(expert_parallel);
  params->excludes(explain);
  params->excludes(explain_svg);
  search->excludes(explain);
  search->excludes(explain_svg);
  search->excludes(dp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  o.pin_zero = zero->count() > 0;
  o.pin_cp = context->count() > 0;
  o.pin_recompute = recompute->count() > 0;
  o.pin_sp = sequence->count() > 0;
  o.pin_schedule = schedule->count() > 0;
  st::hw::named_device from_file;
  const st::hw::device_spec* preset = st::hw::find(o.hw);
  try {
    if (!o.hw_file.empty()) {
      try {
        from_file = st::hw::device_from_json_file(o.hw_file);
      } catch (const st::error& e) { throw usage_error(std::string("--hw-file ") + e.what()); }
    }
    const st::hw::device_spec& device = o.hw_file.empty() ? *preset : from_file.get();
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
    if (!o.calibrate.empty()) return run_calibrate(o);
    if (!o.params.empty()) return run_model_state(o, device);

    // Plan and search need a shape and a batch.
    std::string missing;
    const std::pair<const char*, std::int64_t> required[] = {
        {"--layers", o.shape.layers}, {"--hidden", o.shape.d_model}, {"--heads", o.shape.heads},
        {"--seq", o.shape.seq},       {"--vocab", o.shape.vocab},    {"--global-batch", o.global_batch}};
    for (const auto& [name, value] : required)
      if (value == 0) missing += (missing.empty() ? "" : ", ") + std::string(name);
    if (o.search && o.pin_schedule && o.schedule == "gpipe")
      throw usage_error("--search ranks the 1f1b and interleaved schedules; --schedule gpipe pins none of them");
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
