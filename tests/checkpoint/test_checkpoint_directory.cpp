// A checkpoint directory under misuse (issue 35), in one process:
//   - a write that fails (a full disk) takes its temporary file with it;
//   - resume clears the unfinished saves a crash left before it writes anything (its write test);
//   - the directory's lock is this process's while a checkpointer lives, shared by its
//     checkpointers, and its holder line is gone after;
//   - each checkpoint records the run's training settings, and resume refuses a change that
//     alters a step both the saved run and this one take, unless allowed.
// The second process and the ranks are tests/checkpoint/two_writers.sh's.
#include <doctest/doctest.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
#include <strata/train/run_settings.hpp>
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

std::string scratch(const std::string& name) {
  const auto dir = fs::current_path() / ("checkpoint_directory_" + name);
  fs::remove_all(dir);
  return dir.string();
}
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct run {
  st::memory_ledger ledger;
  st::sequential_model<tiny_model<P32>> model{ledger, dims{}, st::seed{5}};
  st::adamw_options adamw{.lr = 1e-2};
  st::adamw<P32> opt{model, adamw};
  st::trainer_options options = trainer_options(adamw.lr);
  st::trainer<st::sequential_model<tiny_model<P32>>, st::adamw<P32>> train{model, opt, options};
  st::token_stream data{st::byte_tokens(st::generate_corpus(5000)), 7};

  static st::trainer_options trainer_options(double lr) {
    st::trainer_options o;
    o.schedule = {lr, lr / 10, 0, 50};
    return o;
  }
  st::train_state_ref<P32> state() { return {model.parameters(), opt, {}}; }
  // The checkpointer of this run, recording its settings (as gpt2_train does).
  st::checkpointer checkpointer(const std::string& dir, const st::training_settings& s, bool allow = false) {
    return st::checkpointer({dir, 0, s, allow}, st::group_ref(), {{"world", 1}}, {{"d_model", dims{}.d_model}}, 5);
  }
  st::checkpointer checkpointer(const std::string& dir) { return checkpointer(dir, st::settings_of(adamw, options)); }
  std::string save(st::checkpointer& c) {
    return c.save(st::train_progress{train.steps(), opt.steps_taken(), train.scaler().snapshot(), 5, data.position()},
                  state());
  }
  void step() { train.step(data.next_batch(2, dims{}.seq)); }
};

// A new run in `dir` that takes one step and saves it, recording `s`.
void save_one_step(const std::string& dir, const st::training_settings& s) {
  run a;
  auto ck = a.checkpointer(dir, s);
  ck.start_new_run();
  a.step();
  a.save(ck);
}
void save_one_step(const std::string& dir) {
  save_one_step(dir, st::settings_of({.lr = 1e-2}, run::trainer_options(1e-2)));  // run's own
}

}  // namespace

TEST_CASE("a durable write that fails takes its temporary file with it") {
  const std::string dir = scratch("failed_write");
  fs::create_directories(dir);
  const std::string path = dir + "/file";
  st::write_file_durably(path, std::string("old contents\n"));
  // `room` 3: the disk fills after 3 bytes.
  CHECK_THROWS_WITH_AS(st::write_file_durably(path, std::string("new contents\n"), 3),
                       doctest::Contains("No space left on device"), st::error);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(slurp(path) == "old contents\n");  // the old file, whole
}

TEST_CASE("resume clears what a crash left before it writes anything (its write test)") {
  const std::string dir = scratch("cleanup_first");
  save_one_step(dir);
  fs::create_directories(cf::step_dir(dir, 3));  // a save a crash (or a full disk) cut short
  std::ofstream(cf::step_dir(dir, 3) + "/rank-00000.safetensors.tmp") << "half";

  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(watch >= 0);
  REQUIRE(::inotify_add_watch(watch, dir.c_str(), IN_CREATE | IN_DELETE | IN_MOVED_TO) >= 0);
  run b;
  auto ck = b.checkpointer(dir);
  const auto loaded = ck.resume(b.state());
  REQUIRE(loaded.has_value());
  CHECK(loaded->progress.step == 1);
  // The directory's events in order: what was created, what deleted.
  std::vector<std::string> events;
  alignas(inotify_event) char buf[8192];
  for (ssize_t n; (n = ::read(watch, buf, sizeof buf)) > 0;)
    for (char* p = buf; p < buf + n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(p);
      events.push_back(std::string(e->mask & IN_DELETE ? "delete " : "create ") + (e->len ? e->name : ""));
      p += sizeof(inotify_event) + e->len;
    }
  ::close(watch);
  CAPTURE(events.size());
  std::size_t removed = events.size(), first_write = events.size();
  for (std::size_t i = 0; i < events.size(); ++i) {
    CAPTURE(events[i]);
    if (events[i] == "delete step-00000003") removed = std::min(removed, i);
    if (events[i].rfind("create ", 0) == 0) first_write = std::min(first_write, i);
  }
  REQUIRE(removed < events.size());
  REQUIRE(first_write < events.size());  // the write test did run
  CHECK(removed < first_write);
  CHECK(cf::steps(dir) == std::vector<int>{1});
}

TEST_CASE("the directory's lock is this process's while a checkpointer lives, and says who holds it") {
  const std::string dir = scratch("lock");
  const std::string lock = dir + "/" + st::directory_lock::file_name;
  {
    run a;
    auto one = a.checkpointer(dir);
    const std::string holder = "host " + st::directory_lock::host_name() + "\npid " + std::to_string(::getpid()) + "\n";
    CHECK(slurp(lock) == holder);
    auto two = a.checkpointer(dir);  // the same process: shares it
    one.start_new_run();
    two.start_new_run();
    CHECK(slurp(lock) == holder);
  }
  CHECK(fs::exists(lock));
  CHECK(slurp(lock).empty());  // no holder now
  // No write-test probe stays behind.
  for (const auto& e : fs::directory_iterator(dir))
    CHECK(e.path().filename().string().rfind(".strata-write-test", 0) != 0);
}

TEST_CASE("a checkpoint records its training settings; resume refuses a change to the steps unless allowed") {
  const std::string dir = scratch("settings");
  save_one_step(dir);
  const auto manifest = nlohmann::json::parse(slurp(cf::step_dir(dir, 1) + "/manifest.json"));
  CHECK(manifest.at("settings").at("lr") == 1e-2);
  CHECK(manifest.at("settings").at("total_steps") == 50);

  run b;
  st::training_settings other = st::settings_of({.lr = 2e-2}, run::trainer_options(2e-2));
  CHECK_THROWS_WITH_AS(b.checkpointer(dir, other).resume(b.state()),
                       doctest::Contains("(lr: 0.01 -> 0.02, min_lr: 0.001 -> 0.002), so the run would not continue"),
                       st::error);
  CHECK(cf::steps(dir) == std::vector<int>{1});
  // Allowed, it goes on.
  CHECK(b.checkpointer(dir, other, true).resume(b.state()).has_value());
  // A setting that leaves the steps as they were needs no leave.
  st::trainer_options limit = run::trainer_options(1e-2);
  limit.nonfinite_step_limit = 3;
  CHECK(b.checkpointer(dir, st::settings_of({.lr = 1e-2}, limit)).resume(b.state()).has_value());

  // A run that reached the end it planned ("steps") may be trained on for longer: only its length
  // changes. Any other change with steps to take is refused; one taking no step (an export) is not.
  const std::string done = scratch("settings_done");
  st::training_settings planned = st::settings_of({.lr = 1e-2}, run::trainer_options(1e-2));
  planned.values[st::planned_steps] = 1;
  save_one_step(done, planned);
  st::training_settings longer = planned;
  longer.values[st::planned_steps] = 5;
  CHECK(b.checkpointer(done, longer).resume(b.state()).has_value());
  other.values[st::planned_steps] = 1;
  CHECK(b.checkpointer(done, other).resume(b.state()).has_value());
  other.values[st::planned_steps] = 5;
  CHECK_THROWS_WITH_AS(b.checkpointer(done, other).resume(b.state()), doctest::Contains("lr: 0.01 -> 0.02"), st::error);
  const std::string unfinished = scratch("settings_unfinished");
  planned.values[st::planned_steps] = 5;
  save_one_step(unfinished, planned);
  CHECK_THROWS_WITH_AS(b.checkpointer(unfinished, other).resume(b.state()), doctest::Contains("lr: 0.01 -> 0.02"),
                       st::error);

  // Numbers compare by value; a setting recorded on one side only is listed, not refused.
  st::training_settings now;
  now.values = {{"batch", 16.0}, {"new", 1}};
  const auto changes = st::compare_settings({{"batch", 16}, {"old", "x"}}, now);
  REQUIRE(changes.size() == 2);
  CHECK(changes[0].text() == "new: (not recorded) -> 1");
  CHECK(changes[1].text() == "old: \"x\" -> (not recorded)");
  CHECK_FALSE(changes[0].changes_steps);
  CHECK_FALSE(changes[1].changes_steps);
}
