// libFuzzer target for the classifier: arbitrary exception chains against
// the builtin rules, plus the two text forms it matches on.
//
// Input: an optional header 0x1D <flags> (bit 0: remote_engine, bit 1: do
// not trust frames of unknown origin), then frames separated by 0x1E
// (record separator); the fields of a frame by 0x1F (unit separator). One
// field is a bare message, two are type<US>message, three or more
// module<US>type<US>message<US>extra... where an extra field "@x" is the
// raise site, "~<r|c|x|g><depth>" how the frame was reached (root, cause,
// context, group member) and its depth, anything else a base class name.
// Any bytes are allowed in any field.
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

using mineru_health::Classification;
using mineru_health::Classifier;
using mineru_health::ClassifierLimits;
using mineru_health::ClassifyOptions;
using mineru_health::Frame;
using mineru_health::Origin;
using mineru_health::Rule;
using mineru_health::RuleKind;
using mineru_health::RuleScope;
using mineru_health::RuleSet;
using mineru_health::RuleTarget;
using mineru_health::Via;

constexpr char kHeader = '\x1d';
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

void apply_extra(Frame* frame, std::string field) {
  if (!field.empty() && field[0] == '@') {
    frame->raised_in = field.substr(1);
    return;
  }
  if (field.size() >= 2 && field[0] == '~') {
    const char how = field[1];
    frame->via = how == 'c'   ? Via::kCause
                 : how == 'x' ? Via::kContext
                 : how == 'g' ? Via::kGroupMember
                              : Via::kRoot;
    int depth = 0;
    for (std::size_t i = 2; i < field.size() && i < 8; ++i) {
      if (field[i] < '0' || field[i] > '9') break;
      depth = depth * 10 + (field[i] - '0');
    }
    frame->depth = depth;
    return;
  }
  frame->bases.push_back(std::move(field));
}

std::vector<Frame> parse_frames(std::string_view input) {
  std::vector<Frame> frames;
  int index = 0;
  for (std::string& record : split(input, kFrameSeparator)) {
    std::vector<std::string> fields = split(record, kFieldSeparator);
    Frame frame;
    // Without an explicit "~": a linear cause chain.
    frame.via = index == 0 ? Via::kRoot : Via::kCause;
    frame.depth = index;
    if (fields.size() == 1) {
      frame.message = std::move(fields[0]);
    } else if (fields.size() == 2) {
      frame.type_name = std::move(fields[0]);
      frame.message = std::move(fields[1]);
    } else {
      frame.module = std::move(fields[0]);
      frame.type_name = std::move(fields[1]);
      frame.message = std::move(fields[2]);
      for (std::size_t i = 3; i < fields.size(); ++i) {
        apply_extra(&frame, std::move(fields[i]));
      }
    }
    frames.push_back(std::move(frame));
    ++index;
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
  ClassifierLimits small{3, 40, 60, 16};
  ClassifierLimits tiny{1, 1, 0, 0};
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

void check_verdict(const Classification& verdict,
                   const std::vector<Frame>& frames,
                   const ClassifierLimits& limits, const RuleSet& rule_set,
                   const ClassifyOptions& options) {
  require(is_valid_utf8(verdict.excerpt), "excerpt is valid UTF-8");
  require(verdict.excerpt.size() <= limits.excerpt_bytes,
          "excerpt within excerpt_bytes");
  require(!(verdict.fatal && verdict.ambiguous), "ambiguous is never fatal");
  if (!verdict.matched) {
    require(!verdict.fatal, "unmatched is not fatal");
    require(!verdict.ambiguous, "unmatched is not ambiguous");
    require(!verdict.remote_engine, "unmatched is not a remote engine's");
    require(verdict.rule.empty(), "unmatched has no rule");
    require(verdict.category.empty(), "unmatched has no category");
    require(verdict.frame_index == -1, "unmatched has frame_index -1");
    require(verdict.excerpt.empty(), "unmatched has no excerpt");
    return;
  }
  const std::size_t considered = std::min(frames.size(), limits.max_frames);
  require(verdict.frame_index >= 0 &&
              static_cast<std::size_t>(verdict.frame_index) < considered,
          "frame_index within the frames considered");
  const Rule* rule = find_rule(rule_set, verdict.rule);
  require(rule != nullptr, "rule names a rule of the set");
  require(verdict.rule_kind == rule->kind, "kind is the rule's");
  const bool downgraded =
      verdict.remote_engine && rule->category != "remote_engine";
  if (downgraded) {
    require(options.remote_engine, "downgraded only for a remote engine");
    require(!verdict.fatal && !verdict.ambiguous,
            "a remote engine's failure is task-local");
    require(verdict.category == "remote_engine", "category remote_engine");
    require(mineru_health::is_fatal(rule->kind),
            "only would-be-fatal verdicts are downgraded");
  } else {
    require(rule->category == verdict.category, "category is the rule's");
    require(verdict.fatal == mineru_health::is_fatal(rule->kind),
            "fatal is the rule's strength");
    require(verdict.ambiguous == (rule->kind == RuleKind::kAmbiguous),
            "ambiguous is the rule's kind");
  }
  const Frame& decider = frames[static_cast<std::size_t>(verdict.frame_index)];
  const Origin origin = mineru_health::frame_origin(decider);
  if (rule->target != RuleTarget::kType && rule->scope == RuleScope::kEngine) {
    require(origin == Origin::kRuntime ||
                (origin == Origin::kUnknown && options.trust_unknown_origin),
            "engine-scoped text decides only for engine frames");
  }
  if (options.remote_engine && verdict.fatal) {
    require(origin == Origin::kRuntime,
            "with a remote engine only in-process runtime evidence is fatal");
  }
}

// With the built-in rules only and nothing cut by the limits, a chain's
// verdict agrees with its frames judged alone: a definitive fatal frame
// anywhere makes the chain fatal (nothing outranks it but another definitive
// frame), and the deciding frame alone gives the same rule.
void check_against_single_frames(const Classifier& classifier,
                                 const ClassifierLimits& limits,
                                 const std::vector<Frame>& frames,
                                 const Classification& verdict) {
  if (frames.size() > limits.max_frames) return;
  std::size_t total = 0;
  for (const Frame& frame : frames) {
    if (frame.message.size() > limits.max_message_bytes) return;
    total += frame.message.size();
  }
  if (total > limits.max_total_message_bytes) return;
  for (std::size_t j = 0; j < frames.size(); ++j) {
    Frame alone_frame = frames[j];
    alone_frame.via = Via::kRoot;
    alone_frame.depth = 0;
    const Classification alone = classifier.classify({alone_frame});
    if (alone.matched && alone.rule_kind == RuleKind::kFatal) {
      require(verdict.fatal, "a definitive fatal frame makes the chain fatal");
    }
    if (static_cast<int>(j) == verdict.frame_index) {
      require(alone.matched && alone.rule == verdict.rule,
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
  std::string input(reinterpret_cast<const char*>(data), size);
  check_text_forms(input);

  ClassifyOptions options;
  if (input.size() >= 2 && input[0] == kHeader) {
    const unsigned char flags = static_cast<unsigned char>(input[1]);
    options.remote_engine = (flags & 1u) != 0;
    options.trust_unknown_origin = (flags & 2u) == 0;
    input.erase(0, 2);
  }

  const std::vector<Frame> frames = parse_frames(input);
  for (const Frame& frame : frames) {
    (void)mineru_health::frame_origin(frame);
  }
  const Classifier classifier(s.rule_set, s.defaults);
  const Classification verdict = classifier.classify(frames, options);
  check_verdict(verdict, frames, s.defaults, *s.rule_set, options);
  if (!options.remote_engine && options.trust_unknown_origin) {
    check_against_single_frames(classifier, s.defaults, frames, verdict);
    // The same chain seen through a remote engine: matched the same, and
    // fatal only on in-process runtime evidence.
    ClassifyOptions remote;
    remote.remote_engine = true;
    const Classification through = classifier.classify(frames, remote);
    check_verdict(through, frames, s.defaults, *s.rule_set, remote);
    require(through.matched == verdict.matched,
            "a remote engine changes the verdict, not whether a rule matched");
  }

  for (const ClassifierLimits& limits : {s.small, s.tiny}) {
    const Classifier limited(s.rule_set, limits);
    check_verdict(limited.classify(frames, options), frames, limits,
                  *s.rule_set, options);
  }
  return 0;
}
