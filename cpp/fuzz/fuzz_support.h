// Helpers shared by the libFuzzer targets in this folder.
#ifndef MINERU_HEALTH_FUZZ_FUZZ_SUPPORT_H_
#define MINERU_HEALTH_FUZZ_FUZZ_SUPPORT_H_

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace mineru_health::fuzz {

// Stops the fuzzer with a readable reason when an invariant breaks.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "invariant violated: %s\n", what);
  __builtin_trap();
}

// An oracle independent of the code under test: nlohmann's strict dump
// rejects invalid UTF-8 (overlong forms and surrogates included).
inline bool is_valid_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace mineru_health::fuzz

#endif  // MINERU_HEALTH_FUZZ_FUZZ_SUPPORT_H_
