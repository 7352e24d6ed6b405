// The directory of the running test program. The files a test reads from the checkout (the
// Hugging Face fixtures, the fuzz targets' seed corpora) are linked next to the program by CMake
// at configure time rather than named by a path compiled into it: no compile command then names
// the checkout, so ccache serves a fresh clone in another directory from the same cache.
#pragma once
#include <filesystem>

namespace strata_test {

inline std::filesystem::path program_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path(); }

}  // namespace strata_test
