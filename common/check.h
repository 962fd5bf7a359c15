// Check macros for programming errors (never for input: input gets a Status).
//
// A failed check prints the expression, both values and file:line, then
// aborts, in the manner of GLOO_ENFORCE_EQ. They stay on in release builds:
// a broken invariant in a training service must not silently corrupt weights.
//
// Thread safety: the macros may be used from any thread.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace gridsync::internal {

[[noreturn]] inline void CheckFailed(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "gridsync check failed at %s:%d: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

template <typename A, typename B>
std::string DescribeComparison(const char* expr_a, const char* op, const char* expr_b, const A& a,
                               const B& b) {
  std::ostringstream out;
  out << expr_a << " " << op << " " << expr_b << " (" << a << " vs " << b << ")";
  return out.str();
}

}  // namespace gridsync::internal

#define GRIDSYNC_CHECK(cond)                                                 \
  do {                                                                       \
    if (!(cond)) ::gridsync::internal::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

#define GRIDSYNC_CHECK_OP(a, op, b)                                                        \
  do {                                                                                     \
    const auto& gridsync_a_ = (a);                                                         \
    const auto& gridsync_b_ = (b);                                                         \
    if (!(gridsync_a_ op gridsync_b_))                                                     \
      ::gridsync::internal::CheckFailed(                                                   \
          __FILE__, __LINE__,                                                              \
          ::gridsync::internal::DescribeComparison(#a, #op, #b, gridsync_a_, gridsync_b_)); \
  } while (0)

#define GRIDSYNC_CHECK_EQ(a, b) GRIDSYNC_CHECK_OP(a, ==, b)
#define GRIDSYNC_CHECK_NE(a, b) GRIDSYNC_CHECK_OP(a, !=, b)
#define GRIDSYNC_CHECK_LT(a, b) GRIDSYNC_CHECK_OP(a, <, b)
#define GRIDSYNC_CHECK_LE(a, b) GRIDSYNC_CHECK_OP(a, <=, b)
#define GRIDSYNC_CHECK_GT(a, b) GRIDSYNC_CHECK_OP(a, >, b)
#define GRIDSYNC_CHECK_GE(a, b) GRIDSYNC_CHECK_OP(a, >=, b)
