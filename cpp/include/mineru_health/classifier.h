// Fatal-error classifier: decides whether a task failure killed the worker's
// inference engine (fatal) or only the task (task-local).
//
//   auto compiled =
//   mineru_health::RuleSet::compile(mineru_health::builtin_rules());
//   mineru_health::Classifier classifier(compiled.rule_set);
//   std::vector<mineru_health::Frame> frames = {{"vllm.v1.engine.exceptions",
//       "EngineDeadError", {"Exception"}, "EngineCore encountered an issue."}};
//   mineru_health::Verdict verdict = classifier.classify(frames);  // fatal
//
// Thread-safety: RuleSet is immutable once compiled and shared as
// shared_ptr<const RuleSet>; Classifier is immutable and safe to call from any
// number of threads at once.
#ifndef MINERU_HEALTH_CLASSIFIER_H_
#define MINERU_HEALTH_CLASSIFIER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace re2 {
class RE2;
class Set;
}  // namespace re2

namespace mineru_health {

// One exception of a failure chain, outermost first. Texts may be any bytes:
// invalid UTF-8 is replaced before matching.
struct Frame {
  std::string module;
  std::string type_name;
  std::vector<std::string>
      bases;  // MRO names after type_name, e.g. "RuntimeError"
  std::string message;
};

enum class RuleKind { kFatal, kTaskLocal };

const char* to_string(RuleKind kind);

struct Rule {
  std::string id;  // unique; a rules file reusing an id replaces that rule
  RuleKind kind = RuleKind::kFatal;
  std::string category;  // e.g. "engine_dead", "cuda", "bad_input"
  std::string pattern;   // RE2 syntax, matched case-insensitively
};

// Why a rule could not be compiled or parsed. `line` is 0 when not from a file.
struct RuleError {
  std::string source;  // file path, or "<builtin>"
  int line = 0;
  std::string rule_id;
  std::string message;

  std::string to_string() const;
};

// Limits that keep one classification bounded in time and memory whatever
// the exception looks like.
struct ClassifierLimits {
  std::size_t max_frames = 64;                // further frames are ignored
  std::size_t max_message_bytes = 16u << 20;  // longer: head and tail kept
  std::size_t excerpt_bytes = 200;
};

class RuleSet;

struct CompileResult {
  std::shared_ptr<const RuleSet> rule_set;  // null when errors is not empty
  std::vector<RuleError> errors;
  bool ok() const { return rule_set != nullptr; }
};

// An immutable, compiled set of rules: one RE2::Set per kind.
class RuleSet {
 public:
  // Compiles every rule; all-or-nothing. Duplicate ids are errors here (merge
  // first with merge_rules when overriding is intended).
  [[nodiscard]] static CompileResult compile(
      std::vector<Rule> rules, const std::string& source = "<builtin>");
  ~RuleSet();
  RuleSet(const RuleSet&) = delete;
  RuleSet& operator=(const RuleSet&) = delete;

  const std::vector<Rule>& rules() const { return rules_; }

 private:
  RuleSet();
  friend class Classifier;
  struct KindSet;
  std::vector<Rule> rules_;
  std::unique_ptr<KindSet> fatal_;
  std::unique_ptr<KindSet> task_local_;
};

struct Verdict {
  bool fatal = false;
  bool matched = false;  // false: no rule matched; the default is task-local
  std::string rule_id;   // "" when nothing matched
  std::string category;  // "" when nothing matched
  int frame_index = -1;  // index into the frames given, -1 when nothing matched
  std::string excerpt;   // a short, valid-UTF-8 piece of the deciding frame
};

class Classifier {
 public:
  explicit Classifier(std::shared_ptr<const RuleSet> rule_set,
                      ClassifierLimits limits = {});

  // Task-local rules win: if any frame matches a task-local rule the failure
  // is task-local even when another frame also matches a fatal rule, so an
  // operator can always carve an exception out of a broad fatal rule.
  Verdict classify(const std::vector<Frame>& frames) const;

  const RuleSet& rule_set() const { return *rule_set_; }

 private:
  std::shared_ptr<const RuleSet> rule_set_;
  ClassifierLimits limits_;
};

// The rules that ship with the package (vLLM, SGLang, lmdeploy, CUDA, NCCL).
std::vector<Rule> builtin_rules();

// Returns `base` with every rule of `overrides` appended, a rule whose id is
// already in `base` replacing it in place.
std::vector<Rule> merge_rules(std::vector<Rule> base,
                              const std::vector<Rule>& overrides);

struct ParseRulesResult {
  std::vector<Rule> rules;
  std::vector<RuleError> errors;
  bool ok() const { return errors.empty(); }
};

// Parses the operator's rules file format (see docs/rules.md):
//   # comment
//   <id> <fatal|task_local> <category> <pattern to end of line>
// Patterns are also compiled here so that an error names the line.
[[nodiscard]] ParseRulesResult parse_rules_text(const std::string& text,
                                                const std::string& source);

// Normalized text forms used for matching, exposed for tests and tools.
std::string sanitize_utf8(const std::string& text);  // invalid bytes -> U+FFFD
std::string compact_form(
    const std::string& text);  // ASCII alnum + non-ASCII, lower-cased

}  // namespace mineru_health

#endif  // MINERU_HEALTH_CLASSIFIER_H_
