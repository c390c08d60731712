// libFuzzer target for the operator's rules file: arbitrary text through
// parse_rules_text, then, when it parses, through RuleSet::compile on its
// own and merged over the builtin rules (what a worker does with
// MINERU_HEALTH_RULES: overrides replace built-ins in place, "<id> off"
// removes them), and a classification with the result. Also checks that the
// pattern-cost analysis (pattern_class_run) never crashes or loops on any
// line, and that a parsed rule respects the cost limits it was checked
// against.
//
// Input: the file's bytes. Every violated invariant ends in __builtin_trap().
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "fuzz_support.h"
#include "mineru_health/classifier.h"

namespace {

using mineru_health::fuzz::is_valid_utf8;
using mineru_health::fuzz::require;

using mineru_health::Classification;
using mineru_health::Classifier;
using mineru_health::CompileResult;
using mineru_health::Frame;
using mineru_health::ParseRulesResult;
using mineru_health::Rule;
using mineru_health::RuleError;
using mineru_health::RuleKind;
using mineru_health::RuleSet;
using mineru_health::RuleSetLimits;

constexpr char kSource[] = "<fuzz>";

bool is_token(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    const bool ok = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') ||
                    (u >= '0' && u <= '9') || u == '_' || u == '.' || u == '-';
    if (!ok) return false;
  }
  return true;
}

bool is_blank(char c) { return c == ' ' || c == '\t'; }

// A set that parsed must compile; the one failure left is RE2 running out of
// its memory budget for the whole set, which no single line can be blamed
// for.
void check_compiled(const CompileResult& compiled) {
  require(compiled.ok() == compiled.errors.empty(),
          "compile: ok() iff no errors");
  for (const RuleError& error : compiled.errors) {
    require(error.rule_id.empty() && error.source == kSource,
            "compile fails only for the set's size, never for a parsed rule");
  }
}

void check_classification(const std::shared_ptr<const RuleSet>& rule_set,
                          const std::string& text) {
  const Classifier classifier(rule_set);
  const std::vector<Frame> frames = {
      {"vllm.v1.engine.exceptions",
       "EngineDeadError",
       {"Exception", "BaseException"},
       "EngineCore encountered an issue. See stack trace (above) for the root "
       "cause."},
      {"builtins", "ValueError", {"Exception", "BaseException"}, text},
      {"", "", {}, text},
  };
  const Classification verdict = classifier.classify(frames);
  require(is_valid_utf8(verdict.excerpt), "excerpt is valid UTF-8");
  require(
      verdict.excerpt.size() <= mineru_health::ClassifierLimits{}.excerpt_bytes,
      "excerpt within excerpt_bytes");
  if (!verdict.matched) {
    require(verdict.rule.empty() && verdict.frame_index == -1,
            "unmatched has no rule and frame_index -1");
    return;
  }
  require(verdict.frame_index >= 0 &&
              static_cast<std::size_t>(verdict.frame_index) < frames.size(),
          "frame_index in range");
  bool found = false;
  for (const Rule& rule : rule_set->rules()) {
    if (rule.id != verdict.rule) continue;
    found = true;
    require(rule.category == verdict.category &&
                mineru_health::is_fatal(rule.kind) == verdict.fatal &&
                (rule.kind == RuleKind::kAmbiguous) == verdict.ambiguous &&
                rule.kind == verdict.rule_kind,
            "verdict carries its rule's kind and category");
  }
  require(found, "rule names a rule of the set");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const ParseRulesResult parsed =
      mineru_health::parse_rules_text(text, kSource);
  require(parsed.ok() == parsed.errors.empty(), "parse: ok() iff no errors");

  std::size_t line_count = 1;
  for (char c : text) line_count += c == '\n';
  // The cost analysis takes any line, valid pattern or not.
  {
    std::size_t begin = 0;
    while (begin <= text.size()) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      require(mineru_health::pattern_class_run(
                  text.substr(begin, end - begin)) >= 0,
              "pattern_class_run is never negative");
      begin = end + 1;
    }
  }
  for (const RuleError& error : parsed.errors) {
    require(error.source == kSource, "error names the source");
    require(
        error.line >= 1 && static_cast<std::size_t>(error.line) <= line_count,
        "error line within the file");
    require(!error.message.empty(), "error has a message");
  }
  if (!parsed.ok()) {
    require(parsed.rules.empty(), "all-or-nothing: no rules on error");
    return 0;
  }

  std::unordered_set<std::string> ids;
  for (const Rule& rule : parsed.rules) {
    require(is_token(rule.id), "id is a token");
    require(is_token(rule.category), "category is a token");
    require(!rule.pattern.empty(), "pattern not empty");
    require(rule.pattern.find('\n') == std::string::npos,
            "pattern within one line");
    // A CR inside a line is pattern text; only the line's end is trimmed.
    require(!is_blank(rule.pattern.front()) && !is_blank(rule.pattern.back()) &&
                rule.pattern.back() != '\r',
            "pattern trimmed");
    require(ids.insert(rule.id).second, "ids unique");
    require(rule.from_operator, "a rules file's rules are the operator's");
    require(rule.pattern.size() <= RuleSetLimits{}.max_pattern_bytes,
            "pattern within max_pattern_bytes");
    require(mineru_health::pattern_class_run(rule.pattern) <=
                RuleSetLimits{}.max_class_run,
            "pattern within max_class_run");
  }
  require(parsed.rules.size() + parsed.disabled.size() <=
              mineru_health::kMaxRulesFileRules,
          "at most kMaxRulesFileRules lines");
  const std::vector<Rule> builtin = mineru_health::builtin_rules();
  for (const std::string& id : parsed.disabled) {
    bool known = false;
    for (const Rule& b : builtin) known = known || b.id == id;
    require(known, "'off' names a built-in rule");
    require(ids.insert(id).second, "an id is defined or turned off once");
  }

  const CompileResult own = RuleSet::compile(parsed.rules, kSource);
  check_compiled(own);
  if (own.ok()) {
    require(own.rule_set->rules().size() == parsed.rules.size(),
            "compiled set keeps every rule");
    check_classification(own.rule_set, text);
  }

  std::size_t new_ids = 0;
  for (const Rule& rule : parsed.rules) {
    bool replaces = false;
    for (const Rule& b : builtin) replaces = replaces || b.id == rule.id;
    new_ids += replaces ? 0 : 1;
  }
  const std::vector<Rule> merged =
      mineru_health::merge_rules(builtin, parsed.rules, parsed.disabled);
  require(merged.size() == builtin.size() + new_ids - parsed.disabled.size(),
          "merge replaces same ids in place, appends the rest, drops 'off'");
  for (const Rule& rule : merged) {
    for (const std::string& id : parsed.disabled) {
      require(rule.id != id, "a rule turned off is gone");
    }
  }
  const CompileResult combined = RuleSet::compile(merged, kSource);
  check_compiled(combined);
  if (combined.ok()) check_classification(combined.rule_set, text);
  return 0;
}
