// Fatal-error classifier: decides whether a task failure killed the worker's
// inference engine (fatal), only the task (task-local), or hit a device error
// that may or may not recur (ambiguous).
//
//   auto compiled =
//       mineru_health::RuleSet::compile(mineru_health::builtin_rules());
//   mineru_health::Classifier classifier(compiled.rule_set);
//   mineru_health::Frame dead{"vllm.v1.engine.exceptions", "EngineDeadError",
//                             {"Exception"}, "EngineCore encountered an
//                             issue."};
//   dead.raised_in = "vllm.v1.engine.async_llm";
//   mineru_health::Classification verdict = classifier.classify({dead});  //
//   fatal
//
// The precedence rules (strengths, __cause__ / __context__, exception groups,
// operator rules, origin scopes, remote engines) are documented in
// docs/rules.md, section "Deciding".
//
// Thread-safety: RuleSet is immutable once compiled and shared as
// shared_ptr<const RuleSet>; Classifier is immutable and safe to call from any
// number of threads at once.
#ifndef MINERU_HEALTH_CLASSIFIER_H_
#define MINERU_HEALTH_CLASSIFIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mineru_health {

// How a frame was reached from its parent frame.
enum class Via {
  kRoot,         // the exception that was caught (or: unspecified)
  kCause,        // parent.__cause__ (raise ... from ...)
  kContext,      // parent.__context__ (raised while handling the parent's)
  kGroupMember,  // one of parent.exceptions (an exception group)
};

const char* to_string(Via via);  // "root", "cause", "context", "group"

// One exception of a failure chain. Frames are listed in pre-order (a frame,
// then the frames it wraps), the exception that was caught first. Texts may be
// any bytes: invalid UTF-8 is replaced before matching.
struct Frame {
  Frame() = default;
  Frame(std::string module_name, std::string type,
        std::vector<std::string> base_names, std::string text,
        std::string raise_site = "", Via how = Via::kRoot, int level = 0)
      : module(std::move(module_name)),
        type_name(std::move(type)),
        bases(std::move(base_names)),
        message(std::move(text)),
        raised_in(std::move(raise_site)),
        via(how),
        depth(level) {}

  std::string module;
  std::string type_name;
  std::vector<std::string> bases;  // MRO names after type_name
  std::string message;
  // Module of the innermost traceback entry: where the exception was raised.
  // Empty when unknown (a printed message without a traceback).
  std::string raised_in;
  Via via = Via::kRoot;
  // 0 for the first frame, parent's depth + 1 for the others. A frame whose
  // depth does not fit (0 after the first, or a jump of more than one) is
  // read as the cause of the frame before it, so frames listed without
  // depths form one linear chain.
  int depth = 0;
};

// Rule kinds, strongest first (see docs/rules.md for the ladder).
enum class RuleKind {
  kFatal,      // definitive: only a dead engine or device produces it
  kTaskLocal,  // a specific failure of one task (document, request)
  kHeuristic,  // a fatal marker that could also appear otherwise
  kAmbiguous,  // a device error that may or may not recur (out of memory)
  kGeneric,    // a generic timeout or cancellation: task-local if nothing
               // else in the chain decides
};

const char* to_string(RuleKind kind);  // as written in rules files
// "definitive", "task_local", "heuristic", "ambiguous", "generic".
const char* strength_name(RuleKind kind);
bool is_fatal(RuleKind kind);

// Which text of a frame a rule's pattern is matched against.
enum class RuleTarget {
  kType,     // "module.Type (Base1 Base2) @raised_in": the class and where it
             // was raised, which no document or remote server can forge
  kMessage,  // the message only
  kFrame,    // "module.Type (Base1 Base2): message" (rules files' default)
};

// Which frames a rule matched against a message (kMessage, kFrame) may judge.
// Type rules judge every frame.
enum class RuleScope {
  kEngine,  // only frames an engine or device runtime raised (docs/rules.md)
  kAny,     // every frame; rules files' default
};

const char* to_string(RuleTarget target);  // "type", "message", "frame"
const char* to_string(RuleScope scope);    // "engine", "any"

struct Rule {
  Rule() = default;
  Rule(std::string rule_id, RuleKind rule_kind, std::string rule_category,
       std::string rule_pattern, RuleTarget rule_target = RuleTarget::kFrame,
       RuleScope rule_scope = RuleScope::kAny, bool operator_rule = false)
      : id(std::move(rule_id)),
        kind(rule_kind),
        category(std::move(rule_category)),
        pattern(std::move(rule_pattern)),
        target(rule_target),
        scope(rule_scope),
        from_operator(operator_rule) {}

  std::string id;  // unique; a rules file reusing an id replaces that rule
  RuleKind kind = RuleKind::kFatal;
  std::string category;  // e.g. "engine_dead", "cuda", "bad_input"
  std::string pattern;   // RE2 syntax, matched case-insensitively
  RuleTarget target = RuleTarget::kFrame;
  RuleScope scope = RuleScope::kAny;
  // From the operator's rules file: operator rules are consulted first and
  // any match among them decides, whatever the built-in rules say.
  bool from_operator = false;

  // The rule as one line of a rules file (see parse_rules_text).
  std::string to_line() const;
};

// Why a rule could not be compiled, parsed or read. `line` is 0 when not
// tied to one line of a file.
struct RuleError {
  std::string source;  // file path, or "<builtin>"
  int line = 0;
  std::string rule_id;
  std::string message;

  std::string to_string() const;
};

// Limits that keep one classification bounded in time and memory whatever
// the exception looks like. Longer messages keep their head and tail halves.
struct ClassifierLimits {
  std::size_t max_frames = 64;                // further frames are ignored
  std::size_t max_message_bytes = 64u << 10;  // per frame
  // All frames' messages together; frames past the budget are judged on
  // their class and raise site only.
  std::size_t max_total_message_bytes = 256u << 10;
  std::size_t excerpt_bytes = 200;
};

// Bounds on what a rule set may contain, enforced by RuleSet::compile (and by
// parse_rules_text, so that a rules file is refused naming the rule).
struct RuleSetLimits {
  std::size_t max_rules = 4000;          // built-ins plus a full rules file
  std::size_t max_pattern_bytes = 2048;  // pattern text
  int max_program_size = 2000;           // RE2 instructions per pattern
  // Longest bounded run of character classes (counted repetitions
  // multiplied out): a run of n can need 2^n DFA states. See docs/rules.md.
  int max_class_run = 8;
  std::int64_t pattern_max_mem = 1 << 20;  // RE2 budget per pattern
  std::int64_t set_max_mem = 64 << 20;     // RE2 budget per compiled set
  std::int64_t max_total_program_size = 250000;
};

class RuleSet;

struct CompileResult {
  std::shared_ptr<const RuleSet> rule_set;  // null when errors is not empty
  std::vector<RuleError> errors;
  bool ok() const { return rule_set != nullptr; }
};

// An immutable, compiled set of rules: one RE2::Set per target.
class RuleSet {
 public:
  // Compiles every rule; all-or-nothing. Duplicate ids are errors here (merge
  // first with merge_rules when overriding is intended).
  [[nodiscard]] static CompileResult compile(
      std::vector<Rule> rules, const std::string& source = "<builtin>",
      const RuleSetLimits& limits = {});
  ~RuleSet();
  RuleSet(const RuleSet&) = delete;
  RuleSet& operator=(const RuleSet&) = delete;

  const std::vector<Rule>& rules() const { return rules_; }

 private:
  RuleSet();
  friend class Classifier;
  struct TargetSet;
  std::vector<Rule> rules_;
  std::unique_ptr<TargetSet> type_;
  std::unique_ptr<TargetSet> message_;
  std::unique_ptr<TargetSet> frame_;
};

// The worst-case cost class of a pattern: the longest bounded run of
// character classes, counted repetitions multiplied out (0 for literals).
int pattern_class_run(const std::string& pattern);

struct ClassifyOptions {
  // The task's engine is remote (an http-client backend): a fatal verdict
  // from a built-in rule whose deciding frame is not an engine or device
  // runtime's own exception becomes task-local, category "remote_engine".
  bool remote_engine = false;
  // Frames with no raise site and a built-in class (text without a
  // traceback) count as an engine's for engine-scoped rules. Callers that
  // classify text from untrusted sources turn this off.
  bool trust_unknown_origin = true;
};

struct Classification {
  bool fatal = false;
  bool matched = false;    // false: no rule matched; the default is task-local
  bool ambiguous = false;  // an ambiguous device error (never fatal itself)
  bool remote_engine = false;  // the failure belongs to a remote engine
  RuleKind rule_kind = RuleKind::kGeneric;  // the deciding rule's; see matched
  std::string rule;                         // its id; "" when nothing matched
  std::string category;                     // "" when nothing matched
  int frame_index = -1;  // index into the frames given, -1 when nothing matched
  std::string excerpt;   // a short, valid-UTF-8 piece of the deciding frame

  // "fatal", "ambiguous" or "task_local" (an unmatched failure included).
  const char* kind() const;
  // The deciding rule's strength_name(); "" when nothing matched.
  const char* strength() const;
};

class Classifier {
 public:
  explicit Classifier(std::shared_ptr<const RuleSet> rule_set,
                      ClassifierLimits limits = {});

  Classification classify(const std::vector<Frame>& frames,
                          const ClassifyOptions& options = {}) const;

  const RuleSet& rule_set() const { return *rule_set_; }
  const ClassifierLimits& limits() const { return limits_; }

 private:
  std::shared_ptr<const RuleSet> rule_set_;
  ClassifierLimits limits_;
};

// Where a module name places a frame, for rule scopes (docs/rules.md lists
// the module prefixes of each origin).
enum class Origin {
  kUnknown,    // no raise site, built-in or no class module
  kRuntime,    // an engine or device runtime (vllm, torch, lmdeploy...)
  kUntrusted,  // document libraries, HTTP clients, MinerU's own conversion
  kOther,      // anything else (asyncio, the application...)
};

const char* to_string(Origin origin);
Origin frame_origin(const Frame& frame);

// The rules that ship with the package.
std::vector<Rule> builtin_rules();

// Returns `base` with every rule of `overrides` appended, a rule whose id is
// already in `base` replacing it in place, and every rule named in
// `disabled` removed.
std::vector<Rule> merge_rules(std::vector<Rule> base,
                              const std::vector<Rule>& overrides,
                              const std::vector<std::string>& disabled = {});

// Bounds on an operator's rules file, checked before it is read.
inline constexpr std::size_t kMaxRulesFileBytes = 1u << 20;
inline constexpr std::size_t kMaxRulesFileRules = 2000;

struct ParseRulesResult {
  std::vector<Rule> rules;
  std::vector<std::string> disabled;  // built-in ids turned off ("<id> off")
  std::vector<RuleError> errors;
  bool ok() const { return errors.empty(); }
};

// Parses the operator's rules file format (see docs/rules.md):
//   # comment
//   <id> <kind> <category> [target=...] [origin=...] <pattern to end of line>
//   <id> off
// Patterns are also compiled and cost-checked here so that an error names
// the line.
[[nodiscard]] ParseRulesResult parse_rules_text(const std::string& text,
                                                const std::string& source);

// Reads and parses a rules file: it must be a regular file of at most
// kMaxRulesFileBytes (checked on the open descriptor before reading; FIFOs,
// devices and directories are refused without blocking).
[[nodiscard]] ParseRulesResult read_rules_file(const std::string& path);

// Normalized text forms used for matching, exposed for tests.
std::string sanitize_utf8(const std::string& text);  // invalid bytes -> U+FFFD
std::string compact_form(
    const std::string& text);  // ASCII alnum + non-ASCII, lower-cased

}  // namespace mineru_health

#endif  // MINERU_HEALTH_CLASSIFIER_H_
