// The compiled form of a RuleSet, shared by rule_set.cc (compiling) and
// classifier.cc (matching). Not a public header.
#ifndef MINERU_HEALTH_SRC_RULE_SET_INTERNAL_H_
#define MINERU_HEALTH_SRC_RULE_SET_INTERNAL_H_

#include <re2/re2.h>
#include <re2/set.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mineru_health/classifier.h"

namespace mineru_health {

// Options every pattern is compiled with, in rule sets and in the rules-file
// parser alike, so that a pattern accepted by one is accepted by the other.
RE2::Options pattern_options(std::int64_t max_mem);

// Why `pattern` may not be used ("" when it may): it must compile within
// limits.pattern_max_mem and stay within the size and cost limits. Sets
// *program_size to RE2's instruction count when it compiles.
std::string check_pattern(const std::string& pattern,
                          const RuleSetLimits& limits, int* program_size);

// Letters, digits, '_', '.', '-'; not empty.
bool is_token(const std::string& text);

// All rules of one target: the set for the single matching pass, and each
// rule's own RE2 to locate an excerpt or to fall back on if the set's DFA
// ever runs out of memory.
struct RuleSet::TargetSet {
  explicit TargetSet(const RE2::Options& set_options)
      : set(set_options, RE2::UNANCHORED) {}
  RE2::Set set;
  std::vector<std::size_t> rule_index;  // set index -> RuleSet::rules_ index
  std::vector<std::unique_ptr<RE2>> regexps;

  bool empty() const { return regexps.empty(); }

  // Appends the RuleSet::rules_ index of every rule matching `text`.
  void match(const std::string& text, std::vector<std::size_t>* out) const {
    if (regexps.empty()) return;
    std::vector<int> hits;
    RE2::Set::ErrorInfo info{RE2::Set::kNoError};
    if (set.Match(text, &hits, &info)) {
      for (int hit : hits) {
        out->push_back(rule_index[static_cast<std::size_t>(hit)]);
      }
      return;
    }
    if (info.kind == RE2::Set::kNoError) return;
    // The set could not decide (out of memory): each RE2 falls back to its
    // NFA, still linear in the text.
    for (std::size_t i = 0; i < regexps.size(); ++i) {
      if (RE2::PartialMatch(text, *regexps[i])) out->push_back(rule_index[i]);
    }
  }
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_SRC_RULE_SET_INTERNAL_H_
