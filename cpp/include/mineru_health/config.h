// Router and worker configuration: one table of every environment variable
// (config_variables.def: name, field, type, default, bounds, help, preset
// values), parsed and validated once at start-up.
//
//   auto router = mineru_health::health_config_from_env(env);  // ConfigError
//   auto worker = mineru_health::worker_config_from_env(env);  // ConfigError
//   for (const auto& v : mineru_health::config_variables()) print(v.name);
//
// Pure functions over immutable tables; thread-safe. Only the *_from_env
// functions, check_files() and check_path() look at the file system
// (CA_FILE, AUDIT_PATH, RULES); validate() checks values alone.
#ifndef MINERU_HEALTH_CONFIG_H_
#define MINERU_HEALTH_CONFIG_H_

#include <cstddef>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mineru_health {

// Bad configuration: the message names the variable (or preset) and the rule.
class ConfigError : public std::invalid_argument {
 public:
  ConfigError(std::string variable, const std::string& message)
      : std::invalid_argument(message), variable_(std::move(variable)) {}
  const std::string& variable() const { return variable_; }

 private:
  std::string variable_;
};

// MINERU_ROUTER_HEALTH_*: what mineru-router reads. Members and defaults
// come from config_variables.def; the defaults are the "production" preset.
struct HealthConfig {
#define MINERU_HEALTH_ROUTER_FIELD(suffix, field, cpp_type, default_value, \
                                   ...)                                    \
  cpp_type field = default_value;
#include "mineru_health/config_variables.def"
};

// MINERU_HEALTH_*: what a patched mineru-api worker reads (members and
// defaults from config_variables.def).
struct WorkerConfig {
#define MINERU_HEALTH_WORKER_FIELD(suffix, field, cpp_type, default_value, \
                                   ...)                                    \
  cpp_type field = default_value;
#include "mineru_health/config_variables.def"
};

// Who reads a variable. kTooling: names under MINERU_HEALTH_ that the CLI,
// the demo or the test harness read; a worker accepts them and ignores them.
enum class ConfigComponent { kRouter, kWorker, kTooling };

enum class ConfigType {
  kSeconds,  // finite decimal number of seconds
  kNumber,   // finite decimal number
  kInteger,  // decimal integer, no sign, no fraction
  kFlag,     // 1/0, true/false, yes/no, on/off (any case); "" = default
  kText,     // non-empty text
  kPath,     // file path; "" = unset
  kPort,     // "" = unset, else an integer 0..65535 (0 = any free port)
  kAddress,  // IPv4 or IPv6 literal
  kChoice,   // one of `choices`
  kLabel,    // any text, kept as written; "" = unset
};

// One documented environment variable: everything the parser, the
// validator, the CLI and the README need, defined once.
struct ConfigVariable {
  std::string name;   // e.g. MINERU_ROUTER_HEALTH_INTERVAL_S
  std::string field;  // HealthConfig/WorkerConfig member; "" = none
  ConfigComponent component = ConfigComponent::kRouter;
  ConfigType type = ConfigType::kText;
  std::string default_value;  // as an operator writes it; "" = unset
  // Numeric bounds (kSeconds, kNumber, kInteger, kPort); nullopt otherwise.
  std::optional<double> min_value;
  std::optional<double> max_value;
  bool max_exclusive = false;        // [min, max) instead of [min, max]
  bool zero_disables = false;        // 0 is also accepted and means "off"
  std::vector<std::string> choices;  // kChoice
  std::string allowed;               // the rule in words, e.g. "0.001..86400"
  std::string meaning;               // help text
  bool test_only = false;
  // Router variables: the value each preset gives it (preset name, text).
  std::vector<std::pair<std::string, std::string>> preset_values;
};

const char* to_string(ConfigComponent component);
const char* to_string(ConfigType type);

// The prefix every variable of `component` starts with:
// "MINERU_ROUTER_HEALTH_" for the router, "MINERU_HEALTH_" otherwise.
const char* env_prefix(ConfigComponent component);

// Every variable: router first, then worker and tooling, in README order.
std::vector<ConfigVariable> config_variables();

// The variable that sets `field` of `component`'s struct; throws
// std::out_of_range for an unknown field (a programmer error).
const ConfigVariable& config_variable_for(ConfigComponent component,
                                          const std::string& field);

// Preset names: "fast", "production" (the defaults), "outage-tolerant".
std::vector<std::string> preset_names();
HealthConfig preset(const std::string& name);  // throws ConfigError

// Reads MINERU_ROUTER_HEALTH_PRESET first, then each variable over it, then
// validate() and check_files(). Unknown MINERU_ROUTER_HEALTH_* names are
// refused too (a typo must not pass); other names are ignored.
HealthConfig health_config_from_env(
    const std::map<std::string, std::string>& env);

// Reads MINERU_HEALTH_* over the defaults, then validate() and check_files().
// Unknown
// MINERU_HEALTH_* names are refused; tooling names are accepted and ignored.
WorkerConfig worker_config_from_env(
    const std::map<std::string, std::string>& env);

// Throws ConfigError naming the variable of the first broken rule: bounds,
// then cross-field rules. Never touches the file system, so it is cheap to
// run on every copy of a configuration.
void validate(const HealthConfig& config);
void validate(const WorkerConfig& config);

// Throws ConfigError naming the variable of the first path that cannot be
// used: CA_FILE and RULES must be readable regular files, AUDIT_PATH a file
// that can be created and appended to. Done where configuration is read at
// start-up (the *_from_env functions, `mineru-health config --check`).
void check_files(const HealthConfig& config);
void check_files(const WorkerConfig& config);

// The file-system check of one path variable (see check_files()); a no-op
// for "" and for variables without one.
void check_path(const ConfigVariable& variable, const std::string& path);

}  // namespace mineru_health

#endif  // MINERU_HEALTH_CONFIG_H_
