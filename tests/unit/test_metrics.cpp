// The metrics lines (exact losses, FLOP/s and MFU, skipped steps) and the progress display
// (a bar redrawn with '\r', or the plain per-step lines).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <strata/plan/hardware.hpp>
#include <strata/strata.hpp>

namespace st = strata;

namespace {

// The text after "key": up to the next ',' or '}' (enough for the numbers and null).
std::string field(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  REQUIRE_MESSAGE(at != std::string::npos, "no field ", key, " in ", line);
  const auto from = at + key.size() + 3;
  return line.substr(from, line.find_first_of(",}", from) - from);
}

double number(const std::string& line, const std::string& key) {
  const std::string text = field(line, key);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  REQUIRE_MESSAGE(end == text.c_str() + text.size(), key, " is not a number: ", text);
  return v;
}

st::step_result sample_step() {
  st::step_result r;
  r.step = 7;
  r.loss = 2.5;
  r.lr = 1e-3;
  r.grad_norm = 0.5;
  r.tokens = 100;
  r.seconds = 0.5;
  return r;
}

// Everything written to `f` since it was opened.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[512];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

}  // namespace

TEST_CASE("metrics: the loss reads back as exactly the same double") {
  st::memory_ledger ledger;
  auto r = sample_step();
  for (double loss : {0.1 + 0.2, 1.0 / 3.0, std::nextafter(5.545177444479562, 10.0), 1e-300, 123456.78901234567}) {
    r.loss = loss;
    const double back = number(st::metrics_line(r, ledger, st::step_extras{}), "loss");
    CHECK(std::memcmp(&back, &loss, sizeof loss) == 0);
  }
}

TEST_CASE("metrics: flops_per_s from the plan's model FLOPs, mfu only with a device peak") {
  st::memory_ledger ledger;
  const auto r = sample_step();  // 0.5 s

  SUBCASE("no plan, no device: both null") {
    const auto line = st::metrics_line(r, ledger, st::step_extras{});
    CHECK(field(line, "flops_per_s") == "null");
    CHECK(field(line, "mfu") == "null");
  }
  SUBCASE("a plan but no device: FLOP/s, mfu null") {
    const auto line = st::metrics_line(r, ledger, {.model_flops_per_step = 1e12});
    CHECK(number(line, "flops_per_s") == doctest::Approx(2e12));
    CHECK(field(line, "mfu") == "null");
  }
  SUBCASE("a plan and a device: mfu = achieved / peak of all ranks") {
    const double peak = 4 * st::hw::find("a100_80gb")->peak_flops(2);  // 4 ranks, bf16
    const auto line = st::metrics_line(r, ledger, {.model_flops_per_step = 1e14, .peak_flops = peak});
    CHECK(number(line, "flops_per_s") == doctest::Approx(2e14));
    CHECK(number(line, "mfu") == doctest::Approx(2e14 / (4 * 312e12)));
  }
  SUBCASE("an untimed step gives no FLOP/s rather than infinity") {
    auto r0 = r;
    r0.seconds = 0;
    const auto line = st::metrics_line(r0, ledger, {.model_flops_per_step = 1e12, .peak_flops = 1e15});
    CHECK(field(line, "flops_per_s") == "null");
    CHECK(field(line, "mfu") == "null");
  }
}

TEST_CASE("metrics: skipped_steps counts the loss scaler's fp16 overflows") {
  st::memory_ledger ledger;
  st::loss_scaler scaler({.enabled = true});
  CHECK(field(st::metrics_line(sample_step(), ledger, {.skipped_steps = scaler.skipped_steps()}), "skipped_steps") ==
        "0");
  scaler.update(false);
  scaler.update(true);
  scaler.update(false);
  CHECK(field(st::metrics_line(sample_step(), ledger, {.skipped_steps = scaler.skipped_steps()}), "skipped_steps") ==
        "2");
}

TEST_CASE("metrics: the old call form still carries comm, and the new fields as unknown") {
  st::memory_ledger ledger;
  const auto line = st::metrics_line(sample_step(), ledger, "{\"world\":{}}");
  CHECK(line.find(",\"comm\":{\"world\":{}}}") != std::string::npos);
  CHECK(field(line, "mfu") == "null");
  CHECK(field(line, "skipped_steps") == "0");
  CHECK(field(line, "tokens_per_s") == "200");
  CHECK(line.find("\"pipeline\"") == std::string::npos);
}

TEST_CASE("metrics_file writes one line per step with the extras") {
  st::memory_ledger ledger;
  const std::string path = "test_metrics_file.jsonl";
  {
    st::metrics_file f(path);
    f.write(sample_step(), ledger, {.model_flops_per_step = 1e9, .skipped_steps = 1});
    f.write(sample_step(), ledger);
  }
  std::ifstream in(path);
  std::string a, b, c;
  REQUIRE(std::getline(in, a));
  REQUIRE(std::getline(in, b));
  CHECK_FALSE(std::getline(in, c));
  CHECK(number(a, "flops_per_s") == doctest::Approx(2e9));
  CHECK(field(a, "skipped_steps") == "1");
  CHECK(field(b, "flops_per_s") == "null");
  std::remove(path.c_str());
}

TEST_CASE("progress: the plain line keeps gpt2_train's format") {
  const st::progress_step p{.step = 3,
                            .total = 3,
                            .loss = 2.5,
                            .tokens_per_s = 200,
                            .lr = 1e-3,
                            .grad_norm = 0.5,
                            .elapsed = 1.3,
                            .eta = 75,
                            .applied = false,
                            .extra = " | idle 10.0%"};
  CHECK(st::progress_line(p) ==
        "step    3/3 | loss 2.5000 |      200 tok/s | lr 1.00e-03 | norm  0.500 | 1.3s elapsed | ETA 1m15s"
        " | idle 10.0% | skipped (non-finite gradients)");
}

TEST_CASE("progress: the bar fills in proportion to the steps done") {
  st::progress_step p{.step = 0, .total = 20};
  CHECK(st::progress_bar(p).rfind("[....................]    0/20 | loss", 0) == 0);
  p.step = 10;
  CHECK(st::progress_bar(p).rfind("[##########..........]   10/20 |", 0) == 0);
  p.step = 20;
  CHECK(st::progress_bar(p, 4).rfind("[####]   20/20 |", 0) == 0);
  p.step = 25;  // past the end (a resumed run with fewer --steps): clamped, not overflowing
  CHECK(st::progress_bar(p, 4).rfind("[####]", 0) == 0);
}

TEST_CASE("progress: bar mode redraws one line with carriage returns and ends it before messages") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  auto r = sample_step();
  {
    st::progress prog(3, st::progress_style::bar, f);
    CHECK(prog.bar());
    prog.update(1, r);
    prog.update(2, r);
    prog.message("checkpoint: saved");
    prog.update(3, r);
  }  // the destructor ends the last bar's line
  const std::string out = contents(f);
  std::fclose(f);
  INFO(out);
  CHECK(out.rfind("\r[######..............]    1/3 | loss 2.5000 | 200 tok/s | ", 0) == 0);
  CHECK(out.find("\r[#############.......]    2/3 |") != std::string::npos);
  CHECK(out.find("\ncheckpoint: saved\n\r[####################]    3/3 |") != std::string::npos);
  CHECK(out.find("step ") == std::string::npos);
  CHECK(out.back() == '\n');
  // Three newlines: the one ending the bar before the message, the message's own, and the final
  // one; the steps themselves never start a line.
  CHECK(std::count(out.begin(), out.end(), '\n') == 3);
}

TEST_CASE("progress: lines mode, and automatic mode off a terminal, print one plain line per step") {
  for (auto style : {st::progress_style::lines, st::progress_style::automatic}) {
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    {
      st::progress prog(3, style, f);
      CHECK_FALSE(prog.bar());
      for (int s = 1; s <= 3; ++s) prog.update(s, sample_step());
    }
    const std::string out = contents(f);
    std::fclose(f);
    INFO(out);
    CHECK(out.find('\r') == std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 3);
    CHECK(out.rfind("step    1/3 | loss 2.5000 |      200 tok/s | lr 1.00e-03 | norm  0.500 | ", 0) == 0);
    CHECK(out.find("\nstep    3/3 | loss 2.5000 |") != std::string::npos);
  }
}

TEST_CASE("progress: the ETA counts only the steps this run did (a resumed run)") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    st::progress prog(100, st::progress_style::lines, f);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    prog.update(91, sample_step());  // resumed after step 90: one step done here, nine to go
  }
  const std::string out = contents(f);
  std::fclose(f);
  INFO(out);
  const auto elapsed_at = out.find("s elapsed");
  const auto eta_at = out.find("ETA ");
  REQUIRE(elapsed_at != std::string::npos);
  REQUIRE(eta_at != std::string::npos);
  const double elapsed = std::strtod(out.c_str() + out.rfind("| ", elapsed_at) + 2, nullptr);
  const double eta = std::strtod(out.c_str() + eta_at + 4, nullptr);
  CHECK(elapsed >= 0.3);
  // Nine steps at this run's pace; crediting all 91 steps to it would give a tenth of elapsed.
  CHECK(eta >= 9 * (elapsed - 0.05) - 0.05);
  CHECK(eta <= 9 * (elapsed + 0.05) + 0.05);
}

TEST_CASE("progress: automatic mode draws the bar on a terminal, but not under an MPI launcher") {
  // A pseudo-terminal stands in for the user's terminal.
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  std::FILE* tty = std::fopen(::ptsname(master), "w");
  REQUIRE(tty != nullptr);
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);

  CHECK_FALSE(st::progress_bar_wanted(st::progress_style::automatic, file));
  CHECK(st::progress_bar_wanted(st::progress_style::bar, file));
  CHECK_FALSE(st::progress_bar_wanted(st::progress_style::lines, tty));
  if (!st::under_mpi_launcher()) {  // (this test itself might run under a launcher)
    CHECK(st::progress_bar_wanted(st::progress_style::automatic, tty));
    ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    CHECK(st::under_mpi_launcher());
    CHECK_FALSE(st::progress_bar_wanted(st::progress_style::automatic, tty));
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
  }
  std::fclose(file);
  std::fclose(tty);
  ::close(master);
}

TEST_CASE("progress: style names") {
  CHECK(st::parse_progress_style("auto") == st::progress_style::automatic);
  CHECK(st::parse_progress_style("bar") == st::progress_style::bar);
  CHECK(st::parse_progress_style("lines") == st::progress_style::lines);
  CHECK_THROWS_WITH_AS(st::parse_progress_style("fancy"), doctest::Contains("'fancy' is not one of auto, bar, lines"),
                       st::error);
}
