// Router health configuration: defaults, presets and MINERU_ROUTER_HEALTH_*
// environment variables, validated once at start-up.
//
//   auto config = mineru_health::health_config_from_env(env);  // throws
//   ConfigError
//
// Pure functions; thread-safe.
#ifndef MINERU_HEALTH_CONFIG_H_
#define MINERU_HEALTH_CONFIG_H_

#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>
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
};

struct ConfigVariable {
  std::string name;  // e.g. MINERU_ROUTER_HEALTH_INTERVAL_S
  std::string default_value;
  std::string meaning;
};

// The documented variables, in README order.
std::vector<ConfigVariable> config_variables();

// Preset names: "fast", "production" (the defaults), "outage-tolerant".
std::vector<std::string> preset_names();
HealthConfig preset(const std::string& name);  // throws ConfigError

// Reads MINERU_ROUTER_HEALTH_PRESET first, then each variable over it.
// Unknown MINERU_ROUTER_HEALTH_* names are refused too (a typo must not pass).
HealthConfig health_config_from_env(
    const std::map<std::string, std::string>& env);

// Throws ConfigError naming the variable of the first broken rule.
void validate(const HealthConfig& config);

}  // namespace mineru_health

#endif  // MINERU_HEALTH_CONFIG_H_
