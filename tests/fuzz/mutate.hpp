// tests/fuzz/mutate.hpp - a seeded mutation fuzzer for strata's file readers, run inside ctest.
//
// Every file strata reads is untrusted (issue 19): a reader must load its input or throw
// strata::error, never crash, hang, trip a sanitizer, throw another type or allocate what a
// size field asks for unchecked. Each fuzz target (fuzz_*.cpp) names its reader calls and its
// seed corpus; this header does the rest:
//
//   - inputs: a corpus entry (one file, or a directory of files for a checkpoint) mutated by a
//     PRNG seeded with (--seed, input index), so input i of seed s is the same on every machine;
//   - mutations: bit flips, interesting bytes and words, inserted/deleted/duplicated ranges,
//     truncation, splices of two corpus files, and JSON-aware edits (numbers made huge, negative
//     or fractional, values nested thousands deep, keys duplicated, strings and types swapped);
//     a safetensors file's JSON header is edited with its length prefix kept right, so the edit
//     reaches the header's checks instead of the length check;
//   - failures: a signal, a sanitizer report, a hang past --timeout or an exception other than
//     strata::error prints the seed and input index and saves the input (--out) for --replay.
//
// Flags: --inputs N --seed S --seconds T (stop at whichever comes first), --corpus DIR,
// --replay FILE|DIR, --out DIR, --timeout S (per input), --write-corpus DIR, --show N (print the
// first N refusals). docs/testing-untrusted-input.md has the how-to.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <new>
#include <string>
#include <typeinfo>
#include <vector>

#include <strata/core/error.hpp>

#include "../support/program_dir.hpp"

// Present only when a sanitizer runtime is linked in: it then reports the crash itself, and this
// callback saves the input afterwards.
extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

namespace strata_fuzz {

namespace fs = std::filesystem;
using bytes = std::vector<unsigned char>;

// splitmix64: small, fast and the same everywhere, so (seed, index) names an input for good.
struct rng {
  std::uint64_t s;
  explicit rng(std::uint64_t seed) : s(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
  bool chance(int percent) { return below(100) < static_cast<std::size_t>(percent); }
  template <class C>
  const auto& pick(const C& c) {
    return c[below(std::size(c))];
  }
};

// One file of an input; a checkpoint input is several (manifest, COMPLETE, rank files).
struct file {
  std::string name;
  bytes data;
};
using input = std::vector<file>;

inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
inline bytes to_bytes(const std::string& s) { return bytes(s.begin(), s.end()); }
inline std::string to_text(const bytes& b) { return std::string(b.begin(), b.end()); }

inline bytes read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void write_bytes(const fs::path& p, const bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out.good()) throw std::runtime_error("fuzz: cannot write " + p.string());
}

// --- mutations --------------------------------------------------------------------------------

// The tables read better packed than one entry per line.
// clang-format off
inline const std::vector<std::string>& interesting_numbers() {
  static const std::vector<std::string> v{
      "0", "-1", "1", "2", "3", "4", "5", "7", "8", "16", "63", "64", "65", "255", "256", "1023", "1024", "65535",
      "65536", "2147483647", "2147483648", "-2147483648", "-2147483649", "4294967295", "4294967296",
      "9007199254740993", "4611686018427387904", "9223372036854775807", "9223372036854775808",
      "-9223372036854775808", "18446744073709551615", "18446744073709551616", "1.5", "-0.5", "0.0", "-0", "1e308",
      "-1e308", "1e400", "1e-300", "3.0", "2e9", "1E2"};
  return v;
}
inline const std::vector<std::string>& interesting_strings() {
  static const std::vector<std::string> v{
      "\"\"", "\"F32\"", "\"F16\"", "\"BF16\"", "\"F64\"", "\"BOOL\"", "\"I64\"", "\"U8\"", "\"F8_E4M3\"", "\"F4\"",
      "\"__metadata__\"", "\"weights/wte@0\"", "\"rank-00000.safetensors\"", "\"../rank-00000.safetensors\"",
      "\"/dev/zero\"", "\"COMPLETE\"", "\"manifest.json\"", "\"strata-checkpoint\"", "\"\\u0000\"", "\"\\ud800\"",
      "\"" + std::string(300, 'A') + "\""};
  return v;
}
inline const std::vector<std::string>& interesting_values() {
  static const std::vector<std::string> v{"null", "true", "false", "{}", "[]", "[1,2]", "[0]", "[-1]", "{\"a\":1}",
                                          "[[]]", "\"x\""};
  return v;
}
inline const std::vector<std::int64_t>& interesting_words() {
  static const std::vector<std::int64_t> v{0, 1, -1, 2, 0x7f, 0x80, 0xff, 0x100, 0x7fff, 0x8000, 0xffff, 0x10000,
                                           0x7fffffff, -0x7fffffffll - 1, 0xffffffffll, 20240520, 1024, 4096,
                                           std::int64_t(1) << 40, INT64_MAX, INT64_MIN};
  return v;
}

// clang-format on

// Byte-level mutations; `other` is another corpus file for splices.
inline void mutate_bytes(bytes& b, rng& r, const bytes& other) {
  static const unsigned char special[] = {0,   0xff, 0x7f, 0x80, 0x01, 0xfe, '{', '}', '[', ']', '"',
                                          ':', ',',  '\\', '-',  '.',  'e',  '0', '1', '9', ' ', '\n'};
  const auto at = [&](std::size_t extra = 0) { return r.below(b.size() + extra); };
  switch (r.below(10)) {
    case 0:  // flip 1-4 bits
      if (b.empty()) break;
      for (std::size_t k = 0, n = 1 + r.below(4); k < n; ++k) b[at()] ^= static_cast<unsigned char>(1u << r.below(8));
      break;
    case 1:  // a byte to an interesting value
      if (!b.empty()) b[at()] = r.pick(special);
      break;
    case 2: {  // a little-endian word (2, 4 or 8 bytes), often aligned and near the start, to an interesting value
      const std::size_t width = std::size_t(2) << r.below(3);
      if (b.size() < width) break;
      std::size_t pos = r.chance(50) ? std::min(r.below(64), b.size() - width) : r.below(b.size() - width + 1);
      if (r.chance(50)) pos -= pos % width;
      auto v = static_cast<std::uint64_t>(r.pick(interesting_words()));  // unsigned: off by one wraps, defined
      if (r.chance(25)) v += r.chance(50) ? 1 : ~std::uint64_t(0);
      for (std::size_t i = 0; i < width; ++i) b[pos + i] = static_cast<unsigned char>(v >> (8 * i));
      break;
    }
    case 3: {  // insert random or special bytes
      const std::size_t pos = at(1), n = 1 + r.below(r.chance(80) ? 8 : 512);
      bytes ins(n);
      for (auto& c : ins) c = r.chance(50) ? r.pick(special) : static_cast<unsigned char>(r.next());
      b.insert(b.begin() + std::ptrdiff_t(pos), ins.begin(), ins.end());
      break;
    }
    case 4: {  // delete a range
      if (b.empty()) break;
      const std::size_t pos = at(), n = 1 + r.below(std::min<std::size_t>(b.size() - pos, r.chance(80) ? 8 : 4096));
      b.erase(b.begin() + std::ptrdiff_t(pos), b.begin() + std::ptrdiff_t(pos + n));
      break;
    }
    case 5: {  // duplicate a range elsewhere
      if (b.empty()) break;
      const std::size_t from = at(), n = 1 + r.below(std::min<std::size_t>(b.size() - from, 256)), to = at(1);
      const bytes piece(b.begin() + std::ptrdiff_t(from), b.begin() + std::ptrdiff_t(from + n));
      b.insert(b.begin() + std::ptrdiff_t(to), piece.begin(), piece.end());
      break;
    }
    case 6:  // truncate
      b.resize(r.chance(20) ? r.below(16) : at(1));
      break;
    case 7: {  // splice: a prefix of this file and a suffix of another
      if (other.empty()) break;
      const std::size_t keep = at(1), from = r.below(other.size());
      b.resize(keep);
      b.insert(b.end(), other.begin() + std::ptrdiff_t(from), other.end());
      break;
    }
    case 8: {  // overwrite a range with a range of another file (same offset when it fits)
      if (other.empty() || b.empty()) break;
      const std::size_t pos = at(), n = 1 + r.below(std::min<std::size_t>(b.size() - pos, 64));
      const std::size_t src = pos + n <= other.size() && r.chance(50) ? pos : r.below(other.size());
      for (std::size_t i = 0; i < n && src + i < other.size(); ++i) b[pos + i] = other[src + i];
      break;
    }
    default:  // grow with zeros or ones (sizes past what a header promises)
      b.insert(b.end(), 1 + r.below(r.chance(50) ? 16 : 8192), static_cast<unsigned char>(r.chance(50) ? 0 : 0xff));
      break;
  }
}

namespace json_text {

// Positions where a number starts ('-' or a digit not inside a word) and where it ends.
struct span {
  std::size_t begin, end;
};
inline std::vector<span> numbers(const std::string& t) {
  std::vector<span> out;
  for (std::size_t i = 0; i < t.size();) {
    const bool starts = (std::isdigit(static_cast<unsigned char>(t[i])) ||
                         (t[i] == '-' && i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1])))) &&
                        (i == 0 || !std::isalnum(static_cast<unsigned char>(t[i - 1])));
    if (!starts) {
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < t.size() && (std::isdigit(static_cast<unsigned char>(t[j])) || t[j] == '.' || t[j] == 'e' ||
                            t[j] == 'E' || t[j] == '+' || t[j] == '-'))
      ++j;
    out.push_back({i, j});
    i = j;
  }
  return out;
}
// Quoted strings (escapes honoured), quotes included.
inline std::vector<span> strings(const std::string& t) {
  std::vector<span> out;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '"') continue;
    std::size_t j = i + 1;
    while (j < t.size() && t[j] != '"') j += t[j] == '\\' ? 2 : 1;
    if (j >= t.size()) break;
    out.push_back({i, j + 1});
    i = j;
  }
  return out;
}
// The end of the value starting at `at`: the first ',' '}' or ']' outside brackets and strings.
inline std::size_t value_end(const std::string& t, std::size_t at) {
  int depth = 0;
  for (std::size_t i = at; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '"') {
      ++i;
      while (i < t.size() && t[i] != '"') i += t[i] == '\\' ? 2 : 1;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (depth-- == 0) return i;
    } else if (c == ',' && depth == 0) {
      return i;
    }
  }
  return t.size();
}
// Where values start: just after a ':' (object values) outside strings.
inline std::vector<std::size_t> value_starts(const std::string& t) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '"') {
      ++i;
      while (i < t.size() && t[i] != '"') i += t[i] == '\\' ? 2 : 1;
    } else if (t[i] == ':') {
      std::size_t j = i + 1;
      while (j < t.size() && t[j] == ' ') ++j;
      out.push_back(j);
    }
  }
  return out;
}

}  // namespace json_text

// JSON-aware edits of a text; false when the text had nothing to edit.
inline bool mutate_json(std::string& t, rng& r) {
  using namespace json_text;
  switch (r.below(8)) {
    case 0:
    case 1: {  // a number to an interesting one, or off by one / doubled
      const auto nums = numbers(t);
      if (nums.empty()) return false;
      const auto s = r.pick(nums);
      std::string v = r.pick(interesting_numbers());
      if (r.chance(30)) {
        // In unsigned arithmetic (wrapping, defined), printed signed: the value's neighbours, negation, double, half.
        const auto x =
            static_cast<std::uint64_t>(std::strtoll(t.substr(s.begin, s.end - s.begin).c_str(), nullptr, 10));
        const std::uint64_t choices[] = {x + 1, x - 1, 0 - x, x * 2, x / 2};
        v = std::to_string(static_cast<long long>(r.pick(choices)));
      }
      t.replace(s.begin, s.end - s.begin, v);
      return true;
    }
    case 2: {  // a value nested deep (balanced or not), in place of a number or any value
      const auto starts = value_starts(t);
      const std::size_t depths[] = {2, 10, 100, 1000, 10000, 100000};
      const std::size_t depth = r.pick(depths);
      const bool object = r.chance(30), balanced = r.chance(70);
      std::string open, close;
      for (std::size_t i = 0; i < depth; ++i) {
        open += object ? "{\"a\":" : "[";
        if (balanced) close += object ? "}" : "]";
      }
      const std::string v = open + "0" + close;
      if (starts.empty()) {
        t.insert(r.below(t.size() + 1), v);
      } else {
        const std::size_t at = r.pick(starts);
        t.replace(at, value_end(t, at) - at, v);
      }
      return true;
    }
    case 3: {  // a key duplicated: "k": v copied in front of itself
      std::vector<span> keys;
      for (const auto& s : strings(t)) {
        std::size_t j = s.end;
        while (j < t.size() && t[j] == ' ') ++j;
        if (j < t.size() && t[j] == ':') keys.push_back(s);
      }
      if (keys.empty()) return false;
      const auto k = r.pick(keys);
      const std::size_t colon = t.find(':', k.end);
      const std::string pair = t.substr(k.begin, value_end(t, colon + 1) - k.begin);
      std::string copy = pair;
      if (r.chance(50)) {  // the copy with another value
        const std::size_t c = copy.find(':', k.end - k.begin);
        copy = copy.substr(0, c + 1) + r.pick(interesting_numbers());
      }
      t.insert(k.begin, copy + ",");
      return true;
    }
    case 4: {  // a string to an interesting one
      const auto strs = strings(t);
      if (strs.empty()) return false;
      const auto s = r.pick(strs);
      t.replace(s.begin, s.end - s.begin, r.pick(interesting_strings()));
      return true;
    }
    case 5: {  // a value to another type
      const auto starts = value_starts(t);
      if (starts.empty()) return false;
      const std::size_t at = r.pick(starts);
      t.replace(at, value_end(t, at) - at, r.pick(interesting_values()));
      return true;
    }
    case 6: {  // one value copied over another (a shape over an offset pair, ...)
      const auto starts = value_starts(t);
      if (starts.size() < 2) return false;
      const std::size_t from = r.pick(starts), to = r.pick(starts);
      const std::string v = t.substr(from, value_end(t, from) - from);
      t.replace(to, value_end(t, to) - to, v);
      return true;
    }
    default: {  // an array grown by an element or emptied
      std::vector<std::size_t> opens;
      for (std::size_t i = 0; i < t.size(); ++i)
        if (t[i] == '[') opens.push_back(i);
      if (opens.empty()) return false;
      const std::size_t at = r.pick(opens), end = value_end(t, at + 1);
      if (r.chance(50)) t.insert(at + 1, r.pick(interesting_numbers()) + (end == at + 1 ? "" : ","));
      else t.erase(at + 1, end - at - 1);
      return true;
    }
  }
}

// A safetensors file's header edited as JSON, its length prefix rewritten to fit; false when the
// file has no header to edit.
inline bool mutate_safetensors_header(bytes& b, rng& r) {
  if (b.size() < 8) return false;
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(b[std::size_t(i)]) << (8 * i);
  if (n > b.size() - 8) return false;
  std::string header(b.begin() + 8, b.begin() + 8 + std::ptrdiff_t(n));
  if (!mutate_json(header, r)) return false;
  if (r.chance(70)) header.resize((header.size() + 7) / 8 * 8, ' ');
  const std::uint64_t m = header.size();
  bytes out;
  out.reserve(8 + header.size() + (b.size() - 8 - n));
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(m >> (8 * i)));
  for (char c : header) out.push_back(static_cast<unsigned char>(c));
  out.insert(out.end(), b.begin() + 8 + std::ptrdiff_t(n), b.end());
  b = std::move(out);
  return true;
}

// One mutation of one file, chosen for its kind (by name: .safetensors, .json, or raw bytes).
inline void mutate_file(file& f, rng& r, const bytes& other) {
  if (ends_with(f.name, ".safetensors") && r.chance(50) && mutate_safetensors_header(f.data, r)) return;
  if (ends_with(f.name, ".json") && r.chance(60)) {
    std::string t = to_text(f.data);
    if (mutate_json(t, r)) {
      f.data = to_bytes(t);
      return;
    }
  }
  mutate_bytes(f.data, r, other);
}

// --- the driver -------------------------------------------------------------------------------

// Counts of loaded and refused inputs for each reader call a target makes.
struct tally {
  struct counts {
    long loaded = 0, refused = 0;
  };
  std::map<std::string, counts> by_call;
  std::vector<std::string> order;
  int show = 0;             // refusals still to print
  bool any_loaded = false;  // this input, by any call
  bool any_refused = false;

  // Runs one reader call: returning is "loaded", strata::error is "refused", anything else
  // propagates to the driver as a failure.
  template <class F>
  void attempt(const std::string& call, F&& body) {
    if (!by_call.count(call)) order.push_back(call);
    auto& c = by_call[call];
    try {
      const bool loaded = body();
      (loaded ? c.loaded : c.refused)++;
      (loaded ? any_loaded : any_refused) = true;
    } catch (const strata::error& e) {
      ++c.refused;
      any_refused = true;
      if (show > 0) {
        --show;
        std::printf("  refused (%s): %s\n", call.c_str(), e.what());
      }
    }
  }
};

struct target {
  std::string name;  // "safetensors", "checkpoint", ...
  // Runs the reader calls on an input; `work` is a scratch directory of its own.
  std::function<void(const input&, const fs::path& work, tally&)> run;
  // Writes the seed corpus into a directory (--write-corpus).
  std::function<void(const fs::path& dir)> write_corpus;
  // Entries are directories of files (a checkpoint) rather than single files.
  bool directories = false;
  // Optional: a structure-aware mutation (true if it applied), tried on a share of the inputs.
  std::function<bool(input&, rng&)> structured;
  // Optional: after mutation, on a share of the inputs, repair checksums so the checks behind them run.
  std::function<void(input&)> fixup;
};

namespace detail {

// What a signal handler or the sanitizer's death callback needs, prepared before each input.
inline bytes current;              // the input, serialized for --replay
inline char save_path[4096] = {};  // where it goes on a failure
inline char banner[8192] = {};     // what to print
// While an input runs, the reader's own messages (resume prints why it skips a checkpoint) go to
// a log file rather than flooding ctest's output; a failure puts the log (with the sanitizer's
// report in it) back on stderr.
inline int saved_stdout = -1, saved_stderr = -1, log_fd = -1;

inline void restore_output() {
  if (saved_stderr < 0) return;
  ::dup2(saved_stdout, 1);
  ::dup2(saved_stderr, 2);
  if (log_fd >= 0 && ::lseek(log_fd, 0, SEEK_SET) == 0) {
    char buf[4096];
    for (ssize_t n; (n = ::read(log_fd, buf, sizeof buf)) > 0;) {
      ssize_t rc = ::write(2, buf, std::size_t(n));
      (void)rc;
    }
  }
}

inline void write_str(const char* s) {
  ssize_t rc = ::write(2, s, std::strlen(s));
  (void)rc;
}
// Only async-signal-safe calls: open, write, close.
inline void save_current() {
  if (!save_path[0]) return;
  const int fd = ::open(save_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    std::size_t at = 0;
    while (at < current.size()) {
      const ssize_t w = ::write(fd, current.data() + at, current.size() - at);
      if (w <= 0) break;
      at += std::size_t(w);
    }
    ::close(fd);
  }
  write_str(banner);
}
extern "C" inline void on_death() {
  restore_output();
  save_current();
}
extern "C" inline void on_signal(int sig) {
  restore_output();
  write_str(sig == SIGALRM ? "\nfuzz: FAILURE: the input hung past --timeout\n" : "\nfuzz: FAILURE: fatal signal\n");
  save_current();
  if (sig == SIGALRM) ::_exit(70);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

inline void install_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);
  if (__sanitizer_set_death_callback) {
    // The sanitizer runtime keeps its own SEGV/FPE handlers (they print the report).
    __sanitizer_set_death_callback(on_death);
    return;
  }
  // A stack overflow needs a stack of its own to report on.
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  sa.sa_flags = SA_ONSTACK;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
}

// Inputs of several files travel as one file: a magic line, then "name size\n" and the bytes
// of each.
inline const std::string bundle_magic = "strata-fuzz-bundle 1\n";
inline bytes serialize(const input& in, bool directories) {
  if (!directories && in.size() == 1) return in[0].data;
  bytes out = to_bytes(bundle_magic);
  for (const auto& f : in) {
    const auto line = to_bytes(f.name + " " + std::to_string(f.data.size()) + "\n");
    out.insert(out.end(), line.begin(), line.end());
    out.insert(out.end(), f.data.begin(), f.data.end());
  }
  return out;
}
inline bool safe_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}
// A corpus entry or replay file: a directory of files, a bundle, or one file.
inline input load_entry(const fs::path& p, const std::string& single_name) {
  input in;
  if (fs::is_directory(p)) {
    for (const auto& e : fs::directory_iterator(p))
      if (e.is_regular_file()) in.push_back({e.path().filename().string(), read_bytes(e.path())});
    std::sort(in.begin(), in.end(), [](const file& a, const file& b) { return a.name < b.name; });
    return in;
  }
  const bytes b = read_bytes(p);
  if (b.size() >= bundle_magic.size() && std::equal(bundle_magic.begin(), bundle_magic.end(), b.begin())) {
    std::size_t at = bundle_magic.size();
    while (at < b.size()) {
      const auto nl = std::find(b.begin() + std::ptrdiff_t(at), b.end(), '\n');
      const std::string line(b.begin() + std::ptrdiff_t(at), nl);
      const auto sp = line.rfind(' ');
      if (nl == b.end() || sp == std::string::npos) throw std::runtime_error("fuzz: malformed bundle " + p.string());
      const std::string name = line.substr(0, sp);
      const std::size_t n = std::stoull(line.substr(sp + 1)), from = at + line.size() + 1;
      if (!safe_name(name) || from + n > b.size()) throw std::runtime_error("fuzz: malformed bundle " + p.string());
      in.push_back({name, bytes(b.begin() + std::ptrdiff_t(from), b.begin() + std::ptrdiff_t(from + n))});
      at = from + n;
    }
    return in;
  }
  const std::string name = p.filename().string();
  in.push_back({single_name.empty() ? name : single_name, b});
  return in;
}

struct options {
  long inputs = 2000;
  std::uint64_t seed = 1;
  double seconds = 0;  // 0: no time bound
  std::string corpus, replay, out = ".", write_corpus;
  int timeout = 10, show = 0;
};

inline void usage(const std::string& name) {
  std::printf(
      "fuzz_%s: mutation fuzzing of strata's %s reader\n"
      "  --inputs N        mutated inputs to run (default 2000)\n"
      "  --seed S          PRNG seed (default 1); input i of seed S is the same everywhere\n"
      "  --seconds T       stop after T seconds, whichever of N and T comes first (default: none)\n"
      "  --corpus DIR      seed corpus (default: corpus/%s next to this program, a link to the\n"
      "                    source tree's tests/fuzz/corpus)\n"
      "  --replay PATH     run one saved input (file, bundle or directory) and say what happened\n"
      "  --out DIR         where failing inputs are saved (default: .)\n"
      "  --timeout S       per-input time limit in seconds (default 10)\n"
      "  --show N          print the first N refusal messages\n"
      "  --write-corpus D  write the seed corpus into D and exit\n",
      name.c_str(), name.c_str(), name.c_str());
}

}  // namespace detail

// Scratch space for the inputs' files: $STRATA_FUZZ_WORK, else /dev/shm (a disk shared with
// busy builds makes each input's few file operations wait), else `out`.
inline fs::path scratch_root(const fs::path& out) {
  if (const char* w = std::getenv("STRATA_FUZZ_WORK"); w && *w) return w;
  std::error_code ec;
  if (fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return out;
}

// The whole program of a fuzz target.
inline int main(int argc, char** argv, const target& t, const std::string& default_corpus) {
  using clock = std::chrono::steady_clock;
  detail::options o;
  o.corpus = default_corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fuzz_%s: %s needs a value\n", t.name.c_str(), a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--inputs") o.inputs = std::stol(value());
      else if (a == "--seed") o.seed = std::stoull(value());
      else if (a == "--seconds") o.seconds = std::stod(value());
      else if (a == "--corpus") o.corpus = value();
      else if (a == "--replay") o.replay = value();
      else if (a == "--out") o.out = value();
      else if (a == "--timeout") o.timeout = std::stoi(value());
      else if (a == "--show") o.show = std::stoi(value());
      else if (a == "--write-corpus") o.write_corpus = value();
      else if (a == "--help" || a == "-h") {
        detail::usage(t.name);
        return 0;
      } else {
        std::fprintf(stderr, "fuzz_%s: unknown flag %s (--help lists them)\n", t.name.c_str(), a.c_str());
        return 2;
      }
    } catch (const std::logic_error&) {
      std::fprintf(stderr, "fuzz_%s: %s: not a number\n", t.name.c_str(), a.c_str());
      return 2;
    }
  }
  if (!o.write_corpus.empty()) {
    fs::create_directories(o.write_corpus);
    t.write_corpus(o.write_corpus);
    std::printf("fuzz_%s: corpus written to %s\n", t.name.c_str(), o.write_corpus.c_str());
    return 0;
  }

  const fs::path out = fs::absolute(o.out);
  fs::create_directories(out);
  const fs::path work = scratch_root(out) / ("strata-fuzz-" + t.name + "-" + std::to_string(::getpid()));
  fs::create_directories(work);
  detail::install_handlers();
  tally tl;
  long failures = 0;
  // Quiet unless refusals are to be shown.
  bool quiet = o.show == 0 && o.replay.empty();
  if (quiet) {
    detail::log_fd = ::open((work.string() + ".log").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    quiet = detail::log_fd >= 0;
  }

  // Runs one input; a failure that returns (an exception of the wrong type) is saved and counted.
  const auto run_one = [&](const input& in, const std::string& label, const fs::path& save_as) {
    detail::current = detail::serialize(in, t.directories);
    std::snprintf(detail::save_path, sizeof detail::save_path, "%s", save_as.c_str());
    std::snprintf(detail::banner, sizeof detail::banner,
                  "fuzz_%s: FAILURE on %s; the input is saved as %s\n  replay: fuzz_%s --replay %s\n", t.name.c_str(),
                  label.c_str(), save_as.c_str(), t.name.c_str(), save_as.c_str());
    tl.any_loaded = tl.any_refused = false;
    std::string wrong;
    fs::remove_all(work);
    fs::create_directories(work);
    if (quiet) {
      std::fflush(stdout);
      std::fflush(stderr);
      if (::ftruncate(detail::log_fd, 0) != 0 || ::lseek(detail::log_fd, 0, SEEK_SET) != 0) quiet = false;
      else {
        detail::saved_stdout = ::dup(1);
        detail::saved_stderr = ::dup(2);
        ::dup2(detail::log_fd, 1);
        ::dup2(detail::log_fd, 2);
      }
    }
    ::alarm(static_cast<unsigned>(o.timeout));
    try {
      t.run(in, work, tl);
    } catch (const std::bad_alloc&) {
      wrong = "std::bad_alloc (a size field allocated unchecked?)";
    } catch (const std::exception& e) {
      wrong = std::string("an exception of type ") + typeid(e).name() + " rather than strata::error: " + e.what();
    } catch (...) { wrong = "an exception of unknown type"; }
    ::alarm(0);
    if (quiet) {
      std::fflush(stdout);
      std::fflush(stderr);
      ::dup2(detail::saved_stdout, 1);
      ::dup2(detail::saved_stderr, 2);
      ::close(detail::saved_stdout);
      ::close(detail::saved_stderr);
      detail::saved_stdout = detail::saved_stderr = -1;
    }
    if (!wrong.empty()) {
      ++failures;
      if (quiet) {  // what the reader printed before it went wrong
        const auto log = read_bytes(work.string() + ".log");
        std::fwrite(log.data(), 1, log.size(), stderr);
      }
      std::fprintf(stderr, "fuzz_%s: FAILURE on %s: %s\n", t.name.c_str(), label.c_str(), wrong.c_str());
      detail::save_current();
    }
    detail::save_path[0] = 0;
    return wrong.empty();
  };

  if (!o.replay.empty()) {
    tl.show = 1 << 30;
    const input in = detail::load_entry(o.replay, "");
    const bool ok = run_one(in, "replay of " + o.replay, out / "replay-failure.bin");
    for (const auto& call : tl.order)
      std::printf("fuzz_%s: %s: %s\n", t.name.c_str(), call.c_str(), tl.by_call[call].loaded ? "loaded" : "refused");
    fs::remove_all(work);
    return ok ? 0 : 1;
  }

  // The corpus: each entry runs as it is first. Entries named ok-* must load (through at least
  // one call) and bad-* must be refused by every call; a change to a reader that breaks either
  // shows here.
  std::vector<input> corpus;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(o.corpus)) {
    if (t.directories != e.is_directory() || e.path().filename().string()[0] == '.') continue;
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  for (const auto& n : names) corpus.push_back(detail::load_entry(fs::path(o.corpus) / n, ""));
  if (corpus.empty()) {
    std::fprintf(stderr, "fuzz_%s: no corpus entries in %s\n", t.name.c_str(), o.corpus.c_str());
    return 2;
  }
  tl.show = o.show;
  long corpus_loaded = 0;
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    const std::string& n = names[i];
    if (!run_one(corpus[i], "corpus entry " + n, out / ("failure-" + t.name + "-corpus-" + n))) continue;
    corpus_loaded += tl.any_loaded;
    const bool expect_ok = n.rfind("ok-", 0) == 0, expect_bad = n.rfind("bad-", 0) == 0;
    if ((expect_ok && !tl.any_loaded) || (expect_bad && tl.any_loaded)) {
      ++failures;
      std::fprintf(stderr, "fuzz_%s: FAILURE: corpus entry %s was %s\n", t.name.c_str(), n.c_str(),
                   expect_ok ? "refused (it is valid)" : "loaded (it is broken)");
    }
  }
  tl.by_call.clear();  // the counts below are of mutated inputs only
  tl.order.clear();

  const auto start = clock::now();
  long ran = 0, loaded = 0, refused = 0;
  for (long i = 0; i < o.inputs; ++i) {
    if (o.seconds > 0 && std::chrono::duration<double>(clock::now() - start).count() >= o.seconds) break;
    rng r(o.seed * 0x100000001b3ull + std::uint64_t(i) * 0x9e3779b97f4a7c15ull + 1);
    r.next();
    input in = r.pick(corpus);
    if (in.empty()) continue;
    bool structured = t.structured && r.chance(25) && t.structured(in, r);
    for (std::size_t k = 0, n = structured ? r.below(2) : 1 + (r.chance(50) ? r.below(4) : 0); k < n; ++k) {
      const auto& other_entry = r.pick(corpus);
      const bytes& other = other_entry.empty() ? in[0].data : r.pick(other_entry).data;
      // Checkpoints: the manifest and the rank files get most of the attention.
      mutate_file(in[r.below(in.size())], r, other);
    }
    if (t.fixup && r.chance(50)) t.fixup(in);
    const std::string label = "input " + std::to_string(i) + " of seed " + std::to_string(o.seed);
    const bool ok = run_one(
        in, label, out / ("failure-" + t.name + "-seed" + std::to_string(o.seed) + "-input" + std::to_string(i)));
    ++ran;
    if (ok) (tl.any_loaded ? loaded : refused)++;
    if (failures >= 20) {
      std::fprintf(stderr, "fuzz_%s: stopping after 20 failures\n", t.name.c_str());
      break;
    }
  }
  const double secs = std::chrono::duration<double>(clock::now() - start).count();
  std::printf(
      "fuzz_%s: corpus %zu entries (%ld loaded); %ld mutated inputs in %.1f s (seed %llu): %ld loaded, %ld refused, "
      "%ld failures\n",
      t.name.c_str(), corpus.size(), corpus_loaded, ran, secs, static_cast<unsigned long long>(o.seed), loaded, refused,
      failures);
  for (const auto& call : tl.order)
    if (tl.by_call.count(call))
      std::printf("  %-22s loaded %6ld, refused %6ld\n", call.c_str(), tl.by_call[call].loaded,
                  tl.by_call[call].refused);
  fs::remove_all(work);
  if (detail::log_fd >= 0) {
    ::close(detail::log_fd);
    fs::remove(work.string() + ".log");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace strata_fuzz
