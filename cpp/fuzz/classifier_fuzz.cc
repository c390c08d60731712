// libFuzzer target for the classifier: arbitrary exception chains against
// the builtin rules, plus the two text forms it matches on.
//
// Input: frames separated by 0x1E (record separator); the fields of a frame
// by 0x1F (unit separator). One field is a bare message, two are
// type<US>message, three or more module<US>type<US>message<US>base...
// (the order Python gives them in a traceback line, which keeps seeds
// readable). Any bytes are allowed in any field.
//
// Every violated invariant ends in __builtin_trap() so that libFuzzer keeps
// the input as a crash.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "mineru_health/classifier.h"

namespace {

using mineru_health::fuzz::is_valid_utf8;
using mineru_health::fuzz::require;

using mineru_health::Classifier;
using mineru_health::ClassifierLimits;
using mineru_health::Frame;
using mineru_health::Rule;
using mineru_health::RuleKind;
using mineru_health::RuleSet;
using mineru_health::Verdict;

constexpr char kFrameSeparator = '\x1e';
constexpr char kFieldSeparator = '\x1f';

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find(separator, begin);
    if (end == std::string_view::npos) {
      parts.emplace_back(text.substr(begin));
      return parts;
    }
    parts.emplace_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
}

std::vector<Frame> parse_frames(std::string_view input) {
  std::vector<Frame> frames;
  for (std::string& record : split(input, kFrameSeparator)) {
    std::vector<std::string> fields = split(record, kFieldSeparator);
    Frame frame;
    if (fields.size() == 1) {
      frame.message = std::move(fields[0]);
    } else if (fields.size() == 2) {
      frame.type_name = std::move(fields[0]);
      frame.message = std::move(fields[1]);
    } else {
      frame.module = std::move(fields[0]);
      frame.type_name = std::move(fields[1]);
      frame.message = std::move(fields[2]);
      frame.bases.assign(std::make_move_iterator(fields.begin() + 3),
                         std::make_move_iterator(fields.end()));
    }
    frames.push_back(std::move(frame));
  }
  return frames;
}

// Built once: compiling the builtin rules costs far more than one run.
struct Setup {
  std::shared_ptr<const RuleSet> rule_set;
  ClassifierLimits defaults;
  // Small limits reach the truncation paths (head-and-tail messages, frame
  // cap, excerpt windows cutting through multi-byte characters) on inputs
  // that libFuzzer finds quickly.
  ClassifierLimits small{3, 40, 16};
  ClassifierLimits tiny{1, 1, 0};
};

const Setup& setup() {
  static const Setup* const instance = [] {
    auto* s = new Setup;
    auto compiled = RuleSet::compile(mineru_health::builtin_rules());
    require(compiled.ok(), "builtin rules compile");
    s->rule_set = compiled.rule_set;
    return s;
  }();
  return *instance;
}

const Rule* find_rule(const RuleSet& rule_set, const std::string& id) {
  for (const Rule& rule : rule_set.rules()) {
    if (rule.id == id) return &rule;
  }
  return nullptr;
}

void check_verdict(const Verdict& verdict, std::size_t frame_count,
                   const ClassifierLimits& limits, const RuleSet& rule_set) {
  require(is_valid_utf8(verdict.excerpt), "excerpt is valid UTF-8");
  require(verdict.excerpt.size() <= limits.excerpt_bytes,
          "excerpt within excerpt_bytes");
  if (!verdict.matched) {
    require(!verdict.fatal, "unmatched is not fatal");
    require(verdict.rule_id.empty(), "unmatched has no rule_id");
    require(verdict.category.empty(), "unmatched has no category");
    require(verdict.frame_index == -1, "unmatched has frame_index -1");
    require(verdict.excerpt.empty(), "unmatched has no excerpt");
    return;
  }
  const std::size_t considered = std::min(frame_count, limits.max_frames);
  require(verdict.frame_index >= 0 &&
              static_cast<std::size_t>(verdict.frame_index) < considered,
          "frame_index within the frames considered");
  const Rule* rule = find_rule(rule_set, verdict.rule_id);
  require(rule != nullptr, "rule_id names a rule of the set");
  require(rule->category == verdict.category, "category is the rule's");
  require(verdict.fatal == (rule->kind == RuleKind::kFatal),
          "fatal is the rule's kind");
}

// Frames are judged one by one, so a chain's verdict must agree with the
// verdicts of its frames taken alone: a task-local frame wins from wherever
// it is, the first fatal frame decides otherwise.
void check_against_single_frames(const Classifier& classifier,
                                 const ClassifierLimits& limits,
                                 const std::vector<Frame>& frames,
                                 const Verdict& verdict) {
  const std::size_t count = std::min(frames.size(), limits.max_frames);
  for (std::size_t j = 0; j < count; ++j) {
    const Verdict alone = classifier.classify({frames[j]});
    const int index = static_cast<int>(j);
    if (alone.matched && !alone.fatal) {
      require(verdict.matched && !verdict.fatal && verdict.frame_index <= index,
              "a task-local frame makes the chain task-local");
    }
    if (alone.matched && alone.fatal) {
      require(verdict.matched, "a fatal frame makes the chain match");
      if (verdict.fatal) {
        require(verdict.frame_index <= index, "the first fatal frame decides");
      }
    }
    if (index == verdict.frame_index) {
      require(alone.matched && alone.rule_id == verdict.rule_id,
              "the deciding frame alone gives the same rule");
    }
  }
}

void check_text_forms(const std::string& text) {
  const std::string sanitized = mineru_health::sanitize_utf8(text);
  require(is_valid_utf8(sanitized), "sanitize_utf8 output is valid UTF-8");
  // One U+FFFD per run of bad bytes, runs separated by good bytes.
  require(sanitized.size() <= 2 * text.size() + 1,
          "sanitize_utf8 output at most 2n+1 bytes");
  require(mineru_health::sanitize_utf8(sanitized) == sanitized,
          "sanitize_utf8 is idempotent");
  if (is_valid_utf8(text)) {
    require(sanitized == text, "sanitize_utf8 keeps valid UTF-8 unchanged");
  }

  const std::string compact = mineru_health::compact_form(text);
  require(compact.size() <= text.size(), "compact_form never grows");
  std::string non_ascii_in;
  std::string non_ascii_out;
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) non_ascii_in.push_back(c);
  }
  for (char c : compact) {
    const unsigned char u = static_cast<unsigned char>(c);
    require(u >= 0x80 || (u >= 'a' && u <= 'z') || (u >= '0' && u <= '9'),
            "compact_form keeps lower-case alnum and non-ASCII only");
    if (u >= 0x80) non_ascii_out.push_back(c);
  }
  require(non_ascii_in == non_ascii_out,
          "compact_form keeps every non-ASCII byte in order");
  require(mineru_health::compact_form(compact) == compact,
          "compact_form is idempotent");
  require(is_valid_utf8(mineru_health::compact_form(sanitized)),
          "compact_form of valid UTF-8 is valid UTF-8");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  const Setup& s = setup();
  const std::string input(reinterpret_cast<const char*>(data), size);
  check_text_forms(input);

  const std::vector<Frame> frames = parse_frames(input);
  const Classifier classifier(s.rule_set, s.defaults);
  const Verdict verdict = classifier.classify(frames);
  check_verdict(verdict, frames.size(), s.defaults, *s.rule_set);
  check_against_single_frames(classifier, s.defaults, frames, verdict);

  for (const ClassifierLimits& limits : {s.small, s.tiny}) {
    const Classifier limited(s.rule_set, limits);
    check_verdict(limited.classify(frames), frames.size(), limits, *s.rule_set);
  }
  return 0;
}
