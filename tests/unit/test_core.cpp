// core/, optim/ schedules and train/ data: the ledger, shapes, the sharding-invariant
// initializer, the parameter store, the LR schedule, token shards, metrics lines and the per-op
// profiler.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>

namespace st = strata;
namespace fs = std::filesystem;

TEST_CASE("memory ledger: current and peak bytes per category") {
  st::memory_ledger ledger;
  using mc = st::memory_category;
  {
    st::buffer<float> a(ledger, mc::activations, 100);
    st::buffer<double> b(ledger, mc::optimizer_state, 10);
    CHECK(ledger.current(mc::activations) == 400);
    CHECK(ledger.current(mc::optimizer_state) == 80);
    st::buffer<float> moved = std::move(a);  // moving keeps one charge
    CHECK(ledger.current(mc::activations) == 400);
    CHECK(moved[99] == 0.0f);  // zero-initialised
  }
  CHECK(ledger.current(mc::activations) == 0);
  CHECK(ledger.peak(mc::activations) == 400);
  CHECK(ledger.total_peak() == 480);
  ledger.reset_peaks();
  CHECK(ledger.peak(mc::activations) == 0);
  CHECK_THROWS_WITH_AS(ledger.release(mc::gradients, 8), doctest::Contains("releasing 8 bytes of gradients"),
                       st::error);
}

TEST_CASE("buffers made uninitialized skip the zeroing; the emulated device fills them with NaN") {
  using mc = st::memory_category;
  {  // host memory: a reused block keeps what it held, a zeroed buffer is zeros again
    st::memory_ledger ledger;
    constexpr std::size_t n = std::size_t(1) << 17;  // 512 KiB: a block the host keeps for reuse
    {
      st::buffer<float> a(ledger, mc::activations, n);
      for (std::size_t i = 0; i < n; ++i) a[i] = 1.0f;
    }
    st::buffer<float> b(ledger, mc::activations, n, st::uninitialized);
    CHECK(ledger.current(mc::activations) == n * sizeof(float));
    CHECK(b[0] == 1.0f);  // the same block, not zeroed
    b = st::buffer<float>();
    st::buffer<float> c(ledger, mc::activations, n);
    CHECK(c[n - 1] == 0.0f);
  }
  {  // the emulated device: every byte all ones, NaN in every floating type
    st::memory_ledger ledger(st::emulated_device_memory());
    const long before = st::emulated_memory_stats().allocations;
    st::buffer<float> f(ledger, mc::activations, 7, st::uninitialized);
    st::buffer<st::bf16> h(ledger, mc::activations, 5, st::uninitialized);
    CHECK(st::emulated_memory_stats().allocations == before + 2);
    for (std::size_t i = 0; i < 7; ++i) CHECK(std::isnan(f[i]));
    for (std::size_t i = 0; i < 5; ++i) CHECK(std::isnan(float(h[i])));
    st::buffer<float> z(ledger, mc::activations, 7);
    for (std::size_t i = 0; i < 7; ++i) CHECK(z[i] == 0.0f);
  }
}

TEST_CASE("shapes: equality, numel and the mismatch message") {
  st::shape s{2, 3, 4};
  CHECK(s.numel() == 24);
  CHECK(s.str() == "[2, 3, 4]");
  std::vector<float> d(24);
  st::tensor_view<float> v{d.data(), s};
  CHECK_NOTHROW(st::check_shape(v, {2, 3, 4}, "test"));
  CHECK_THROWS_WITH_AS(st::check_shape(v, {2, 12}, "layer x"), "layer x: expected shape [2, 12], got [2, 3, 4]",
                       st::error);
}

TEST_CASE("initializer: a value depends only on (seed, parameter, global index)") {
  const auto id = st::parameter_id("h.0.attn.qkv.weight");
  CHECK(id != st::parameter_id("h.1.attn.qkv.weight"));
  // A shard [a, b) computed alone equals the same range of the whole tensor.
  std::vector<double> whole(1000);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = st::counter_normal(42, id, i);
  for (std::size_t i = 600; i < 700; ++i) CHECK(st::counter_normal(42, id, i) == whole[i]);
  // Roughly standard normal.
  double mean = 0, var = 0;
  for (double x : whole) mean += x;
  mean /= double(whole.size());
  for (double x : whole) var += (x - mean) * (x - mean);
  var /= double(whole.size());
  CHECK(std::abs(mean) < 0.1);
  CHECK(std::abs(var - 1.0) < 0.1);
  CHECK(st::counter_normal(43, id, 5) != st::counter_normal(42, id, 5));
}

TEST_CASE("parameter store: flat layout, names, init and errors") {
  st::memory_ledger ledger;
  st::parameter_store<float> store(ledger, st::seed{7});
  auto w = store.add("w", {3, 4}, st::init_rule::normal_with_std(0.02), true);
  auto b = store.add("b", {4}, st::init_rule::ones(), false);
  CHECK_THROWS_WITH_AS(store.add("w", {2}, st::init_rule::zeros(), false), doctest::Contains("'w' registered twice"),
                       st::error);
  CHECK(store.size() == 16);
  CHECK(store.info(b).offset == 12);
  CHECK(store.weights(b)[3] == 1.0f);
  CHECK(store.weights(w)[5] == float(0.02 * st::counter_normal(7, st::parameter_id("w"), 5)));
  CHECK(ledger.current(st::memory_category::parameters) == 64);
  CHECK_THROWS_WITH_AS(store.add("late", {1}, st::init_rule::zeros(), false), doctest::Contains("after the parameters"),
                       st::error);
}

TEST_CASE("warm-up + cosine schedule") {
  st::warmup_cosine s{1.0, 0.1, 10, 110};
  CHECK(s(0) == doctest::Approx(0.1));
  CHECK(s(9) == doctest::Approx(1.0));
  CHECK(s(10) == doctest::Approx(1.0));
  CHECK(s(60) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 50.0 / 99.0))));
  CHECK(s(109) == doctest::Approx(0.1));
  CHECK(s(500) == doctest::Approx(0.1));
  CHECK_THROWS_WITH_AS((st::warmup_cosine{1.0, 2.0, 0, 10}.validate()), doctest::Contains("min_lr (2)"), st::error);
  CHECK_THROWS_WITH_AS((st::warmup_cosine{1.0, 0.1, 20, 10}.validate()), doctest::Contains("warmup_steps (20)"),
                       st::error);
}

TEST_CASE("gradient clipping coefficient") {
  CHECK(st::clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(st::clip_coefficient(4.0, 1.0) == doctest::Approx(0.25));
  CHECK(st::clip_coefficient(4.0, 0.0) == 1.0);  // off
}

namespace {
struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("strata_core_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};
}  // namespace

TEST_CASE("token shards: llm.c and headerless formats, globbing, and every corruption named") {
  temp_dir dir;
  std::vector<std::uint16_t> a{1, 2, 3, 4, 5}, b{6, 7, 8};
  st::write_token_shard(dir.file("train_000.bin"), a);
  {
    std::ofstream raw(dir.file("train_001.bin"), std::ios::binary);  // nanoGPT: headerless
    raw.write(reinterpret_cast<const char*>(b.data()), 6);
  }
  CHECK(st::read_token_shard(dir.file("train_000.bin"), 10) == a);
  CHECK(st::read_token_shard(dir.file("train_001.bin"), 10) == b);
  auto stream = st::token_stream::from_glob(dir.file("train_*.bin"), 10, 1);
  CHECK(stream.size() == 8);
  auto batch = stream.next_batch(2, 3);
  for (std::size_t i = 0; i < batch.inputs.size(); ++i) CHECK(batch.targets[i] == batch.inputs[i] + 1);

  CHECK_THROWS_WITH_AS(st::read_token_shard(dir.file("train_000.bin"), 5),
                       doctest::Contains("token 5 at byte offset 1032 is out of range for vocab 5"), st::error);
  CHECK_THROWS_WITH_AS(st::read_token_shard(dir.file("missing.bin"), 10), doctest::Contains("missing.bin"), st::error);
  CHECK_THROWS_WITH_AS(st::token_stream::from_glob(dir.file("nothing_*.bin"), 10, 1),
                       doctest::Contains("no token shard matches"), st::error);
  fs::resize_file(dir.file("train_000.bin"), 1024 + 7);  // truncated mid-token
  CHECK_THROWS_WITH_AS(st::read_token_shard(dir.file("train_000.bin"), 10),
                       doctest::Contains("promises 5 tokens (1034 bytes) but the file has 1031 bytes"), st::error);
  {
    std::ofstream odd(dir.file("odd.bin"), std::ios::binary);
    odd.write("abc", 3);
  }
  CHECK_THROWS_WITH_AS(st::read_token_shard(dir.file("odd.bin"), 1000),
                       doctest::Contains("3 bytes is not a whole number of uint16 tokens"), st::error);
  {
    std::vector<std::int32_t> header(256, 0);
    header[0] = st::llmc_shard_magic;
    header[1] = 9;
    std::ofstream bad(dir.file("version.bin"), std::ios::binary);
    bad.write(reinterpret_cast<const char*>(header.data()), 1024);
  }
  CHECK_THROWS_WITH_AS(st::read_token_shard(dir.file("version.bin"), 10),
                       doctest::Contains("header version 9 at offset 4"), st::error);
}

TEST_CASE("generated corpus and batches are deterministic") {
  auto text = st::generate_corpus(5000);
  CHECK(text == st::generate_corpus(5000));
  CHECK(text.size() >= 5000);
  CHECK(text.substr(0, 1) != " ");
  st::token_stream s1(st::byte_tokens(text), 3), s2(st::byte_tokens(text), 3);
  CHECK(s1.next_batch(4, 16).inputs == s2.next_batch(4, 16).inputs);
  CHECK(s1.next_batch(4, 16).inputs != s1.next_batch(4, 16).inputs);
}

TEST_CASE("sequential data order walks the stream window by window; seek resumes anywhere") {
  std::vector<std::uint16_t> tokens(100);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i);
  st::token_stream s(tokens, 9, st::data_order::sequential);
  const auto b0 = s.next_batch(3, 10), b1 = s.next_batch(3, 10);
  // Row r of batch k starts at token (3k + r) * 10; its targets are the next tokens.
  for (int r = 0; r < 3; ++r) {
    CHECK(b0.inputs[std::size_t(r * 10)] == r * 10);
    CHECK(b1.inputs[std::size_t(r * 10)] == 30 + r * 10);
    CHECK(b0.targets[std::size_t(r * 10 + 9)] == r * 10 + 10);
  }
  CHECK(s.next_batch(3, 10).inputs[20] == 80);
  const auto b3 = s.next_batch(3, 10);  // windows 9, 10, 11 wrap past the last start (89)
  CHECK(b3.inputs[0] == 0);
  CHECK(b3.inputs[10] == 10);
  st::token_stream t(tokens, 9, st::data_order::sequential);
  t.seek(1);
  CHECK(t.next_batch(3, 10).inputs == b1.inputs);
  CHECK(st::parse_data_order("shuffled") == st::data_order::shuffled);
  CHECK_THROWS_WITH_AS(st::parse_data_order("random"), "data order 'random' is not one of shuffled, sequential",
                       st::error);
}

TEST_CASE("metrics line carries step, loss, lr, grad_norm, tokens_per_s and bytes per category") {
  st::memory_ledger ledger;
  st::buffer<float> w(ledger, st::memory_category::parameters, 10);
  st::step_result r;
  r.step = 3;
  r.loss = 2.5;
  r.lr = 1e-3;
  r.grad_norm = NAN;
  r.tokens = 100;
  r.seconds = 0.5;
  auto line = st::metrics_line(r, ledger);
  CHECK(line.find("\"step\":3") != std::string::npos);
  CHECK(line.find("\"loss\":2.5") != std::string::npos);
  CHECK(line.find("\"grad_norm\":null") != std::string::npos);  // JSON has no NaN
  CHECK(line.find("\"tokens_per_s\":200") != std::string::npos);
  CHECK(line.find("\"mem\":{\"parameters\":40,") != std::string::npos);
}

namespace {
// Spins on this thread for `seconds` of wall time: CPU time accrues while it runs.
double spin(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  double x = 0;
  while (std::chrono::steady_clock::now() < end) x += 1e-9;
  return x;
}
const st::profiler::row& row_named(const std::vector<st::profiler::row>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (name == r.name) return r;
  FAIL("no profiler row " << name);
  return rows.front();
}
}  // namespace

TEST_CASE("profiler: nested scopes count their own time; wall_and_cpu tells cores in use from waiting") {
  st::profiler::reset();
  st::profiler::enable(st::profiler::clock::wall_and_cpu);
  const double wall0 = st::profiler::now(), cpu0 = st::profiler::cpu_now();
  double sink = 0;
  for (int call = 0; call < 2; ++call) {
    STRATA_PROFILE("outer");
    sink += spin(0.01);
    {
      STRATA_PROFILE("sleeping");  // a thread that waits: wall time, next to no CPU time
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  }
  const double wall = st::profiler::now() - wall0, cpu = st::profiler::cpu_now() - cpu0;
  st::profiler::enable(false);
  CHECK(sink > 0);

  const auto rows = st::profiler::rows();
  REQUIRE(rows.size() == 2);
  const auto& outer = row_named(rows, "outer");
  const auto& sleeping = row_named(rows, "sleeping");
  CHECK(outer.calls == 2);
  CHECK(sleeping.calls == 2);
  CHECK(std::string(rows.front().name) == "sleeping");  // sorted by own time, largest first
  // Own time excludes the nested scope: outer spun 2 x 10 ms, sleeping slept 2 x 30 ms.
  CHECK(sleeping.self_seconds >= 0.06);
  CHECK(outer.self_seconds >= 0.02);
  CHECK(outer.self_seconds < sleeping.self_seconds);
  CHECK(st::profiler::covered_seconds() == doctest::Approx(outer.self_seconds + sleeping.self_seconds));
  // CPU time: the spin runs on this one thread (at most its wall time, with a little slack for
  // the clocks' reads); the sleep takes next to none.
  CHECK(outer.self_cpu_seconds > 0);
  CHECK(outer.self_cpu_seconds <= 1.05 * outer.self_seconds + 1e-3);
  CHECK(sleeping.self_cpu_seconds < 0.2 * sleeping.self_seconds);

  // The table with the two extra columns: cores (CPU over wall) and idle core-ms per step.
  std::ostringstream table;
  st::profiler::report(table, wall, 2, cpu, 2);
  const std::string text = table.str();
  INFO(text);
  CHECK(text.find("cores") != std::string::npos);
  CHECK(text.find("idle core-ms/step") != std::string::npos);
  std::istringstream lines(text);
  std::string line;
  bool found = false;
  while (std::getline(lines, line)) {
    if (line.rfind("sleeping", 0) != 0) continue;
    found = true;
    std::istringstream fields(line.substr(8));
    double calls = 0, ms = 0, cores = 0, idle = 0;
    std::string share;
    fields >> calls >> ms >> share >> cores >> idle;
    CHECK(calls == 1.0);  // per step
    CHECK(ms == doctest::Approx(1000 * sleeping.self_seconds / 2).epsilon(0.01));
    CHECK(cores < 0.2);
    // 2 threads x its wall time, less its CPU time, per step: the sleep leaves both cores idle.
    CHECK(idle == doctest::Approx(1000 * (2 * sleeping.self_seconds - sleeping.self_cpu_seconds) / 2).epsilon(0.01));
  }
  CHECK(found);

  // On the wall clock alone, the table keeps its four columns.
  st::profiler::reset();
  st::profiler::enable(st::profiler::clock::wall);
  { STRATA_PROFILE("alone"); }
  st::profiler::enable(false);
  std::ostringstream plain;
  st::profiler::report(plain, 1.0, 1);
  CHECK(plain.str().find("cores") == std::string::npos);
  CHECK(st::profiler::rows().at(0).self_cpu_seconds == 0);
  st::profiler::reset();
}
