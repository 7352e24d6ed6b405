// The rules that let a run restart without a human and never train on garbage:
//   - an incomplete checkpoint (a crash while saving) is passed over and removed; none complete
//     is a fresh start; complete but damaged ones are refused, never silently discarded;
//   - every manifest value is checked (range, type, the step against its directory);
//   - a non-finite gradient is never applied, in any precision, whatever the scaler's state, and
//     a run of them stops the run;
//   - a checkpoint directory belongs to one run: another is refused before anything is touched.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/layers/embedding.hpp>
#include <strata/layers/layernorm.hpp>
#include <strata/layers/lm_head.hpp>
#include <strata/layers/sequential.hpp>
#include <strata/layers/transformer_block.hpp>
#include <strata/parallel/sequential_model.hpp>
#include <strata/train/checkpoint.hpp>
#include <strata/train/corpus.hpp>
#include <strata/train/trainer.hpp>

#include "../support/tiny_checkpoint_model.hpp"

namespace st = strata;
namespace fs = std::filesystem;
namespace cf = strata::checkpoint_files;

namespace {

// A small model: embedding, one block, LayerNorm, tied head.
using dims = strata_test::tiny_dims;
using strata_test::tiny_model;

using P32 = st::policy<st::host, st::serial, st::fp32>;
using PBF16 = st::policy<st::host, st::serial, st::mixed<st::bf16, float>>;
using PFP16 = st::policy<st::host, st::serial, st::mixed<st::fp16, float>>;

std::string scratch(const std::string& name) {
  const auto dir = fs::current_path() / ("resume_rules_" + name);
  fs::remove_all(dir);
  return dir.string();
}
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

template <class P>
struct run {
  st::memory_ledger ledger;
  st::sequential_model<tiny_model<P>> model{ledger, dims{}, st::seed{5}};
  st::adamw<P> opt{model, {.lr = 1e-2}};
  st::trainer<st::sequential_model<tiny_model<P>>, st::adamw<P>> train;
  st::token_stream data{st::byte_tokens(st::generate_corpus(5000)), 7};
  explicit run(st::trainer_options o = options()) : train(model, opt, o) {}
  static st::trainer_options options() {
    st::trainer_options o;
    o.schedule = {1e-2, 1e-3, 0, 50};
    o.initial_loss_scale = 4;  // fp16: two back-offs reach the minimum of 1
    o.nonfinite_step_limit = 3;
    return o;
  }
  st::step_result step() { return train.step(data.next_batch(2, dims{}.seq)); }
  st::train_state_ref<P> state() { return {model.parameters(), opt, {}}; }
  st::checkpointer checkpointer(const std::string& dir, std::uint64_t seed = 5) {
    return st::checkpointer({dir, 0}, st::group_ref(), {{"world", 1}}, {{"d_model", dims{}.d_model}}, seed);
  }
  std::string save(st::checkpointer& c) {
    return c.save(st::train_progress{train.steps(), opt.steps_taken(), train.scaler().snapshot(), 5, data.position()},
                  state());
  }
  std::int64_t offset_of(const std::string& name) {
    for (const auto& e : model.parameters().entries())
      if (e.name == name) return e.offset;
    FAIL("no parameter " << name);
    return -1;
  }
};

template <class T>
std::vector<T> copy(std::span<const T> s) {
  return {s.begin(), s.end()};
}

void write_manifest(const std::string& step_dir, const nlohmann::json& m) {
  const std::string text = m.dump(1) + "\n";
  st::write_file_durably(step_dir + "/manifest.json", text);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  st::write_file_durably(step_dir + "/COMPLETE", "crc32 " + cf::hex32(st::crc32_of({p, text.size()})) + "\n");
}

}  // namespace

// ---- a non-finite gradient is never applied ----

TEST_CASE_TEMPLATE(
    "a non-finite gradient skips the step in every precision; only fp16's scaler reacts; a run of them stops", P, P32,
    PBF16, PFP16) {
  using T = typename P::storage;
  run<P> r;
  REQUIRE(r.step().applied);
  auto& p = r.model.parameters();
  const auto at = std::size_t(r.offset_of("ln_f.weight"));
  const T good = p.weights_data()[at];
  p.weights_data()[at] = st::convert<T>(std::numeric_limits<double>::quiet_NaN());  // every gradient NaN from here
  const std::vector<T> weights(p.weights_data(), p.weights_data() + p.size());
  const auto master = copy<float>(r.opt.master_weights());
  const auto m1 = copy<float>(r.opt.first_moments()), m2 = copy<float>(r.opt.second_moments());
  const auto scaler = r.train.scaler().snapshot();
  const int taken = r.opt.steps_taken();

  const auto s = r.step();
  CHECK_FALSE(s.applied);
  CHECK_FALSE(std::isfinite(s.grad_norm));
  CHECK(std::memcmp(weights.data(), p.weights_data(), weights.size() * sizeof(T)) == 0);  // untouched
  CHECK(copy<float>(r.opt.master_weights()) == master);
  CHECK(copy<float>(r.opt.first_moments()) == m1);
  CHECK(copy<float>(r.opt.second_moments()) == m2);
  CHECK(r.opt.steps_taken() == taken);
  CHECK(r.train.steps() == 2);  // the step is counted, as an fp16 overflow's always was
  if (r.train.scaler().enabled()) {
    CHECK(r.train.scaler().scale() == scaler.scale / 2);
    CHECK(r.train.scaler().skipped_steps() == scaler.skipped + 1);
    CHECK(r.train.nonfinite_steps_in_a_row() == 0);  // a smaller scale may still help
  } else {
    CHECK(r.train.scaler().scale() == 1.0);
    CHECK(r.train.scaler().skipped_steps() == 0);
    CHECK(r.train.nonfinite_steps_in_a_row() == 1);
  }

  // Mended, the next step is taken.
  p.weights_data()[at] = good;
  CHECK(r.step().applied);
  CHECK(r.opt.steps_taken() == taken + 1);
  CHECK(r.train.nonfinite_steps_in_a_row() == 0);

  // Broken for good: fp32 and bf16 stop at the third such step in a row; fp16 first backs off to
  // its minimum scale (2 -> 1: the one overflow above left 2), then stops at the third step there.
  p.weights_data()[at] = st::convert<T>(std::numeric_limits<double>::quiet_NaN());
  int skipped = 0;
  std::string stopped;
  try {
    for (int i = 0; i < 20; ++i) {
      const bool applied = r.step().applied;  // outside CHECK, which would catch the stop
      CHECK_FALSE(applied);
      ++skipped;
    }
  } catch (const st::error& e) { stopped = e.what(); }
  CHECK(stopped.find("3 steps in a row") != std::string::npos);
  CHECK(stopped.find("non-finite gradient norm") != std::string::npos);
  CHECK(skipped == (r.train.scaler().enabled() ? 1 + 2 : 2));
  if (r.train.scaler().enabled()) CHECK(stopped.find("at the minimum loss scale") != std::string::npos);
  for (std::int64_t i = 0; i < p.size(); ++i)
    if (std::size_t(i) != at) REQUIRE(std::isfinite(st::convert<double>(p.weights_data()[i])));
}

TEST_CASE("a loss scale of 0, negative or not finite is never restored; with scaling off only 1 is") {
  st::loss_scaler fp16({.enabled = true});
  st::loss_scaler fp32({.enabled = false});
  for (const double bad :
       {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    CHECK_THROWS_WITH_AS(fp16.restore({bad, 0, 0}), doctest::Contains("must be positive and finite"), st::error);
    CHECK_THROWS_WITH_AS(fp32.restore({bad, 0, 0}), doctest::Contains("must be positive and finite"), st::error);
  }
  CHECK_THROWS_WITH_AS(fp32.restore({2.0, 0, 0}), doctest::Contains("into a precision without loss scaling"),
                       st::error);
  CHECK_THROWS_WITH_AS(fp16.restore({2.0, -1, 0}), doctest::Contains("neither can be negative"), st::error);
  fp16.restore({2.0, 3, 1});
  CHECK(fp16.scale() == 2.0);
  run<P32> r;
  CHECK_THROWS_WITH_AS(r.train.resume_at(3, {0.0, 0, 0}), doctest::Contains("loss scale of 0"), st::error);
}

// ---- every manifest value is checked ----

TEST_CASE("a manifest value out of range, of the wrong type or disagreeing with its directory is refused by name") {
  const std::string dir = scratch("manifest");
  run<P32> r;
  auto ck = r.checkpointer(dir);
  r.step();
  r.step();
  const std::string step_dir = r.save(ck);
  const std::string path = step_dir + "/manifest.json";
  const auto original = nlohmann::json::parse(slurp(path));
  CHECK_NOTHROW(cf::read_manifest(step_dir));
  CHECK(original.at("run").is_string());

  using json = nlohmann::json;
  struct edit {
    const char* pointer;
    json value;  // null with `remove`: the field is taken out
    const char* says;
    bool remove = false;
  };
  const std::vector<edit> edits = {
      {"/step", 7, "step is 7, but its directory is that of step 2"},
      {"/step", 4294967298ull, "step is 4294967298; expected a whole number from 0 to 2147483647"},
      {"/step", -1, "step is -1"},
      {"/step", "2", "step is \"2\""},
      {"/step", 2.5, "step is 2.5"},
      {"/loss_scaler/scale", 0, "loss_scaler.scale is 0; expected a positive finite number"},
      {"/loss_scaler/scale", -4.0, "loss_scaler.scale is -4.0"},
      {"/loss_scaler/scale", nullptr, "loss_scaler.scale is null"},
      {"/loss_scaler/scale", "1", "loss_scaler.scale is \"1\""},
      {"/loss_scaler/scale", nullptr, "has no field loss_scaler.scale", true},
      {"/loss_scaler/clean_steps", -1, "loss_scaler.clean_steps is -1"},
      {"/loss_scaler/clean_steps", 4294967296ull, "loss_scaler.clean_steps is 4294967296"},
      {"/loss_scaler/skipped", 3, "loss_scaler.skipped is 3; expected a whole number from 0 to 2"},
      {"/optimizer/steps", 3, "optimizer.steps is 3; expected a whole number from 0 to 2"},
      {"/optimizer", nullptr, "has no field optimizer", true},
      {"/data/seed", -1, "data.seed is -1"},
      {"/data/position", 1.5, "data.position is 1.5"},
      {"/model", 3, "model is 3; expected an object"},
      {"/run", 5, "run is 5; expected a run id"},
      {"/files", json::array(), "files is []"},
      {"/files/0/name", "../rank-00000.safetensors", "files[0].name is \"../rank-00000.safetensors\""},
      {"/files/0/rank", 1, "files[0].rank is 1"},
      {"/files/0/bytes", -5, "files[0].bytes is -5"},
      {"/files/0/crc32", "xyz", "files[0].crc32 is \"xyz\""},
  };
  for (const auto& e : edits) {
    CAPTURE(e.pointer);
    json m = original;
    if (e.remove) m.at(json::json_pointer(e.pointer).parent_pointer()).erase(json::json_pointer(e.pointer).back());
    else m[json::json_pointer(e.pointer)] = e.value;
    write_manifest(step_dir, m);
    CHECK_THROWS_WITH_AS(cf::read_manifest(step_dir), doctest::Contains(("checkpoint manifest '" + path).c_str()),
                         st::error);
    CHECK_THROWS_WITH_AS(cf::read_manifest(step_dir), doctest::Contains(e.says), st::error);
    // resume passes it over, and with nothing else there refuses rather than starting over
    run<P32> b;
    auto ckb = b.checkpointer(dir);
    CHECK_THROWS_WITH_AS(ckb.resume(b.state()), doctest::Contains("none of the 1 checkpoints"), st::error);
  }
  write_manifest(step_dir, original);
  run<P32> b;
  auto ckb = b.checkpointer(dir);
  CHECK(ckb.resume(b.state()).has_value());
  // A directory name of a step past int, or of another spelling, is no checkpoint at all.
  CHECK(cf::step_of_name("step-00000002") == 2);
  CHECK(!cf::step_of_name("step-99999999999").has_value());
  CHECK(!cf::step_of_name("step-2").has_value());
  CHECK(!cf::step_of_name("step-0000000x").has_value());
}

// ---- incomplete, damaged, none ----

TEST_CASE("resume: an incomplete attempt is removed and, with nothing complete, the run starts at step 0") {
  const std::string dir = scratch("incomplete");
  {
    run<P32> a;
    auto ck = a.checkpointer(dir);
    a.step();
    a.save(ck);                                      // step 1: run.json and a complete checkpoint
    fs::remove(cf::step_dir(dir, 1) + "/COMPLETE");  // as a crash before the marker leaves it
  }
  fs::create_directories(cf::step_dir(dir, 3));
  std::ofstream(cf::step_dir(dir, 3) + "/rank-00000.safetensors.tmp") << "half";  // a crash mid-write
  const auto scan = cf::scan(dir);
  CHECK(!scan.newest.has_value());
  CHECK(scan.incomplete == std::vector<int>{1, 3});
  CHECK(scan.damaged.empty());

  run<P32> b;
  auto ck = b.checkpointer(dir);
  CHECK_FALSE(ck.resume(b.state()).has_value());
  CHECK(cf::steps(dir).empty());  // both removed
  CHECK(fs::exists(dir + "/run.json"));
  b.step();
  b.save(ck);
  CHECK(cf::problem(cf::step_dir(dir, 1)).empty());
}

TEST_CASE("resume: a complete checkpoint that fails to verify is refused, not discarded; incomplete ones stay too") {
  const std::string dir = scratch("damaged");
  run<P32> a;
  auto ck = a.checkpointer(dir);
  a.step();
  a.step();
  a.save(ck);  // step 2, complete
  a.step();
  a.step();
  a.save(ck);  // step 4, then made incomplete
  fs::remove(cf::step_dir(dir, 4) + "/COMPLETE");
  const std::string f2 = cf::step_dir(dir, 2) + "/rank-00000.safetensors";
  fs::resize_file(f2, fs::file_size(f2) - 3);
  const auto scan = cf::scan(dir);
  CHECK(!scan.newest.has_value());
  CHECK(scan.incomplete == std::vector<int>{4});
  REQUIRE(scan.damaged.size() == 1);
  CHECK(scan.damaged[0].find("(truncated)") != std::string::npos);
  CHECK(scan.refused.size() == 2);

  run<P32> b;
  auto ckb = b.checkpointer(dir);
  CHECK_THROWS_WITH_AS(ckb.resume(b.state()), doctest::Contains("none of the 1 checkpoints"), st::error);
  CHECK(cf::steps(dir) == std::vector<int>{2, 4});  // nothing removed

  // With a good one older than an incomplete one, that one loads and the incomplete one goes.
  fs::resize_file(f2, fs::file_size(f2) + 3);
  run<P32> c;
  auto ckc = c.checkpointer(dir);
  CHECK_THROWS(ckc.resume(c.state()));  // the 3 bytes are zeros now: still damaged
  fs::remove_all(cf::step_dir(dir, 2));
  a.save(ck);  // step 4 again, complete; then a crash at step 6 leaves its directory
  fs::create_directories(cf::step_dir(dir, 6));
  run<P32> d;
  auto ckd = d.checkpointer(dir);
  const auto loaded = ckd.resume(d.state());
  REQUIRE(loaded.has_value());
  CHECK(loaded->progress.step == 4);
  CHECK(cf::steps(dir) == std::vector<int>{4});
}

// ---- one directory, one run ----

st::checkpointer probe_checkpointer(const std::string& dir) {
  return st::checkpointer({dir, 0}, st::group_ref(), {{"world", 1}}, {{"d_model", dims{}.d_model}}, 5);
}

TEST_CASE("a checkpoint directory belongs to one run: another is refused before anything is written or deleted") {
  const std::string dir = scratch("identity");
  run<P32> a;
  auto ck = a.checkpointer(dir, 5);
  ck.start_new_run();  // empty: fine
  a.step();
  a.save(ck);
  const auto owner = cf::read_run_file(dir);
  REQUIRE(owner.has_value());
  CHECK(owner->at("seed") == 5);
  const std::string manifest = slurp(cf::step_dir(dir, 1) + "/manifest.json");
  const std::string shard = slurp(cf::step_dir(dir, 1) + "/rank-00000.safetensors");
  const auto unchanged = [&] {
    CHECK(slurp(cf::step_dir(dir, 1) + "/manifest.json") == manifest);
    CHECK(slurp(cf::step_dir(dir, 1) + "/rank-00000.safetensors") == shard);
    CHECK(fs::exists(cf::step_dir(dir, 1) + "/COMPLETE"));
    CHECK(cf::read_run_file(dir)->at("run") == owner->at("run"));
  };

  // The same model and seed, started over: still another run.
  run<P32> b;
  auto ckb = b.checkpointer(dir, 5);
  CHECK_THROWS_WITH_AS(
      ckb.start_new_run(),
      doctest::Contains(("belongs to another run (run " + owner->at("run").get<std::string>()).c_str()), st::error);
  // One that never asked, at its first save (which would have replaced step 1).
  b.step();
  CHECK_THROWS_WITH_AS(b.save(ckb), doctest::Contains("belongs to another run"), st::error);
  unchanged();

  // Resuming with another seed, the checkpoint refuses; with none complete, run.json does.
  run<P32> c;
  auto ckc = c.checkpointer(dir, 6);
  CHECK_THROWS_WITH_AS(ckc.resume(c.state()), doctest::Contains("was trained with seed 5; this run has seed 6"),
                       st::error);
  unchanged();
  fs::remove(cf::step_dir(dir, 1) + "/COMPLETE");
  CHECK_THROWS_WITH_AS(
      ckc.resume(c.state()),
      doctest::Contains(("belongs to another run (run.json: run " + owner->at("run").get<std::string>() +
                         "): it was trained with seed 5; this run has seed 6")
                            .c_str()),
      st::error);
  CHECK(cf::steps(dir) == std::vector<int>{1});  // the incomplete attempt is left to its run
  st::checkpointer other_model({dir, 0}, st::group_ref(), {{"world", 1}}, {{"d_model", 32}}, 5);
  CHECK_THROWS_WITH_AS(other_model.resume(c.state()),
                       doctest::Contains("it is of another model: d_model 16 there, 32 here"), st::error);
  CHECK(cf::steps(dir) == std::vector<int>{1});

  // The run itself resumes (under any layout: not part of the identity), keeps its id, saves.
  run<P32> d;
  st::checkpointer ckd({dir, 0}, st::group_ref(), {{"world", 4}, {"tp", 4}}, {{"d_model", dims{}.d_model}}, 5);
  CHECK_FALSE(ckd.resume(d.state()).has_value());
  d.step();
  d.save(ckd);
  CHECK(cf::read_run_file(dir)->at("run") == owner->at("run"));
  CHECK(nlohmann::json::parse(slurp(cf::step_dir(dir, 1) + "/manifest.json")).at("run") == owner->at("run"));

  // A run.json that is not one is refused, naming it (and nested deep, before it is built).
  st::write_file_durably(dir + "/run.json", std::string(100000, '['));
  CHECK_THROWS_WITH_AS(probe_checkpointer(dir).start_new_run(),
                       doctest::Contains("run.json' nests deeper than 16 levels"), st::error);
  st::write_file_durably(dir + "/run.json", std::string("{\"format\": \"strata-run\", \"run\": 7}"));
  CHECK_THROWS_WITH_AS(probe_checkpointer(dir).start_new_run(),
                       doctest::Contains("run.json': run is missing or not a run id"), st::error);

  // Checkpoints with no run.json (an older strata's) are another run's too, to a fresh start.
  fs::remove(dir + "/run.json");
  run<P32> e;
  auto cke = e.checkpointer(dir, 5);
  CHECK_THROWS_WITH_AS(cke.start_new_run(),
                       doctest::Contains("already holds checkpoints of another run (step-00000001, no run.json)"),
                       st::error);
}
