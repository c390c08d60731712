// RuleSet::compile: validates every rule (id, pattern syntax, size and
// worst-case cost) and compiles the rules into one RE2::Set per target.
#include <re2/re2.h>
#include <re2/set.h>

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mineru_health/classifier.h"
#include "rule_set_internal.h"

namespace mineru_health {

namespace {

// ---- worst-case cost of a pattern ---------------------------------------
//
// A DFA for an unanchored search has to remember every position at which a
// match could still be in progress. A bounded run of n character classes
// (`[ab]{14,19}`, `.{0,40}`, `\w\w\w\w`) lets an adversarial text keep up to
// 2^n such sets of positions apart, and RE2::Set never gives up on a slow
// DFA: it rebuilds states byte after byte. Literals synchronise the
// positions and unbounded loops (`*`, `+`) merge them, so only bounded runs
// of classes count. The estimate below is deliberately coarse (an
// alternation counts as a class, a group's run is its longest inner run) and
// errs on the side of refusing.

constexpr long kRunCap = 1L << 20;  // nested repetitions cannot overflow

struct RunCost {
  long total = 0;    // run contributed to the enclosing sequence
  long longest = 0;  // longest run anywhere inside
};

long capped(long value) { return std::min(value, kRunCap); }

class ClassRunParser {
 public:
  explicit ClassRunParser(const std::string& pattern) : p_(pattern) {}

  long run() {
    const RunCost cost = alternation();
    return std::max(cost.total, cost.longest);
  }

 private:
  bool at_end() const { return i_ >= p_.size(); }
  char peek() const { return p_[i_]; }

  // Consumes one (possibly multi-byte) literal character.
  void skip_char() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    std::size_t length = 1;
    if (c >= 0xF0) {
      length = 4;
    } else if (c >= 0xE0) {
      length = 3;
    } else if (c >= 0xC0) {
      length = 2;
    }
    i_ = std::min(p_.size(), i_ + length);
  }

  RunCost alternation() {
    RunCost result;
    int branches = 0;
    while (true) {
      const RunCost branch = sequence();
      ++branches;
      result.total = std::max(result.total, branch.total);
      result.longest = std::max(result.longest, branch.longest);
      if (!at_end() && peek() == '|') {
        ++i_;
        continue;
      }
      break;
    }
    // Two single characters as alternatives are a character class.
    if (branches > 1) result.total = std::max(result.total, 1L);
    result.longest = std::max(result.longest, result.total);
    return result;
  }

  RunCost sequence() {
    RunCost result;
    long running = 0;
    while (!at_end() && peek() != '|' && peek() != ')') {
      RunCost item;
      if (!atom(&item)) continue;  // zero-width or flags: nothing to repeat
      long minimum = 1;
      long maximum = 1;
      bool unbounded = false;
      if (!at_end()) {
        const char q = peek();
        if (q == '*' || q == '+' || q == '?') {
          ++i_;
          minimum = q == '+' ? 1 : 0;
          unbounded = q != '?';
        } else if (q == '{') {
          repetition(&minimum, &maximum, &unbounded);
        }
        if (!at_end() && peek() == '?') ++i_;  // non-greedy
      }
      result.longest = std::max(result.longest, item.longest);
      if (unbounded) {
        // The mandatory copies join the run; the loop itself ends it.
        running = capped(running + capped(item.total * minimum));
        result.longest = std::max(result.longest, running);
        running = 0;
        result.total = kRunCap;  // marks "contains a loop"
      } else {
        running = capped(running + capped(item.total * maximum));
        result.longest = std::max(result.longest, running);
      }
    }
    result.longest = std::max(result.longest, running);
    // A sequence with a loop joins its surroundings by its longest run at
    // most; one without joins by all of it.
    result.total = result.total == kRunCap ? result.longest : running;
    return result;
  }

  // {n}, {n,}, {n,m}; anything else leaves '{' a literal (RE2's reading).
  void repetition(long* minimum, long* maximum, bool* unbounded) {
    std::size_t j = i_ + 1;
    auto number = [&](long* out) {
      const std::size_t start = j;
      long value = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        value = capped(value * 10 + (p_[j] - '0'));
        ++j;
      }
      *out = value;
      return j > start;
    };
    long n = 0;
    long m = 0;
    if (!number(&n)) return;
    bool open = false;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(&m)) open = true;
    } else {
      m = n;
    }
    if (j >= p_.size() || p_[j] != '}') return;
    i_ = j + 1;
    *minimum = n;
    *maximum = open ? n : m;
    *unbounded = open;
  }

  // Parses one atom into *cost; false when it matches no character.
  bool atom(RunCost* cost) {
    const char c = peek();
    switch (c) {
      case '^':
      case '$':
        ++i_;
        return false;
      case '.':
        ++i_;
        cost->total = cost->longest = 1;
        return true;
      case '[':
        bracket();
        cost->total = cost->longest = 1;
        return true;
      case '(':
        return group(cost);
      case '\\':
        return escape(cost);
      case '*':
      case '+':
      case '?':
        ++i_;  // a stray operator (RE2 rejects these; be robust anyway)
        return false;
      default:
        skip_char();
        return true;  // a literal: total 0
    }
  }

  void bracket() {
    ++i_;  // '['
    if (!at_end() && peek() == '^') ++i_;
    if (!at_end() && peek() == ']') ++i_;  // a leading ']' is literal
    while (!at_end() && peek() != ']') {
      if (peek() == '\\') {
        i_ = std::min(p_.size(), i_ + 2);
      } else if (peek() == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        const std::size_t close = p_.find(":]", i_ + 2);
        i_ = close == std::string::npos ? i_ + 1 : close + 2;
      } else {
        skip_char();
      }
    }
    if (!at_end()) ++i_;  // ']'
  }

  bool group(RunCost* cost) {
    ++i_;  // '('
    if (!at_end() && peek() == '?') {
      ++i_;
      if (!at_end() && peek() == 'P') {
        const std::size_t close = p_.find('>', i_);
        i_ = close == std::string::npos ? p_.size() : close + 1;
      } else {
        while (!at_end() && peek() != ':' && peek() != ')') ++i_;
        if (!at_end() && peek() == ')') {
          ++i_;  // (?i): flags only
          return false;
        }
        if (!at_end()) ++i_;  // ':'
      }
    }
    *cost = alternation();
    if (!at_end() && peek() == ')') ++i_;
    return true;
  }

  bool escape(RunCost* cost) {
    ++i_;  // '\'
    if (at_end()) return false;
    const char e = peek();
    switch (e) {
      case 'b':
      case 'B':
      case 'A':
      case 'z':
        ++i_;
        return false;
      case 'Q': {
        const std::size_t close = p_.find("\\E", i_ + 1);
        i_ = close == std::string::npos ? p_.size() : close + 2;
        return true;  // literal text
      }
      case 'p':
      case 'P':
        ++i_;
        if (!at_end() && peek() == '{') {
          const std::size_t close = p_.find('}', i_);
          i_ = close == std::string::npos ? p_.size() : close + 1;
        } else if (!at_end()) {
          skip_char();
        }
        cost->total = cost->longest = 1;
        return true;
      case 'd':
      case 'D':
      case 'w':
      case 'W':
      case 's':
      case 'S':
      case 'C':
        ++i_;
        cost->total = cost->longest = 1;
        return true;
      case 'x':
        ++i_;
        if (!at_end() && peek() == '{') {
          const std::size_t close = p_.find('}', i_);
          i_ = close == std::string::npos ? p_.size() : close + 1;
        } else {
          i_ = std::min(p_.size(), i_ + 2);
        }
        return true;
      default:
        skip_char();
        return true;
    }
  }

  const std::string& p_;
  std::size_t i_ = 0;
};

bool is_token_char(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') ||
         (u >= '0' && u <= '9') || u == '_' || u == '.' || u == '-';
}

}  // namespace

bool is_token(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), is_token_char);
}

RE2::Options pattern_options(std::int64_t max_mem) {
  RE2::Options options;
  options.set_encoding(RE2::Options::EncodingUTF8);
  options.set_case_sensitive(false);
  // Errors are reported as values (RuleError); RE2 must not write to stderr
  // from inside a serving worker.
  options.set_log_errors(false);
  options.set_max_mem(max_mem);
  return options;
}

int pattern_class_run(const std::string& pattern) {
  return static_cast<int>(ClassRunParser(pattern).run());
}

std::string check_pattern(const std::string& pattern,
                          const RuleSetLimits& limits, int* program_size) {
  *program_size = 0;
  if (pattern.empty()) return "empty pattern";
  if (pattern.size() > limits.max_pattern_bytes) {
    return "pattern of " + std::to_string(pattern.size()) +
           " bytes is longer than the limit of " +
           std::to_string(limits.max_pattern_bytes);
  }
  const RE2 regexp(pattern, pattern_options(limits.pattern_max_mem));
  if (!regexp.ok()) {
    if (regexp.error_code() == RE2::ErrorPatternTooLarge) {
      return "pattern too costly: it does not compile within RE2's memory "
             "budget of " +
             std::to_string(limits.pattern_max_mem >> 10) + " KiB";
    }
    return "bad pattern: " + regexp.error();
  }
  *program_size = regexp.ProgramSize();
  if (*program_size > limits.max_program_size) {
    return "pattern too costly: " + std::to_string(*program_size) +
           " RE2 instructions (limit " +
           std::to_string(limits.max_program_size) + ")";
  }
  const int run = pattern_class_run(pattern);
  if (run > limits.max_class_run) {
    return "pattern too costly: a bounded run of " + std::to_string(run) +
           " character classes (limit " + std::to_string(limits.max_class_run) +
           ") can need 2^n DFA states; use + or * instead of {n,m}";
  }
  return "";
}

const char* to_string(Via via) {
  switch (via) {
    case Via::kRoot:
      return "root";
    case Via::kCause:
      return "cause";
    case Via::kContext:
      return "context";
    case Via::kGroupMember:
      return "group";
  }
  return "unknown";
}

const char* to_string(RuleKind kind) {
  switch (kind) {
    case RuleKind::kFatal:
      return "fatal";
    case RuleKind::kTaskLocal:
      return "task_local";
    case RuleKind::kHeuristic:
      return "heuristic";
    case RuleKind::kAmbiguous:
      return "ambiguous";
    case RuleKind::kGeneric:
      return "generic";
  }
  return "unknown";
}

const char* strength_name(RuleKind kind) {
  return kind == RuleKind::kFatal ? "definitive" : to_string(kind);
}

bool is_fatal(RuleKind kind) {
  return kind == RuleKind::kFatal || kind == RuleKind::kHeuristic;
}

const char* to_string(RuleTarget target) {
  switch (target) {
    case RuleTarget::kType:
      return "type";
    case RuleTarget::kMessage:
      return "message";
    case RuleTarget::kFrame:
      return "frame";
  }
  return "unknown";
}

const char* to_string(RuleScope scope) {
  switch (scope) {
    case RuleScope::kEngine:
      return "engine";
    case RuleScope::kAny:
      return "any";
  }
  return "unknown";
}

std::string RuleError::to_string() const {
  std::string out = source;
  if (line > 0) out += ":" + std::to_string(line);
  out += ": ";
  if (!rule_id.empty()) out += "rule '" + rule_id + "': ";
  out += message;
  return out;
}

RuleSet::RuleSet() = default;
RuleSet::~RuleSet() = default;

CompileResult RuleSet::compile(std::vector<Rule> rules,
                               const std::string& source,
                               const RuleSetLimits& limits) {
  CompileResult result;
  if (rules.size() > limits.max_rules) {
    result.errors.push_back({source, 0, "",
                             std::to_string(rules.size()) +
                                 " rules are more than the limit of " +
                                 std::to_string(limits.max_rules)});
    return result;
  }
  std::unique_ptr<RuleSet> rule_set(new RuleSet());
  const RE2::Options set_options = pattern_options(limits.set_max_mem);
  rule_set->type_ = std::make_unique<TargetSet>(set_options);
  rule_set->message_ = std::make_unique<TargetSet>(set_options);
  rule_set->frame_ = std::make_unique<TargetSet>(set_options);

  std::unordered_set<std::string> seen;
  std::int64_t total_program_size = 0;
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const Rule& rule = rules[i];
    auto add_error = [&](std::string message) {
      result.errors.push_back({source, 0, rule.id, std::move(message)});
    };
    if (!is_token(rule.id)) {
      add_error("invalid rule id '" + rule.id +
                "': use letters, digits, '_', '.', '-'");
      continue;
    }
    if (!seen.insert(rule.id).second) {
      add_error("duplicate rule id");
      continue;
    }
    int program_size = 0;
    const std::string problem =
        check_pattern(rule.pattern, limits, &program_size);
    if (!problem.empty()) {
      add_error(problem);
      continue;
    }
    total_program_size += program_size;
    TargetSet& target_set = rule.target == RuleTarget::kType ? *rule_set->type_
                            : rule.target == RuleTarget::kMessage
                                ? *rule_set->message_
                                : *rule_set->frame_;
    std::string error;
    if (target_set.set.Add(rule.pattern, &error) < 0) {
      add_error("bad pattern: " + error);
      continue;
    }
    target_set.rule_index.push_back(i);
    target_set.regexps.push_back(std::make_unique<RE2>(
        rule.pattern, pattern_options(limits.pattern_max_mem)));
  }
  if (!result.errors.empty()) return result;
  if (total_program_size > limits.max_total_program_size) {
    result.errors.push_back(
        {source, 0, "",
         "rule set too costly: " + std::to_string(total_program_size) +
             " RE2 instructions in all (limit " +
             std::to_string(limits.max_total_program_size) + ")"});
    return result;
  }
  for (TargetSet* target_set : {rule_set->type_.get(), rule_set->message_.get(),
                                rule_set->frame_.get()}) {
    if (target_set->empty()) continue;  // an empty set is never matched
    if (!target_set->set.Compile()) {
      result.errors.push_back(
          {source, 0, "",
           "rule set too large to compile within RE2's memory budget of " +
               std::to_string(limits.set_max_mem >> 20) + " MiB"});
      return result;
    }
  }
  rule_set->rules_ = std::move(rules);
  result.rule_set = std::move(rule_set);
  return result;
}

}  // namespace mineru_health
