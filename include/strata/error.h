// strata/error.h: the one exception type of the library, and the checks that throw it.
// Every message names the argument, what was expected and what came, e.g.
//   "attention_forward: argument 'k': expected head_dim 64 (same as q), got 63".
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throws strata::Error("<where>: argument '<arg>': expected <expected>, got <got>").
template <typename E, typename G>
[[noreturn]] void throw_arg(const char* where, const char* arg, const E& expected, const G& got) {
  throw Error(detail::cat(where, ": argument '", arg, "': expected ", expected, ", got ", got));
}

}  // namespace strata

// STRATA_CHECK_ARG(cond, where, arg, expected, got): throw a strata::Error naming the argument.
// Never compiled out: user input is checked in release builds too.
#define STRATA_CHECK_ARG(cond, where, arg, expected, got)      \
  do {                                                          \
    if (!(cond)) ::strata::throw_arg((where), (arg), (expected), (got)); \
  } while (0)

// STRATA_CHECK(cond, msg...): a plain check with a composed message.
#define STRATA_CHECK(cond, ...)                                          \
  do {                                                                   \
    if (!(cond)) throw ::strata::Error(::strata::detail::cat(__VA_ARGS__)); \
  } while (0)
