// The operator's rules file: one rule a line, read with bounds and parsed
// all-or-nothing so that a typo never leaves a worker running with half of
// its rules.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mineru_health/classifier.h"
#include "rule_set_internal.h"

namespace mineru_health {

namespace {

constexpr char kFormat[] =
    "expected '<id> <kind> <category> [target=...] [origin=...] <pattern>' "
    "or '<id> off'";
constexpr std::size_t kMaxTokenBytes = 200;

bool is_space(char c) { return c == ' ' || c == '\t'; }

// Splits off the next whitespace-separated token starting at *pos.
std::string next_token(const std::string& line, std::size_t* pos) {
  while (*pos < line.size() && is_space(line[*pos])) ++*pos;
  const std::size_t start = *pos;
  while (*pos < line.size() && !is_space(line[*pos])) ++*pos;
  return line.substr(start, *pos - start);
}

bool parse_kind(const std::string& word, RuleKind* kind) {
  static const std::pair<const char*, RuleKind> kKinds[] = {
      {"fatal", RuleKind::kFatal},         {"task_local", RuleKind::kTaskLocal},
      {"heuristic", RuleKind::kHeuristic}, {"ambiguous", RuleKind::kAmbiguous},
      {"generic", RuleKind::kGeneric},
  };
  for (const auto& [name, value] : kKinds) {
    if (word == name) {
      *kind = value;
      return true;
    }
  }
  return false;
}

// Reads "target=..." and "origin=..." options in front of the pattern.
// Returns an error message, "" when fine; *pos ends at the pattern.
std::string parse_options(const std::string& line, std::size_t* pos,
                          Rule* rule) {
  while (true) {
    std::size_t probe = *pos;
    const std::string token = next_token(line, &probe);
    const std::size_t equals = token.find('=');
    if (equals == std::string::npos) return "";
    const std::string key = token.substr(0, equals);
    const std::string value = token.substr(equals + 1);
    if (key == "target") {
      if (value == "type") {
        rule->target = RuleTarget::kType;
      } else if (value == "message") {
        rule->target = RuleTarget::kMessage;
      } else if (value == "frame") {
        rule->target = RuleTarget::kFrame;
      } else {
        return "unknown target '" + value +
               "' (expected type, message or frame)";
      }
    } else if (key == "origin") {
      if (value == "engine") {
        rule->scope = RuleScope::kEngine;
      } else if (value == "any") {
        rule->scope = RuleScope::kAny;
      } else {
        return "unknown origin '" + value + "' (expected engine or any)";
      }
    } else {
      return "";  // not an option: the pattern starts here
    }
    *pos = probe;
  }
}

}  // namespace

std::string Rule::to_line() const {
  return id + " " + to_string(kind) + " " + category +
         " target=" + to_string(target) + " origin=" + to_string(scope) + " " +
         pattern;
}

ParseRulesResult parse_rules_text(const std::string& text,
                                  const std::string& source) {
  ParseRulesResult result;
  std::unordered_set<std::string> builtin_ids;
  for (const Rule& rule : builtin_rules()) builtin_ids.insert(rule.id);
  const RuleSetLimits limits;

  std::unordered_map<std::string, int> first_line_of_id;
  std::size_t rule_count = 0;
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
    if (++rule_count > kMaxRulesFileRules) {
      add_error("", "more than " + std::to_string(kMaxRulesFileRules) +
                        " rules; split the file or merge rules");
      break;
    }
    Rule rule;
    rule.from_operator = true;
    // An operator's rule judges only what an engine or device runtime raised
    // unless it says origin=any: document text must not decide by default.
    rule.scope = RuleScope::kEngine;
    rule.id = next_token(line, &pos);
    const std::string kind = next_token(line, &pos);
    if (!is_token(rule.id) || rule.id.size() > kMaxTokenBytes) {
      add_error(rule.id.substr(0, kMaxTokenBytes),
                "invalid rule id: use at most " +
                    std::to_string(kMaxTokenBytes) +
                    " letters, digits, '_', '.', '-'");
      continue;
    }
    const auto [it, inserted] = first_line_of_id.emplace(rule.id, line_number);
    if (!inserted) {
      add_error(rule.id, "duplicate rule id (first defined on line " +
                             std::to_string(it->second) + ")");
      continue;
    }
    if (kind == "off") {
      std::size_t rest = pos;
      if (!next_token(line, &rest).empty()) {
        add_error(rule.id, "'off' takes nothing after it");
      } else if (builtin_ids.count(rule.id) == 0) {
        add_error(rule.id, "'off' names no built-in rule");
      } else {
        result.disabled.push_back(rule.id);
      }
      continue;
    }
    if (kind.empty()) {
      add_error(rule.id, kFormat);
      continue;
    }
    if (!parse_kind(kind, &rule.kind)) {
      add_error(rule.id, "unknown kind '" + kind.substr(0, kMaxTokenBytes) +
                             "' (expected fatal, heuristic, task_local, "
                             "generic, ambiguous or off)");
      continue;
    }
    rule.category = next_token(line, &pos);
    const std::string option_error = parse_options(line, &pos, &rule);
    if (!option_error.empty()) {
      add_error(rule.id, option_error);
      continue;
    }
    while (pos < line.size() && is_space(line[pos])) ++pos;
    rule.pattern = line.substr(pos);
    if (rule.category.empty() || rule.pattern.empty()) {
      add_error(rule.id, kFormat);
      continue;
    }
    if (!is_token(rule.category) || rule.category.size() > kMaxTokenBytes) {
      add_error(rule.id, "invalid category: use at most " +
                             std::to_string(kMaxTokenBytes) +
                             " letters, digits, '_', '.', '-'");
      continue;
    }
    int program_size = 0;
    const std::string problem =
        check_pattern(rule.pattern, limits, &program_size);
    if (!problem.empty()) {
      add_error(rule.id, problem);
      continue;
    }
    result.rules.push_back(std::move(rule));
  }
  if (!result.errors.empty()) {
    result.rules.clear();
    result.disabled.clear();
  }
  return result;
}

ParseRulesResult read_rules_file(const std::string& path) {
  ParseRulesResult result;
  auto fail = [&](std::string message) {
    result.errors.push_back({path, 0, "", std::move(message)});
    return result;
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer. It changes
  // nothing for the regular files that are accepted.
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return fail(std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    return fail(std::string("cannot stat: ") + std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    const char* what = S_ISDIR(info.st_mode)    ? "a directory"
                       : S_ISFIFO(info.st_mode) ? "a FIFO"
                       : S_ISCHR(info.st_mode)  ? "a character device"
                       : S_ISBLK(info.st_mode)  ? "a block device"
                       : S_ISSOCK(info.st_mode) ? "a socket"
                                                : "not a regular file";
    return fail(std::string("not a regular file (") + what + ")");
  }
  const auto too_large = [&] {
    return fail("larger than the limit of " +
                std::to_string(kMaxRulesFileBytes) + " bytes");
  };
  if (static_cast<std::size_t>(info.st_size) > kMaxRulesFileBytes) {
    return too_large();
  }
  // Read at most one byte past the limit: a file that grew meanwhile is
  // still refused without reading all of it.
  std::string text(kMaxRulesFileBytes + 1, '\0');
  std::size_t size = 0;
  while (size < text.size()) {
    const ssize_t got = ::read(fd, &text[size], text.size() - size);
    if (got < 0) {
      if (errno == EINTR) continue;
      return fail(std::string("cannot read: ") + std::strerror(errno));
    }
    if (got == 0) break;
    size += static_cast<std::size_t>(got);
  }
  if (size > kMaxRulesFileBytes) return too_large();
  text.resize(size);
  return parse_rules_text(text, path);
}

std::vector<Rule> merge_rules(std::vector<Rule> base,
                              const std::vector<Rule>& overrides,
                              const std::vector<std::string>& disabled) {
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
  if (disabled.empty()) return base;
  const std::unordered_set<std::string> off(disabled.begin(), disabled.end());
  std::vector<Rule> kept;
  kept.reserve(base.size());
  for (Rule& rule : base) {
    if (off.count(rule.id) == 0) kept.push_back(std::move(rule));
  }
  return kept;
}

}  // namespace mineru_health
