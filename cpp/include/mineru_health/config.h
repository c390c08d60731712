// Router and worker configuration: one table of every environment variable
// (name, type, default, bounds, help, preset values), parsed and validated
// once at start-up.
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

// MINERU_ROUTER_HEALTH_*: what mineru-router reads. Defaults are the
// "production" preset.
struct HealthConfig {
  double interval_s = 2.0;         // between probes of one worker
  double probe_timeout_s = 1.5;    // whole request; must be < interval_s
  double connect_timeout_s = 0.5;  // <= probe_timeout_s
  int failure_threshold = 3;       // consecutive failures before `failed`
  int healthy_threshold = 1;       // consecutive successes to re-admit
  double backoff_base_s = 1.0;     // first restart delay, doubling
  double backoff_max_s = 60.0;
  int max_attempts = 5;           // restarts before `gave_up`
  double boot_timeout_s = 300.0;  // a restarted worker must be healthy by then
  int concurrency = 10000;        // probes in flight at once
  double jitter = 0.1;            // +-fraction of interval, per probe
  std::string expected_status = "healthy";
  std::size_t max_body_bytes = 64 * 1024;
  std::string audit_path;  // "" = stderr
  std::string ca_file;     // PEM CAs for HTTPS workers; "" = the system store
  // Whole-request timeout of a probe of a worker's main-port /health (no
  // native endpoint known). MinerU blocks its own event loop for seconds
  // under load, so this is generous; it may exceed interval_s (a worker has
  // one probe in flight at most). Native endpoints use probe_timeout_s.
  double main_port_timeout_s = 60.0;
  // A restart counts as successful only once the worker stayed healthy this
  // long (Kubernetes resets CrashLoopBackOff after 10 minutes); 0 = at the
  // first healthy answer.
  double stable_window_s = 600.0;
  // Most workers that non-definitive failures (timeouts, passive failures)
  // may hold out of rotation at once, as a percentage (Envoy's
  // max_ejection_percent); at least one worker always stays in rotation.
  int max_ejection_percent = 50;
  int task_retries = 2;                // resubmissions of one task
  double retry_budget_percent = 20.0;  // resubmissions / tasks in flight, %
  int retry_budget_min = 3;            // resubmissions always allowed
  int max_kept_tasks = 1000;           // uploads kept for resubmission, at most
  int max_kept_mb = 8192;              // their size on disk, at most (MiB)
  // Probe local workers' native health endpoints and switch to the one a
  // remote worker advertises; false probes every main-port /health with
  // probe_timeout_s, as mineru-health 0.1 did (busy workers then time out).
  bool native_probes = true;
};

// MINERU_HEALTH_*: what a patched mineru-api worker reads.
struct WorkerConfig {
  std::optional<int> port;         // native /health port; nullopt = none
  std::string bind = "127.0.0.1";  // IP literal the native endpoint binds
  double loop_hang_s = 60.0;       // event loop silent this long = hung
  double stall_s = 300.0;          // no engine progress this long; 0 = off
  double task_hang_s = 900.0;      // a task with no progress this long; 0 = off
  double verify_s = 2.0;           // asking the engine after a failure; 0 = off
  bool exit_on_fatal = false;      // exit 75 after an engine death
  double exit_grace_s = 5.0;       // 503s served before that exit
  int retry_after_s = 30;          // Retry-After on refused submissions
  bool expose_errors = false;      // /health shows exception messages
  int error_budget = 3;            // ambiguous device errors per window
  double error_budget_window_s = 60.0;
  int parent_pid = 0;  // set by the router: exit with that process; 0 = none
  std::string rules_path;  // extra rules file; "" = built-in only
  bool task_store = true;  // terminal tasks kept on disk (SQLite)
  std::string state_dir;   // task store's directory; "" = output root
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
