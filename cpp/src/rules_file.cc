// The operator's rules file: one rule a line, parsed all-or-nothing so that a
// typo never leaves a worker running with half of its rules.
#include <re2/re2.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mineru_health/classifier.h"

namespace mineru_health {

namespace {

constexpr char kFormat[] =
    "expected '<id> <fatal|task_local> <category> <pattern>'";

bool is_space(char c) { return c == ' ' || c == '\t'; }

bool is_token_char(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') ||
         (u >= '0' && u <= '9') || u == '_' || u == '.' || u == '-';
}

bool is_token(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_token_char(c)) return false;
  }
  return true;
}

// Splits off the next whitespace-separated token starting at *pos.
std::string next_token(const std::string& line, std::size_t* pos) {
  while (*pos < line.size() && is_space(line[*pos])) ++*pos;
  const std::size_t start = *pos;
  while (*pos < line.size() && !is_space(line[*pos])) ++*pos;
  return line.substr(start, *pos - start);
}

}  // namespace

ParseRulesResult parse_rules_text(const std::string& text,
                                  const std::string& source) {
  ParseRulesResult result;
  // Same options as the classifier, so a pattern accepted here compiles
  // there too.
  RE2::Options options;
  options.set_encoding(RE2::Options::EncodingUTF8);
  options.set_case_sensitive(false);
  options.set_log_errors(false);

  std::unordered_map<std::string, int> first_line_of_id;
  std::size_t begin = 0;
  // Editors on some systems save a byte-order mark; it is not part of an id.
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) begin = 3;
  int line_number = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    while (!line.empty() && (line.back() == '\r' || is_space(line.back()))) {
      line.pop_back();  // CRLF files and trailing blanks
    }
    std::size_t pos = 0;
    while (pos < line.size() && is_space(line[pos])) ++pos;
    if (pos == line.size() || line[pos] == '#') continue;

    auto add_error = [&](const std::string& rule_id, std::string message) {
      result.errors.push_back(
          {source, line_number, rule_id, std::move(message)});
    };
    Rule rule;
    rule.id = next_token(line, &pos);
    const std::string kind = next_token(line, &pos);
    rule.category = next_token(line, &pos);
    while (pos < line.size() && is_space(line[pos])) ++pos;
    rule.pattern = line.substr(pos);

    if (!is_token(rule.id)) {
      add_error(rule.id, "invalid rule id '" + rule.id +
                             "': use letters, digits, '_', '.', '-'");
      continue;
    }
    if (kind == "fatal") {
      rule.kind = RuleKind::kFatal;
    } else if (kind == "task_local") {
      rule.kind = RuleKind::kTaskLocal;
    } else if (kind.empty()) {
      add_error(rule.id, kFormat);
      continue;
    } else {
      add_error(rule.id,
                "unknown kind '" + kind + "' (expected fatal or task_local)");
      continue;
    }
    if (rule.category.empty() || rule.pattern.empty()) {
      add_error(rule.id, kFormat);
      continue;
    }
    if (!is_token(rule.category)) {
      add_error(rule.id, "invalid category '" + rule.category +
                             "': use letters, digits, '_', '.', '-'");
      continue;
    }
    const auto [it, inserted] = first_line_of_id.emplace(rule.id, line_number);
    if (!inserted) {
      add_error(rule.id, "duplicate rule id (first defined on line " +
                             std::to_string(it->second) + ")");
      continue;
    }
    RE2 regexp(rule.pattern, options);
    if (!regexp.ok()) {
      add_error(rule.id, "bad pattern: " + regexp.error());
      continue;
    }
    result.rules.push_back(std::move(rule));
  }
  if (!result.errors.empty()) result.rules.clear();
  return result;
}

std::vector<Rule> merge_rules(std::vector<Rule> base,
                              const std::vector<Rule>& overrides) {
  std::unordered_map<std::string, std::size_t> index_of;
  for (std::size_t i = 0; i < base.size(); ++i) index_of.emplace(base[i].id, i);
  for (const Rule& rule : overrides) {
    const auto it = index_of.find(rule.id);
    if (it != index_of.end()) {
      // In place: the rule keeps its rank, so ties between rules matching the
      // same frame resolve as before the override.
      base[it->second] = rule;
    } else {
      index_of.emplace(rule.id, base.size());
      base.push_back(rule);
    }
  }
  return base;
}

}  // namespace mineru_health
