// Classifier: compiles rules into one RE2::Set per kind and decides, for a
// chain of exception frames, whether the failure killed the engine.
#include "mineru_health/classifier.h"

#include <re2/re2.h>
#include <re2/set.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <unordered_set>
#include <utility>

namespace mineru_health {

namespace {

// Identifier-like fields (module, type name, base names) are short in any
// real exception; a hostile object could make them huge, so they are capped
// independently of the message limit.
constexpr std::size_t kMaxNameBytes = 1024;
constexpr std::size_t kMaxBases = 64;

// The set's DFA gets a generous budget: RE2 never bails out of a many-match
// (Set) DFA for being slow, it only resets its cache, so a larger cache means
// fewer resets on hostile input. Memory stays bounded by this number.
constexpr std::int64_t kSetMaxMem = 64 << 20;

RE2::Options matching_options() {
  RE2::Options options;
  options.set_encoding(RE2::Options::EncodingUTF8);
  options.set_case_sensitive(false);
  // Errors are reported as values (RuleError); RE2 must not write to stderr
  // from inside a serving worker.
  options.set_log_errors(false);
  return options;
}

bool is_valid_id(const std::string& id) {
  if (id.empty()) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    unsigned char u = static_cast<unsigned char>(c);
    return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') ||
           (u >= '0' && u <= '9') || u == '_' || u == '.' || u == '-';
  });
}

// Length of the valid UTF-8 sequence starting at text[i], or 0 when the
// bytes there are not one (overlong forms, surrogates such as those Python's
// 'surrogatepass' writes, code points above U+10FFFF, truncated sequences).
std::size_t utf8_sequence_length(const std::string& text, std::size_t i) {
  const auto byte = [&](std::size_t k) {
    return static_cast<unsigned char>(text[k]);
  };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  std::size_t length = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 == 0xE0) {
    length = 3;
    lo = 0xA0;
  } else if (b0 == 0xED) {
    length = 3;
    hi = 0x9F;  // D800..DFFF are surrogates
  } else if (b0 >= 0xE1 && b0 <= 0xEF) {
    length = 3;
  } else if (b0 == 0xF0) {
    length = 4;
    lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    length = 4;
  } else if (b0 == 0xF4) {
    length = 4;
    hi = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  const unsigned char b1 = byte(i + 1);
  if (b1 < lo || b1 > hi) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    const unsigned char b = byte(i + k);
    if (b < 0x80 || b > 0xBF) return 0;
  }
  return length;
}

bool is_utf8_continuation(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

// Moves `pos` back to the start of the UTF-8 sequence it falls in; `text`
// must be valid UTF-8.
std::size_t floor_to_boundary(const std::string& text, std::size_t pos) {
  if (pos >= text.size()) return text.size();
  while (pos > 0 && is_utf8_continuation(text[pos])) --pos;
  return pos;
}

std::string truncated_copy(const std::string& text, std::size_t max_bytes) {
  return text.size() <= max_bytes ? text : text.substr(0, max_bytes);
}

// Messages over the limit keep their head and tail: an exception's type tends
// to be echoed at the start and its root cause at the end. The joint is a
// newline so that no pattern using '.' can match across it.
std::string bounded_message(const std::string& message, std::size_t max_bytes) {
  if (message.size() <= max_bytes) return message;
  const std::size_t half = max_bytes / 2;
  std::string out;
  out.reserve(max_bytes + 8);
  out.append(message, 0, half);
  out.append("\n...\n");
  out.append(message, message.size() - half, half);
  return out;
}

// "module.Type (Base1 Base2): message", the one string rules are written
// against (see docs/rules.md).
std::string frame_text(const Frame& frame, const ClassifierLimits& limits) {
  std::string text = truncated_copy(frame.module, kMaxNameBytes);
  if (!text.empty()) text.push_back('.');
  text += truncated_copy(frame.type_name, kMaxNameBytes);
  if (!frame.bases.empty()) {
    text += " (";
    const std::size_t count = std::min(frame.bases.size(), kMaxBases);
    for (std::size_t i = 0; i < count; ++i) {
      if (i > 0) text.push_back(' ');
      text += truncated_copy(frame.bases[i], kMaxNameBytes);
    }
    text.push_back(')');
  }
  // A frame parsed from bare text has no name; its line is the message.
  if (!text.empty()) text += ": ";
  text += bounded_message(frame.message, limits.max_message_bytes);
  return text;
}

std::string head_excerpt(const std::string& sanitized, std::size_t max_bytes) {
  if (sanitized.size() <= max_bytes) return sanitized;
  return sanitized.substr(0, floor_to_boundary(sanitized, max_bytes));
}

// A window of at most `max_bytes` of valid UTF-8 around [begin, end).
std::string window_excerpt(const std::string& sanitized, std::size_t begin,
                           std::size_t end, std::size_t max_bytes) {
  if (sanitized.size() <= max_bytes) return sanitized;
  const std::size_t match_length = end - begin;
  std::size_t start = 0;
  if (match_length >= max_bytes) {
    start = begin;
  } else {
    const std::size_t context = (max_bytes - match_length) / 2;
    start = begin > context ? begin - context : 0;
  }
  start = std::min(start, sanitized.size() - max_bytes);
  start = floor_to_boundary(sanitized, start);
  std::size_t stop = floor_to_boundary(sanitized, start + max_bytes);
  return sanitized.substr(start, stop - start);
}

}  // namespace

const char* to_string(RuleKind kind) {
  switch (kind) {
    case RuleKind::kFatal:
      return "fatal";
    case RuleKind::kTaskLocal:
      return "task_local";
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

std::string sanitize_utf8(const std::string& text) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  const std::size_t size = text.size();
  std::size_t i = 0;
  std::size_t run_start = 0;  // start of the valid bytes not yet copied
  bool in_invalid_run = false;
  while (i < size) {
    // Runs of ASCII are the common case: skip them without decoding.
    while (i < size && static_cast<unsigned char>(text[i]) < 0x80) ++i;
    if (i == size) break;
    const std::size_t length = utf8_sequence_length(text, i);
    if (length > 0) {
      i += length;
      continue;
    }
    out.append(text, run_start, i - run_start);
    // One U+FFFD per run of bad bytes keeps the output no larger than twice
    // the input whatever the bytes are.
    if (!in_invalid_run || run_start != i) out.append(kReplacement, 3);
    in_invalid_run = true;
    ++i;
    run_start = i;
  }
  out.append(text, run_start, size - run_start);
  return out;
}

std::string compact_form(const std::string& text) {
  // 0: drop; 1: keep as is (ASCII alnum lower case, digits, non-ASCII);
  // 2: lower-case.
  static const auto kAction = [] {
    std::array<unsigned char, 256> table{};
    for (int c = 0; c < 256; ++c) {
      if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
        table[static_cast<std::size_t>(c)] = 1;
      } else if (c >= 'A' && c <= 'Z') {
        table[static_cast<std::size_t>(c)] = 2;
      }
    }
    return table;
  }();
  std::string out(text.size(), '\0');
  char* const begin = &out[0];
  char* dst = begin;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    const unsigned char action = kAction[u];
    // Branch-free: always write, advance only past kept bytes. Adding 32
    // lower-cases an ASCII capital.
    *dst = static_cast<char>(u + (action == 2 ? 32 : 0));
    dst += action != 0;
  }
  out.resize(static_cast<std::size_t>(dst - begin));
  return out;
}

// All rules of one kind: the set for the single matching pass, and each
// rule's own RE2 to locate an excerpt or to fall back on if the set's DFA
// ever runs out of memory.
struct RuleSet::KindSet {
  explicit KindSet(const RE2::Options& set_options)
      : set(set_options, RE2::UNANCHORED) {}
  RE2::Set set;
  std::vector<std::size_t> rule_index;  // set index -> RuleSet::rules_ index
  std::vector<std::unique_ptr<RE2>> regexps;

  // Smallest matching set index, or -1.
  int first_match(const std::string& text) const {
    if (regexps.empty()) return -1;
    std::vector<int> hits;
    RE2::Set::ErrorInfo info{RE2::Set::kNoError};
    if (set.Match(text, &hits, &info)) {
      return *std::min_element(hits.begin(), hits.end());
    }
    if (info.kind == RE2::Set::kNoError) return -1;
    // The set could not decide (out of memory): each RE2 falls back to its
    // NFA, still linear in the text.
    for (std::size_t i = 0; i < regexps.size(); ++i) {
      if (RE2::PartialMatch(text, *regexps[i])) return static_cast<int>(i);
    }
    return -1;
  }
};

RuleSet::RuleSet() = default;
RuleSet::~RuleSet() = default;

CompileResult RuleSet::compile(std::vector<Rule> rules,
                               const std::string& source) {
  CompileResult result;
  std::unique_ptr<RuleSet> rule_set(new RuleSet());
  RE2::Options set_options = matching_options();
  set_options.set_max_mem(kSetMaxMem);
  rule_set->fatal_ = std::make_unique<KindSet>(set_options);
  rule_set->task_local_ = std::make_unique<KindSet>(set_options);

  std::unordered_set<std::string> seen;
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const Rule& rule = rules[i];
    auto add_error = [&](std::string message) {
      result.errors.push_back({source, 0, rule.id, std::move(message)});
    };
    if (!is_valid_id(rule.id)) {
      add_error("invalid rule id '" + rule.id +
                "': use letters, digits, '_', '.', '-'");
      continue;
    }
    if (!seen.insert(rule.id).second) {
      add_error("duplicate rule id");
      continue;
    }
    if (rule.pattern.empty()) {
      add_error("empty pattern");
      continue;
    }
    auto regexp = std::make_unique<RE2>(rule.pattern, matching_options());
    if (!regexp->ok()) {
      add_error("bad pattern: " + regexp->error());
      continue;
    }
    KindSet& kind_set = rule.kind == RuleKind::kFatal ? *rule_set->fatal_
                                                      : *rule_set->task_local_;
    std::string error;
    if (kind_set.set.Add(rule.pattern, &error) < 0) {
      add_error("bad pattern: " + error);
      continue;
    }
    kind_set.rule_index.push_back(i);
    kind_set.regexps.push_back(std::move(regexp));
  }
  if (!result.errors.empty()) return result;
  for (KindSet* kind_set :
       {rule_set->fatal_.get(), rule_set->task_local_.get()}) {
    if (kind_set->regexps.empty()) continue;  // an empty set is never matched
    if (!kind_set->set.Compile()) {
      result.errors.push_back(
          {source, 0, "", "rule set too large to compile (RE2 out of memory)"});
      return result;
    }
  }
  rule_set->rules_ = std::move(rules);
  result.rule_set = std::move(rule_set);
  return result;
}

Classifier::Classifier(std::shared_ptr<const RuleSet> rule_set,
                       ClassifierLimits limits)
    : rule_set_(std::move(rule_set)), limits_(limits) {
  if (rule_set_ == nullptr) {
    // An empty set classifies everything as unmatched (task-local) rather
    // than crashing on a caller's mistake.
    rule_set_ = RuleSet::compile({}).rule_set;
  }
}

Verdict Classifier::classify(const std::vector<Frame>& frames) const {
  struct Hit {
    const RuleSet::KindSet* kind_set = nullptr;
    int set_index = -1;
    int frame_index = -1;
    bool in_sanitized = false;
    std::string sanitized;
  };
  // Matches one frame against one kind, sanitized form first so that an
  // excerpt can be located; the compact form only when that missed.
  auto match = [](const RuleSet::KindSet& kind_set,
                  const std::string& sanitized, const std::string& compact,
                  Hit* hit) {
    int index = kind_set.first_match(sanitized);
    bool in_sanitized = index >= 0;
    const int compact_index = kind_set.first_match(compact);
    // The lower rule index wins whichever form it matched, so that rule
    // order alone decides ties.
    if (compact_index >= 0 && (index < 0 || compact_index < index)) {
      index = compact_index;
      in_sanitized = false;
    }
    if (index < 0) return false;
    hit->kind_set = &kind_set;
    hit->set_index = index;
    hit->in_sanitized = in_sanitized;
    return true;
  };

  Hit fatal_hit;
  Hit task_local_hit;
  const std::size_t count =
      std::min({frames.size(), limits_.max_frames,
                static_cast<std::size_t>(std::numeric_limits<int>::max())});
  for (std::size_t f = 0; f < count; ++f) {
    std::string sanitized = sanitize_utf8(frame_text(frames[f], limits_));
    const std::string compact = compact_form(sanitized);
    if (match(*rule_set_->task_local_, sanitized, compact, &task_local_hit)) {
      // Task-local wins over any fatal frame, so later frames cannot change
      // the answer.
      task_local_hit.frame_index = static_cast<int>(f);
      task_local_hit.sanitized = std::move(sanitized);
      break;
    }
    if (fatal_hit.kind_set == nullptr &&
        match(*rule_set_->fatal_, sanitized, compact, &fatal_hit)) {
      fatal_hit.frame_index = static_cast<int>(f);
      fatal_hit.sanitized = std::move(sanitized);
    }
  }

  Verdict verdict;
  Hit* hit = task_local_hit.kind_set != nullptr ? &task_local_hit
             : fatal_hit.kind_set != nullptr    ? &fatal_hit
                                                : nullptr;
  if (hit == nullptr) return verdict;
  const std::size_t set_index = static_cast<std::size_t>(hit->set_index);
  const Rule& rule = rule_set_->rules()[hit->kind_set->rule_index[set_index]];
  verdict.matched = true;
  verdict.fatal = rule.kind == RuleKind::kFatal;
  verdict.rule_id = rule.id;
  verdict.category = rule.category;
  verdict.frame_index = hit->frame_index;

  const std::string& text = hit->sanitized;
  re2::StringPiece found;
  if (hit->in_sanitized &&
      hit->kind_set->regexps[set_index]->Match(text, 0, text.size(),
                                               RE2::UNANCHORED, &found, 1)) {
    const auto begin = static_cast<std::size_t>(found.data() - text.data());
    verdict.excerpt = window_excerpt(text, begin, begin + found.size(),
                                     limits_.excerpt_bytes);
  } else {
    const Frame& frame = frames[static_cast<std::size_t>(hit->frame_index)];
    verdict.excerpt = head_excerpt(
        sanitize_utf8(truncated_copy(frame.message, limits_.excerpt_bytes + 4)),
        limits_.excerpt_bytes);
  }
  return verdict;
}

}  // namespace mineru_health
