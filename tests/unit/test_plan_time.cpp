// The planner's time model (plan/time_model.hpp): GEMM waves and efficiency, the layers' kinds of
// work against their FLOPs, placement on the links, overlap, a device from JSON, and the
// prediction of every row of the published table in tests/plan/published_runs.json, with the
// micro-batch the model finds fastest and as the published scripts ran it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/models/gpt2.hpp"
#include "strata/plan/calibration.hpp"
#include "strata/plan/hardware_json.hpp"
#include "strata/plan/plan.hpp"
#include "strata/plan/time_model.hpp"

namespace st = strata;

namespace {

// The example GPT-2 on a GPU in bf16, as strata-plan plans it.
using gpt = strata::models::gpt2::model<st::policy<st::cuda, st::serial, st::mixed<st::bf16, float>>>;

st::plan_setup layout(int dp, int tp, int pp, int v, std::int64_t microbatches, st::recompute_mode r, int zero = 0) {
  st::plan_setup s;
  s.layout.dp = dp;
  s.layout.tp = tp;
  s.layout.pp = pp;
  s.layout.virtual_chunks = v;
  s.layout.zero_stage = zero;
  s.layout.microbatches = int(microbatches);
  s.recompute = r;
  s.schedule = v > 1 ? st::pipeline_schedule_kind::interleaved : st::pipeline_schedule_kind::one_f_one_b;
  if (v > 1) s.layout.schedule = "interleaved_1f1b";
  return s;
}

}  // namespace

TEST_CASE("a GEMM runs in whole waves of tiles, at an efficiency that grows with k to the ceiling") {
  constexpr auto d = st::hw::a100_80gb;  // 108 SMs, 128 x 256 tiles
  const auto t = [&](std::int64_t m, std::int64_t n, std::int64_t k) { return st::gemm_seconds({m, n, k}, d, 2); };
  // 108 tiles are one wave; 109 are two, so twice the time.
  CHECK(t(128 * 12, 256 * 9, 4096) == doctest::Approx(t(128 * 108, 256, 4096)));
  CHECK(t(128 * 109, 256, 4096) == doctest::Approx(2 * t(128 * 108, 256, 4096)));
  // A partial tile costs a whole one.
  CHECK(t(128 * 108 - 5, 256, 4096) == doctest::Approx(t(128 * 108, 256, 4096)));
  // One full wave: 108 tiles x 2·128·256·k FLOPs at 0.8 · k/(k + 128) of 312 TFLOP/s.
  const double k = 4096, flops = 108 * 2.0 * 128 * 256 * k;
  CHECK(t(128 * 108, 256, 4096) == doctest::Approx(flops / (0.8 * k / (k + 128) * 312e12)));
  // Efficiency rises with k towards 0.8 of the peak.
  const auto achieved = [&](std::int64_t kk) {
    return 2.0 * 128 * 108 * 256 * double(kk) / t(128 * 108, 256, kk) / 312e12;
  };
  CHECK(achieved(64) < achieved(1024));
  CHECK(achieved(1024) < achieved(16384));
  CHECK(achieved(16384) > 0.79);
  CHECK(achieved(16384) < 0.8);
  // Never faster than its operands and result at the memory bandwidth: 2·(m·k + k·n + m·n) bytes.
  st::hw::device_spec slow = d;
  slow.memory_bandwidth = 1e9;
  CHECK(st::gemm_seconds({4096, 4096, 4096}, slow, 2) == doctest::Approx(2.0 * 3 * 4096 * 4096 / (1e9 * 0.8)));
}

TEST_CASE("the layers' matrix products and attention are their FLOPs, bar the element-wise terms") {
  // GPT-3's shape: a plan's GEMMs and attention, over the whole batch, against the Narayanan
  // formula (72·B·s·l·h²·(1 + s/6h + V/12lh)), which counts exactly those.
  const strata::models::gpt2::dims m{.vocab = 51200, .seq = 2048, .layers = 96, .heads = 96, .d_model = 12288};
  for (const int tp : {1, 8}) {
    const st::plan_result r =
        st::plan_model<gpt>(m, {.micro = 1, .global = 64}, layout(8, tp, 1, 1, 8, st::recompute_mode::none));
    const st::layer_cost& w = r.stage_work_plain;
    const double per_micro =
        w.forward_gemms.flops() + w.backward_gemms.flops() + w.attention_forward_flops + w.attention_backward_flops;
    const double B = 64, s = 2048, l = 96, h = 12288, V = 51200;
    const double formula = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    CAPTURE(tp);
    CHECK(per_micro * double(r.microbatches) * 8 * tp == doctest::Approx(formula).epsilon(1e-3));
    // Every FLOP counted as work of one kind is one of the layers' FLOPs.
    CHECK(w.forward_gemms.flops() + w.attention_forward_flops <= double(w.forward_flops));
    const st::plan_result full =
        st::plan_model<gpt>(m, {.micro = 1, .global = 64}, layout(8, tp, 1, 1, 8, st::recompute_mode::full));
    // Full recomputation repeats the blocks' forward products in backward (not the head's).
    const double head_forward = 2 * s * h * V / tp;
    CHECK(full.stage_work.backward_gemms.flops() ==
          doctest::Approx(w.backward_gemms.flops() + w.forward_gemms.flops() - head_forward));
    CHECK(full.stage_work.attention_backward_flops ==
          doctest::Approx(w.attention_backward_flops + w.attention_forward_flops));
  }
}

TEST_CASE("attention's memory-bound bytes count the rotary embedding and the per-head regrouping") {
  // bf16 on a GPU: 16 rows, 8 query heads of 16 (4 key/value heads), tp 2. The rotary embedding
  // reads and writes the turned part of this rank's q and k heads, each way; the per-head layout
  // copies qkv aside and regroups it (two reads, two writes), each way.
  using P = st::policy<st::cuda, st::serial, st::mixed<st::bf16, float>>;
  using attn = st::attention<P>;
  st::cost_scope s{.batch = 2, .seq = 8};
  s.tp.degree = 2;
  const double rows = 16, bytes = 2;
  const attn::config plain{.channels = 128, .heads = 8, .kv_heads = 4};
  attn::config rotary = plain;
  rotary.rope_theta = 10000;
  rotary.rotary_fraction = 0.5;  // 8 of each head's 16
  const st::layer_cost a = attn::cost(plain, s), b = attn::cost(rotary, s);
  const double rope = 2 * rows * (4 + 2) * 8 * bytes;
  CHECK(b.memory_forward_bytes - a.memory_forward_bytes == rope);
  CHECK(b.memory_backward_bytes - a.memory_backward_bytes == rope);
  attn::config per_head{.channels = 128, .heads = 8};
  const st::layer_cost grouped = attn::cost(per_head, s);
  per_head.fused_qkv = st::qkv_layout::per_head;
  const st::layer_cost regrouped = attn::cost(per_head, s);
  const double qkv = rows * (4 + 2 * 4) * 16 * bytes;  // this rank's 4 heads, q, k and v
  CHECK(regrouped.memory_forward_bytes - grouped.memory_forward_bytes == 4 * qkv);
  CHECK(regrouped.memory_backward_bytes - grouped.memory_backward_bytes == 4 * qkv);
}

TEST_CASE("groups use NVLink inside a node and the network across, and overlap hides what it can") {
  const strata::models::gpt2::dims m{.vocab = 51200, .seq = 2048, .layers = 24, .heads = 32, .d_model = 4096};
  constexpr auto d = st::hw::a100_80gb;
  const auto estimate = [&](int dp, int tp, int pp, int zero, const st::hw::device_spec& dev) {
    const std::int64_t M = 64 / dp;
    const auto s = layout(dp, tp, pp, 1, M, st::recompute_mode::full, zero);
    return st::estimate_step_time(st::plan_model<gpt>(m, {.micro = 1, .global = 64}, s), s, dev);
  };
  // tp 8 fits a node of 8; the gradient group of dp 2 x (tp 8) spans two nodes.
  const st::step_time a = estimate(2, 8, 1, 0, d);
  CHECK(a.tp_intra);
  CHECK_FALSE(a.dp_intra);
  // With 16 GPUs per node both stay inside one, and the exposed time falls.
  st::hw::device_spec big = d;
  big.gpus_per_node = 16;
  const st::step_time b = estimate(2, 8, 1, 0, big);
  CHECK(b.dp_intra);
  CHECK(b.dp_s < a.dp_s);
  // Tensor-parallel collectives are exposed unless the device's overlap hides them.
  st::hw::device_spec overlapped = d;
  overlapped.tensor_overlap = 0.75;
  const st::step_time c = estimate(2, 8, 1, 0, overlapped);
  CHECK(c.tp_s == doctest::Approx(0.25 * a.tp_s));
  // Data-parallel buckets hide behind backward: exposed is less than the whole reduction.
  const st::plan_result r =
      st::plan_model<gpt>(m, {.micro = 1, .global = 64}, layout(2, 8, 1, 1, 32, st::recompute_mode::full));
  CHECK(a.dp_s < r.comm_bytes.dp / (d.inter_node_bandwidth * d.link_efficiency));
  CHECK(a.dp_s > 0);
  // The pipeline's bubble is (p - 1) micro-batches, a 1/V share of them when interleaved.
  const auto pipe = [&](int v) {
    const auto s = layout(1, 8, 4, v, 16, st::recompute_mode::full);
    const st::plan_result p = st::plan_model<gpt>(m, {.micro = 4, .global = 64}, s);
    return st::estimate_step_time(p, s, d);
  };
  const st::step_time p1 = pipe(1), p2 = pipe(2);
  CHECK(p1.bubble_s / (p1.step_s - p1.bubble_s - p1.pp_s - p1.optimizer_s) == doctest::Approx(3.0 / 16).epsilon(0.02));
  CHECK(p2.bubble_s == doctest::Approx(p1.bubble_s / 2).epsilon(0.02));
  // Recomputation is its own line: the extra forward work.
  CHECK(p1.recompute_s > 0);
  CHECK(estimate(8, 1, 1, 0, d).recompute_s > 0);
}

TEST_CASE("a device from JSON: a preset with figures replaced, and clear errors") {
  const nlohmann::json j = {{"base", "a100_40gb"}, {"name", "mine"}, {"gemm_efficiency", 0.7}, {"sm_count", 100}};
  st::hw::named_device n = st::hw::device_from_json(j, "mine.json");
  const st::hw::device_spec& d = n.get();
  CHECK(d.name == "mine");
  CHECK(d.gemm_efficiency == 0.7);
  CHECK(d.sm_count == 100);
  CHECK(d.memory_bytes == 40e9);
  const auto error_of = [](const nlohmann::json& bad) {
    try {
      st::hw::device_from_json(bad, "dev.json");
    } catch (const st::error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  CHECK(error_of({{"base", "a100_80gb"}, {"gemm_eficiency", 0.7}}) ==
        "dev.json: unknown key \"gemm_eficiency\" (a device_spec field, \"base\" or \"name\")");
  CHECK(error_of({{"base", "a100_80gb"}, {"gemm_efficiency", 1.5}}) ==
        "dev.json: \"gemm_efficiency\" is a share of a peak in (0, 1], got 1.5");
  CHECK(error_of({{"base", "b100"}}) == "dev.json: \"base\": unknown preset 'b100'");
  CHECK(error_of({{"base", "a100_80gb"}, {"sm_count", "many"}}) ==
        "dev.json: \"sm_count\" is a whole number from 1 to 1048576, got \"many\"");
  CHECK(error_of({{"memory_bytes", 1e9}}).find("a device needs memory_bytes") != std::string::npos);
  // A device_spec of one's own without the time model's figures: a start-up error, not infinity.
  constexpr st::hw::device_spec bare{.name = "bare",
                                     .memory_bytes = 80e9,
                                     .peak_flops_16bit = 1e15,
                                     .peak_flops_fp32 = 1e14,
                                     .intra_node_bandwidth = 1e11,
                                     .inter_node_bandwidth = 1e10};
  const strata::models::gpt2::dims m{.vocab = 256, .seq = 64, .layers = 2, .heads = 4, .d_model = 64};
  const auto s = layout(1, 1, 1, 1, 1, st::recompute_mode::none);
  CHECK_THROWS_WITH(st::estimate_step_time(st::plan_model<gpt>(m, {.micro = 1, .global = 1}, s), s, bare),
                    "time model: device 'bare' needs its peak, memory and link bandwidths, SM count, GEMM tile and "
                    "GPUs per node");
}

TEST_CASE("every row of the published table: median error at most 5%, largest at most 12%, and it fits") {
  std::ifstream in(STRATA_PUBLISHED_RUNS);
  REQUIRE(in.good());
  const nlohmann::json data = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  int tables = 0;
  for (const auto& table : data.at("tables")) {
    ++tables;
    REQUIRE(table.at("model") == "gpt2");
    REQUIRE(table.at("recompute") == "full");
    st::hw::named_device device = st::hw::device_from_json(table.at("device"), STRATA_PUBLISHED_RUNS);
    const st::hw::device_spec& d = device.get();
    std::vector<double> errors;
    for (const auto& row : table.at("rows")) {
      const strata::models::gpt2::dims m{.vocab = table.at("vocab"),
                                         .seq = table.at("seq"),
                                         .layers = row.at("layers"),
                                         .heads = row.at("heads"),
                                         .d_model = row.at("hidden")};
      const int tp = row.at("tp"), pp = row.at("pp"), gpus = row.at("gpus");
      const std::int64_t B = row.at("global_batch");
      const int dp = gpus / (tp * pp);
      REQUIRE(dp * tp * pp == gpus);
      // The table gives t, p and d; the micro-batch is the fastest that fits (and the number of
      // chunks, under the interleaved schedule).
      double best_step = 0, best_tflops = 0;
      std::int64_t best_micro = 0;
      int best_v = 0;
      for (const std::int64_t micro : {1, 2, 4, 8}) {
        if ((B / dp) % micro) continue;
        const std::int64_t M = B / (dp * micro);
        for (const int v : {1, 2, 4}) {
          if (v > 1 && (pp == 1 || m.layers % (pp * v) || M % pp)) continue;
          if ((v > 1) != (table.at("schedule") == "interleaved")) continue;
          const auto s = layout(dp, tp, pp, v, M, st::recompute_mode::full, table.at("zero"));
          const st::plan_result r = st::plan_model<gpt>(m, {.micro = micro, .global = B}, s);
          if (!r.fits(d)) continue;
          const st::step_time t = st::estimate_step_time(r, s, d);
          if (best_step == 0 || t.step_s < best_step) {
            best_step = t.step_s;
            best_tflops = r.flops_per_step / t.step_s / gpus / 1e12;
            best_micro = micro;
            best_v = v;
          }
        }
      }
      const double published = row.at("published");
      const std::string label = row.at("label");
      CAPTURE(label);
      REQUIRE(best_step > 0);  // the published layout fits in the predicted memory
      const double error = best_tflops / published - 1;
      errors.push_back(std::abs(error));
      MESSAGE(std::string(table.at("source"))
              << ": " << label << " t" << tp << " p" << pp << " d" << dp << " (micro-batch " << best_micro << ", V "
              << best_v << "): predicted " << best_tflops << " TFLOP/s, published " << published << ", error "
              << 100 * error << "%");
    }
    std::vector<double> sorted = errors;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    MESSAGE("median error " << 100 * median << "%, largest " << 100 * sorted.back() << "%");
    CHECK(median <= 0.05);
    CHECK(sorted.back() <= 0.12);
  }
  CHECK(tables >= 1);
}

TEST_CASE("every row of the published table as its scripts ran it: median error at most 5%, largest 12%") {
  // Each row's as_run: the micro-batch and model chunks of Megatron-LM's scripts for the paper, and
  // the data-parallel implementation's overlap, over the table's device.
  std::ifstream in(STRATA_PUBLISHED_RUNS);
  REQUIRE(in.good());
  const nlohmann::json data = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  for (const auto& table : data.at("tables")) {
    std::vector<double> errors;
    for (const auto& row : table.at("rows")) {
      const std::string label = row.at("label");
      CAPTURE(label);
      REQUIRE(row.contains("as_run"));
      const nlohmann::json& run = row.at("as_run");
      nlohmann::json device_json = table.at("device");
      device_json.update(run.at("device"));
      st::hw::named_device device = st::hw::device_from_json(device_json, STRATA_PUBLISHED_RUNS);
      const strata::models::gpt2::dims m{.vocab = table.at("vocab"),
                                         .seq = table.at("seq"),
                                         .layers = row.at("layers"),
                                         .heads = row.at("heads"),
                                         .d_model = row.at("hidden")};
      const int tp = row.at("tp"), pp = row.at("pp"), gpus = row.at("gpus"), v = run.at("virtual");
      const std::int64_t B = row.at("global_batch"), micro = run.at("micro_batch");
      const int dp = gpus / (tp * pp);
      REQUIRE(B % (dp * micro) == 0);
      const auto s = layout(dp, tp, pp, v, B / (dp * micro), st::recompute_mode::full, table.at("zero"));
      const st::plan_result r = st::plan_model<gpt>(m, {.micro = micro, .global = B}, s);
      REQUIRE(r.fits(device.get()));
      const st::step_time t = st::estimate_step_time(r, s, device.get());
      const double predicted = r.flops_per_step / t.step_s / gpus / 1e12, published = row.at("published");
      const double error = predicted / published - 1;
      errors.push_back(std::abs(error));
      MESSAGE("as run: " << label << " t" << tp << " p" << pp << " d" << dp << " micro-batch " << micro << " V " << v
                         << ": predicted " << predicted << " TFLOP/s, published " << published << ", error "
                         << 100 * error << "%");
    }
    std::sort(errors.begin(), errors.end());
    const std::size_t n = errors.size();
    REQUIRE(n > 0);
    const double median = n % 2 ? errors[n / 2] : (errors[n / 2 - 1] + errors[n / 2]) / 2;
    MESSAGE("as run: median error " << 100 * median << "%, largest " << 100 * errors.back() << "%");
    CHECK(median <= 0.05);
    CHECK(errors.back() <= 0.12);
  }
}

TEST_CASE("the paper's tensor against pipeline sweep: (t, p) = (8, 8) predicted fastest, as it found") {
  // Narayanan et al. 2021, Figure 13 (the scripts' shape: 32 layers, hidden 20480, 128 heads,
  // micro-batch 1, full recomputation, 64 A100s, batch 32 and 128; (t, p) = (64/p, p) for p 2 to
  // 32): tensor parallelism up to a node's 8 GPUs and pipelining across nodes ran fastest, the
  // paper's first takeaway. On the table's device the model ranks (8, 8) first too.
  std::ifstream in(STRATA_PUBLISHED_RUNS);
  REQUIRE(in.good());
  const nlohmann::json data = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  st::hw::named_device device = st::hw::device_from_json(data.at("tables").at(0).at("device"), STRATA_PUBLISHED_RUNS);
  const strata::models::gpt2::dims m{.vocab = 51200, .seq = 2048, .layers = 32, .heads = 128, .d_model = 20480};
  for (const std::int64_t B : {32, 128}) {
    CAPTURE(B);
    int fastest_p = 0;
    double fastest = 0;
    for (const int p : {2, 4, 8, 16, 32}) {
      const auto s = layout(1, 64 / p, p, 1, B, st::recompute_mode::full);
      const st::plan_result r = st::plan_model<gpt>(m, {.micro = 1, .global = B}, s);
      REQUIRE(r.fits(device.get()));
      const double step = st::estimate_step_time(r, s, device.get()).step_s;
      if (fastest_p == 0 || step < fastest) {
        fastest = step;
        fastest_p = p;
      }
    }
    CHECK(fastest_p == 8);
  }
}

TEST_CASE("a layer that states FLOPs but not their kinds is refused by the time model, by name") {
  // The example GPT-2 with its work's kinds erased: a cost() written before they existed.
  const strata::models::gpt2::dims m{.vocab = 256, .seq = 64, .layers = 2, .heads = 4, .d_model = 64};
  const auto s = layout(1, 1, 1, 1, 1, st::recompute_mode::none);
  st::plan_result r = st::plan_model<gpt>(m, {.micro = 1, .global = 1}, s);
  CHECK_NOTHROW(st::estimate_step_time(r, s, st::hw::h100_80gb));
  r.stage_work_plain.forward_gemms = {};
  r.stage_work_plain.backward_gemms = {};
  CHECK_THROWS_WITH(st::estimate_step_time(r, s, st::hw::h100_80gb),
                    doctest::Contains("% of their FLOPs as matrix products or attention; a layer's cost() leaves its "
                                      "kinds of work unstated"));
}

TEST_CASE("calibration finds the GEMM efficiency and k_half that made the measurements") {
  // Measurements made by the model itself with known figures come back as those figures.
  st::hw::device_spec truth = st::hw::h100_80gb;
  truth.gemm_efficiency = 0.63;
  truth.gemm_k_half = 300;
  std::vector<st::gemm_sample> samples;
  for (const std::int64_t m : {2048, 8192})
    for (const std::int64_t n : {1024, 4096, 12288})
      for (const std::int64_t k : {64, 256, 1024, 4096, 16384})
        samples.push_back({{m, n, k}, st::gemm_seconds({m, n, k}, truth, 2)});
  const st::gemm_fit fit = st::calibrate_gemms(st::hw::h100_80gb, samples, 2);
  CHECK(fit.device.gemm_efficiency == doctest::Approx(0.63).epsilon(0.01));
  CHECK(fit.device.gemm_k_half == doctest::Approx(300).epsilon(0.05));
  CHECK(fit.rms_log_error < 0.01);
  // The thinnest products (k = 64 on the narrow outputs) are memory-bound and left out.
  CHECK(fit.samples_used >= 24);
  CHECK(fit.samples_used <= int(samples.size()));
  // Nothing to fit, or times no efficiency explains: errors that say so.
  CHECK_THROWS_WITH(st::calibrate_gemms(st::hw::h100_80gb, {}, 2), "calibrate_gemms: no GEMM measurements");
  const std::vector<st::gemm_sample> too_fast = {{{8192, 8192, 8192}, 1e-9}};
  CHECK_THROWS_WITH(st::calibrate_gemms(st::hw::h100_80gb, too_fast, 2),
                    doctest::Contains("no efficiency in (0, 1] explains the measurements"));
}

TEST_CASE("calibration finds the floor under small GEMMs, and the time model keeps it") {
  st::hw::device_spec truth = st::hw::h100_80gb;
  truth.gemm_efficiency = 0.8;
  truth.gemm_k_half = 200;
  truth.gemm_floor_seconds = 9e-6;
  std::vector<st::gemm_sample> samples;
  int floored = 0;
  for (const std::int64_t m : {2048, 8192})
    for (const std::int64_t n : {1024, 4096, 12288})
      for (const std::int64_t k : {64, 256, 1024, 4096, 16384}) {
        samples.push_back({{m, n, k}, st::gemm_seconds({m, n, k}, truth, 2)});
        if (samples.back().seconds == 9e-6) ++floored;
      }
  REQUIRE(floored >= 4);  // the floor decides several of the measurements
  const st::gemm_fit fit = st::calibrate_gemms(st::hw::h100_80gb, samples, 2);
  CHECK(fit.device.gemm_floor_seconds == doctest::Approx(9e-6));
  CHECK(fit.device.gemm_efficiency == doctest::Approx(0.8).epsilon(0.01));
  CHECK(fit.device.gemm_k_half == doctest::Approx(200).epsilon(0.05));
  CHECK(fit.rms_log_error < 0.01);
  // A GEMM below the floor takes the floor; one far above it is untouched by it.
  CHECK(st::gemm_seconds({64, 64, 64}, truth, 2) == 9e-6);
  st::hw::device_spec no_floor = truth;
  no_floor.gemm_floor_seconds = 0;
  CHECK(st::gemm_seconds({8192, 8192, 8192}, truth, 2) == st::gemm_seconds({8192, 8192, 8192}, no_floor, 2));
  // A device file sets it, and refuses a negative one.
  auto d = st::hw::device_from_json({{"base", "h200_141gb"}, {"gemm_floor_seconds", 1.1e-5}}, "dev.json");
  CHECK(d.get().gemm_floor_seconds == 1.1e-5);
  CHECK_THROWS_WITH(st::hw::device_from_json({{"base", "h200_141gb"}, {"gemm_floor_seconds", -1}}, "dev.json"),
                    "dev.json: \"gemm_floor_seconds\" is a non-negative number, got -1");
}
