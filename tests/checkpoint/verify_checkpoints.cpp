// verify_checkpoints DIR...: every checkpoint in each --save DIR verifies as resume would check
// it (checkpoint_files::problem: COMPLETE against the manifest, every rank file's size and
// CRC-32, every manifest value), and nothing is left half-done: no step directory without
// COMPLETE, no temporary file, no write-test probe. Prints one line per DIR, or what is wrong;
// exits 1 if anything is.
#include <cstdio>
#include <filesystem>
#include <string>

#include <strata/train/checkpoint.hpp>

namespace fs = std::filesystem;
namespace cf = strata::checkpoint_files;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: verify_checkpoints DIR...\n");
    return 2;
  }
  int bad = 0;
  for (int a = 1; a < argc; ++a) {
    const std::string dir = argv[a];
    if (!fs::is_directory(dir)) {
      std::printf("%s: not a directory\n", dir.c_str());
      ++bad;
      continue;
    }
    const auto steps = cf::steps(dir);
    int wrong = 0;
    for (const int step : steps) {
      const std::string why = cf::problem(cf::step_dir(dir, step));
      if (!why.empty()) {
        std::printf("%s: %s\n", dir.c_str(), why.c_str());
        ++wrong;
      }
    }
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() == ".tmp" || name.rfind(".strata-write-test", 0) == 0) {
        std::printf("%s: left behind: %s\n", dir.c_str(), e.path().string().c_str());
        ++wrong;
      }
    }
    if (steps.empty()) {
      std::printf("%s: no checkpoints\n", dir.c_str());
      ++wrong;
    }
    if (wrong == 0) std::printf("%s: %zu checkpoints verify\n", dir.c_str(), steps.size());
    bad += wrong;
  }
  return bad == 0 ? 0 : 1;
}
