// strata/core/error.hpp - the one exception type strata throws, and the check macro.
//
// Every runtime failure a user can cause (bad flags, bad shapes, bad files) becomes a
// strata::error whose message names the value and what was expected. Programs catch it at
// the top, print what() and exit non-zero; nothing ends by signal.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata {

class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws strata::error with the pieces streamed together: fail("heads = ", h, " ...").
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace strata

// STRATA_CHECK(cond, pieces...): throws strata::error built from the pieces when cond is false.
#define STRATA_CHECK(cond, ...)               \
  do {                                        \
    if (!(cond)) ::strata::fail(__VA_ARGS__); \
  } while (0)
