// Checkpoints on one rank: a save/load round trip restores every tensor bit for bit and the run
// continues with the same losses; damaged, incomplete and foreign checkpoints are refused by
// name; --keep prunes; the fault-injection spec is parsed strictly.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <strata/parallel/sequential_model.hpp>
#include <strata/train/checkpoint.hpp>
#include <strata/train/corpus.hpp>
#include <strata/train/trainer.hpp>

#include "counting_space.hpp"
#include "strata/models/gpt2.hpp"

namespace st = strata;
namespace fs = std::filesystem;

namespace {

using P32 = st::policy<st::host, st::serial, st::fp32>;
using PFP16 = st::policy<st::host, st::serial, st::mixed<st::fp16, float>>;
const strata::models::gpt2::dims tiny{.vocab = 256, .seq = 16, .layers = 2, .heads = 2, .d_model = 32};

// A fresh scratch directory under the build tree.
std::string scratch(const std::string& name) {
  const auto dir = fs::current_path() / ("checkpoint_test_" + name);
  fs::remove_all(dir);
  return dir.string();
}

// One training run: model, optimizer, trainer and data, with a checkpointer on `dir`.
template <class P>
struct run {
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P>> model{ledger, tiny, st::seed{3}};
  st::adamw<P> opt{model, {.lr = 3e-3}};
  st::trainer<st::sequential_model<strata::models::gpt2::model<P>>, st::adamw<P>> train;
  st::token_stream data{st::byte_tokens(st::generate_corpus(20000)), 11};
  st::checkpointer ckpt;
  explicit run(const std::string& dir, int keep = 0, const st::memory_space* space = nullptr)
      : ledger(space ? *space : st::host_memory()),
        train(model, opt, options()),
        ckpt({dir, keep}, st::group_ref(), {{"world", 1}}, {{"layers", tiny.layers}, {"d_model", tiny.d_model}}) {}
  run(const std::string& dir, int keep, const st::memory_space& space) : run(dir, keep, &space) {}
  static st::trainer_options options() {
    st::trainer_options o;
    o.schedule = {3e-3, 3e-4, 2, 10};
    o.initial_loss_scale = 1024;
    return o;
  }
  st::train_state_ref<P> state() { return {model.parameters(), opt, {}}; }
  double step() { return train.step(data.next_batch(4, tiny.seq)).loss; }
  std::string save() {
    return ckpt.save(
        st::train_progress{train.steps(), opt.steps_taken(), train.scaler().snapshot(), data.seed(), data.position()},
        state());
  }
  bool resume() {
    const auto loaded = ckpt.resume(state());
    if (!loaded) return false;
    train.resume_at(loaded->progress.step, loaded->progress.scaler);
    data.seek(loaded->progress.data_position);
    return true;
  }
};

template <class T>
std::vector<T> copy(std::span<const T> s) {
  return {s.begin(), s.end()};
}

void flip_byte(const std::string& path, std::size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE_TEMPLATE("checkpoint: save then load restores every tensor bit for bit, and the losses continue", P, P32,
                   PFP16) {
  const std::string dir = scratch("roundtrip");
  run<P> a(dir);
  for (int i = 0; i < 3; ++i) a.step();
  const std::string saved = a.save();
  CHECK(fs::exists(fs::path(saved) / "COMPLETE"));
  std::vector<double> later;
  for (int i = 0; i < 3; ++i) later.push_back(a.step());

  run<P> b(dir);  // another seed would do too: everything comes from the checkpoint
  REQUIRE(b.resume());
  CHECK(b.train.steps() == 3);
  CHECK(b.opt.steps_taken() == 3);
  CHECK(b.data.position() == 3);
  // Compare against a third run that stops at step 3 and is never saved or loaded.
  run<P> c(scratch("reference"));
  for (int i = 0; i < 3; ++i) c.step();
  using T = typename P::storage;
  auto& pb = b.model.parameters();
  auto& pc = c.model.parameters();
  CHECK(std::memcmp(pb.weights_data(), pc.weights_data(), sizeof(T) * std::size_t(pb.size())) == 0);
  CHECK(copy<float>(b.opt.first_moments()) == copy<float>(c.opt.first_moments()));
  CHECK(copy<float>(b.opt.second_moments()) == copy<float>(c.opt.second_moments()));
  CHECK(copy<float>(b.opt.master_weights()) == copy<float>(c.opt.master_weights()));
  CHECK(b.train.scaler().scale() == c.train.scaler().scale());
  for (int i = 0; i < 3; ++i) CHECK(b.step() == later[std::size_t(i)]);  // exactly
}

TEST_CASE(
    "checkpoint: a truncated, bit-flipped or incomplete checkpoint is refused by name; resume takes the one before") {
  const std::string dir = scratch("damaged");
  run<P32> a(dir);
  for (int s = 1; s <= 4; ++s) {
    a.step();
    a.save();
  }
  namespace cf = st::checkpoint_files;
  CHECK(cf::steps(dir) == std::vector<int>{1, 2, 3, 4});
  CHECK(cf::problem(cf::step_dir(dir, 4)).empty());

  const std::string f4 = cf::step_dir(dir, 4) + "/rank-00000.safetensors";
  flip_byte(f4, fs::file_size(f4) / 2);
  const std::string f3 = cf::step_dir(dir, 3) + "/rank-00000.safetensors";
  fs::resize_file(f3, fs::file_size(f3) - 5);
  fs::remove(cf::step_dir(dir, 2) + "/COMPLETE");
  CHECK(cf::problem(cf::step_dir(dir, 4)).find("'" + f4 + "' has CRC-32") != std::string::npos);
  CHECK(cf::problem(cf::step_dir(dir, 4)).find("(corrupt)") != std::string::npos);
  CHECK(cf::problem(cf::step_dir(dir, 3)).find("'" + f3 + "' has") != std::string::npos);
  CHECK(cf::problem(cf::step_dir(dir, 3)).find("(truncated)") != std::string::npos);
  CHECK(cf::problem(cf::step_dir(dir, 2)).find("is incomplete (no COMPLETE marker") != std::string::npos);

  const auto scan = cf::scan(dir);
  REQUIRE(scan.newest.has_value());
  CHECK(*scan.newest == 1);
  CHECK(scan.refused.size() == 3);

  run<P32> b(dir);
  REQUIRE(b.resume());
  CHECK(b.train.steps() == 1);

  // Loading a damaged one directly is an error naming the file.
  run<P32> c(dir);
  CHECK_THROWS_WITH_AS(c.ckpt.load(cf::step_dir(dir, 4), c.state()), doctest::Contains(f4.c_str()), st::error);
}

TEST_CASE("checkpoint: a checkpoint of another model is refused, naming the field") {
  const std::string dir = scratch("foreign");
  run<P32> a(dir);
  a.step();
  a.save();
  st::memory_ledger ledger;
  st::sequential_model<strata::models::gpt2::model<P32>> model(ledger, tiny, st::seed{3});
  st::adamw<P32> opt(model, {});
  st::checkpointer other({dir, 0}, st::group_ref(), {}, {{"layers", 5}, {"d_model", tiny.d_model}});
  CHECK_THROWS_WITH_AS(other.resume(st::train_state_ref<P32>{model.parameters(), opt, {}}),
                       doctest::Contains("is of another model: layers 2 there, 5 here"), st::error);
}

TEST_CASE("checkpoint: keep = 2 leaves the two newest complete checkpoints and no stale ones") {
  const std::string dir = scratch("keep");
  run<P32> a(dir, 2);
  for (int s = 1; s <= 5; ++s) {
    a.step();
    a.save();
  }
  CHECK(st::checkpoint_files::steps(dir) == std::vector<int>{4, 5});
}

TEST_CASE("checkpoint: a stale half-written attempt at the same step is replaced") {
  const std::string dir = scratch("stale");
  run<P32> a(dir);
  a.step();
  const std::string d = st::checkpoint_files::step_dir(dir, 1);
  fs::create_directories(d);
  std::ofstream(d + "/rank-00007.safetensors.tmp") << "half";
  a.save();
  CHECK(!fs::exists(d + "/rank-00007.safetensors.tmp"));
  CHECK(st::checkpoint_files::problem(d).empty());
}

TEST_CASE("fault injection: the spec is parsed strictly") {
  const auto a = st::fault_injection::parse("kill-at-step:7");
  CHECK(a.kill_at_step == 7);
  CHECK(a.kill_during_save == -1);
  CHECK(a.targets(3, 4));
  CHECK(!a.targets(0, 4));
  const auto b = st::fault_injection::parse("kill-during-save:6@1");
  CHECK(b.kill_during_save == 6);
  CHECK(b.targets(1, 4));
  CHECK(!b.targets(3, 4));
  CHECK(!st::fault_injection::parse("").armed());
  for (const char* bad :
       {"kill-at-step", "kill-at-step:", "kill-at-step:x", "kill-at-stp:3", "kill-at-step:3@", "kill-at-step:-2"})
    CHECK_THROWS_WITH_AS(st::fault_injection::parse(bad),
                         doctest::Contains((std::string("STRATA_FAULT='") + bad + "'").c_str()), st::error);
}

TEST_CASE("durable files: whole or absent, and CRC-32 matches the standard check value") {
  const std::string s = "123456789";
  CHECK(st::crc32_of({reinterpret_cast<const unsigned char*>(s.data()), s.size()}) == 0xCBF43926u);
  const std::string dir = scratch("durable");
  fs::create_directories(dir);
  st::write_file_durably(dir + "/f", std::string("hello"));
  CHECK(st::read_whole_file(dir + "/f").size() == 5);
  CHECK(!fs::exists(dir + "/f.tmp"));
  CHECK_THROWS_WITH_AS(st::read_whole_file(dir + "/missing"), doctest::Contains((dir + "/missing").c_str()), st::error);
}

TEST_CASE("checkpoint: a model in another memory space (as on a GPU) saves through it and loads on the host") {
  const std::string dir = scratch("space");
  auto& counts = strata_test::counts;
  counts = {};
  std::vector<double> later;
  {
    run<PFP16> device(dir, 0, strata_test::counting_space());
    for (int i = 0; i < 2; ++i) device.step();
    const long downloads = counts.downloads;
    device.save();
    CHECK(counts.downloads > downloads);  // every piece came back through the space
    for (int i = 0; i < 2; ++i) later.push_back(device.step());
  }
  run<PFP16> host(dir);
  REQUIRE(host.resume());
  for (int i = 0; i < 2; ++i) CHECK(host.step() == later[std::size_t(i)]);  // exactly
  run<PFP16> back(scratch("space_unused"), 0, strata_test::counting_space());
  const long uploads = counts.uploads;
  const auto loaded = back.ckpt.load(st::checkpoint_files::step_dir(dir, 2), back.state());
  back.train.resume_at(loaded.progress.step, loaded.progress.scaler);
  back.data.seek(loaded.progress.data_position);
  CHECK(counts.uploads > uploads);  // and loading puts them back through it
  for (int i = 0; i < 2; ++i) CHECK(back.step() == later[std::size_t(i)]);
}
