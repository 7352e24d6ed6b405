// strata/train/progress.hpp - the trainer's step lines, live on a terminal.
//
// On a terminal one line is redrawn in place ('\r') with a bar, the step, loss, tokens/s,
// elapsed time and ETA; anywhere else (a log file, a pipe, a test) each step prints one plain
// line, so logs stay greppable:
//
//   [#########...........]  112/250 | loss 2.4312 | 51234 tok/s | 12.3s elapsed | ETA 15.1s
//   step  112/250 | loss 2.4312 |    51234 tok/s | lr 2.71e-03 | norm  0.412 | 12.3s elapsed | ETA 15.1s
//
// Anything else printed while a bar is showing goes through message() (or follows end_line()),
// so it starts on a line of its own; the destructor ends the bar too, also when an error unwinds.
#pragma once
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/layers/moe_statistics.hpp"
#include "strata/train/trainer.hpp"

namespace strata {

// automatic: the bar on a terminal, plain lines anywhere else or under an MPI launcher.
enum class progress_style { automatic, bar, lines };

inline progress_style parse_progress_style(std::string_view s) {
  if (s == "auto") return progress_style::automatic;
  if (s == "bar") return progress_style::bar;
  STRATA_CHECK(s == "lines", "progress style '", s, "' is not one of auto, bar, lines");
  return progress_style::lines;
}

// Under mpirun (OpenMPI, MPICH/Hydra) or srun a rank's stdout can be a pseudo-terminal of the
// launcher's, which says nothing of where the launcher's own output goes (often a log). Not
// PMIX_RANK: OpenMPI sets it in a process that starts alone too.
inline bool under_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_PROCID"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

inline bool progress_bar_wanted(progress_style style, std::FILE* out) {
  if (style != progress_style::automatic) return style == progress_style::bar;
  return ::isatty(::fileno(out)) && !under_mpi_launcher();
}

// 12.3s, 4m05s.
inline std::string format_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  return buf;
}

// What one step's display shows.
struct progress_step {
  int step = 0, total = 0;  // steps done (1-based, counting any before a resume) of the run's total
  double loss = 0, tokens_per_s = 0, lr = 0, grad_norm = 0;
  double elapsed = 0, eta = 0;  // seconds, of this process's run
  bool applied = true;          // false: a non-finite gradient (an fp16 overflow, or worse) skipped the update
  std::string_view extra{};     // appended as is, e.g. " | idle 12.5%"
};

// The plain line, without its newline. Scripts and tests match on "step    3/3": keep the format.
inline std::string progress_line(const progress_step& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %4d/%d | loss %.4f | %8.0f tok/s | lr %.2e | norm %6.3f | %s elapsed | ETA %s",
                p.step, p.total, p.loss, p.tokens_per_s, p.lr, p.grad_norm, format_duration(p.elapsed).c_str(),
                format_duration(p.eta).c_str());
  return std::string(buf) + std::string(p.extra) + (p.applied ? "" : " | skipped (non-finite gradients)");
}

// The bar line, without '\r'; shorter than the plain line so it fits a terminal's width.
inline std::string progress_bar(const progress_step& p, int width = 20) {
  const int filled = p.total > 0 ? int(std::clamp<long long>(1LL * p.step * width / p.total, 0, width)) : 0;
  std::string s(1, '[');  // appended piece by piece: GCC 12 misreads "[" + std::string(...) (-Wrestrict)
  s.append(std::size_t(filled), '#').append(std::size_t(width - filled), '.') += ']';
  char buf[160];
  std::snprintf(buf, sizeof buf, " %4d/%d | loss %.4f | %.0f tok/s | %s elapsed | ETA %s", p.step, p.total, p.loss,
                p.tokens_per_s, format_duration(p.elapsed).c_str(), format_duration(p.eta).c_str());
  return s + buf + std::string(p.extra) + (p.applied ? "" : " | skipped");
}

// A mixture of experts' part of the line: the auxiliary terms, the busiest expert's load against
// an even share (over the MoE blocks), and the pairs dropped over capacity when any were.
inline std::string experts_text(const step_result& r) {
  const auto loads = expert_loads(r.auxiliary);
  if (loads.empty()) return {};
  double worst = 0, dropped = 0;
  for (const auto& l : loads) {
    worst = std::max(worst, l.tokens_max / l.tokens_mean);
    dropped += l.dropped;
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, " | aux %.4f | expert load max %.2fx", r.aux_loss, worst);
  std::string s = buf;
  if (dropped > 0) s += " | dropped " + std::to_string(static_cast<long long>(dropped));
  return s;
}

class progress {
 public:
  // `total`: the run's last step. The clock starts here; the ETA counts only the steps this
  // process runs, so a resumed run does not credit itself with the earlier ones.
  explicit progress(int total, progress_style style = progress_style::automatic, std::FILE* out = stdout)
      : out_(out), total_(total), bar_(progress_bar_wanted(style, out)), start_(std::chrono::steady_clock::now()) {}
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() { end_line(); }

  bool bar() const { return bar_; }

  // After step `step` (1-based) finished with `r`.
  void update(int step, const step_result& r, std::string_view extra = {}) {
    if (first_ < 0) first_ = step - 1;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int done = std::max(1, step - first_);
    const std::string with_experts = std::string(extra) + experts_text(r);
    const progress_step p{.step = step,
                          .total = total_,
                          .loss = r.loss,
                          .tokens_per_s = r.seconds > 0 ? double(r.tokens) / r.seconds : 0.0,
                          .lr = r.lr,
                          .grad_norm = r.grad_norm,
                          .elapsed = elapsed,
                          .eta = elapsed / done * std::max(0, total_ - step),
                          .applied = r.applied,
                          .extra = with_experts};
    if (!bar_) {
      std::fprintf(out_, "%s\n", progress_line(p).c_str());
    } else {
      // A wrapped line would defeat '\r': on a narrow terminal shorten the bar, then cut the end.
      std::string s = progress_bar(p);
      if (const int cols = columns(); cols > 1 && int(s.size()) >= cols) {
        s = progress_bar(p, std::max(5, 20 - (int(s.size()) - cols + 1)));
        if (int(s.size()) >= cols) s.resize(std::size_t(cols - 1));
      }
      // Blank out what a longer previous line left behind.
      const std::size_t drawn = s.size();
      if (s.size() < drawn_) s.append(drawn_ - s.size(), ' ');
      std::fprintf(out_, "\r%s", s.c_str());
      drawn_ = drawn;
      open_ = true;
    }
    std::fflush(out_);
  }

  // Prints `text` on a line of its own (ending the bar's line first); the bar resumes below it.
  void message(std::string_view text) {
    end_line();
    std::fprintf(out_, "%.*s\n", int(text.size()), text.data());
    std::fflush(out_);
  }

  // Ends the bar's line, if one is showing.
  void end_line() {
    if (!open_) return;
    std::fputc('\n', out_);
    std::fflush(out_);
    open_ = false;
    drawn_ = 0;
  }

 private:
  int columns() const {  // the terminal's width, 0 when unknown (not a terminal)
    winsize w{};
    return ::ioctl(::fileno(out_), TIOCGWINSZ, &w) == 0 ? int(w.ws_col) : 0;
  }

  std::FILE* out_;
  int total_;
  bool bar_;
  std::chrono::steady_clock::time_point start_;
  int first_ = -1;  // the step before the first one this process ran
  bool open_ = false;
  std::size_t drawn_ = 0;
};

}  // namespace strata
