// Router health configuration: presets, strict environment parsing and the
// validation rules. Bad configuration is a programmer/operator error, so it
// throws ConfigError (naming the variable) once, at start-up.
#include "mineru_health/config.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <system_error>

namespace mineru_health {
namespace {

constexpr const char* kPrefix = "MINERU_ROUTER_HEALTH_";

constexpr const char* kInterval = "MINERU_ROUTER_HEALTH_INTERVAL_S";
constexpr const char* kTimeout = "MINERU_ROUTER_HEALTH_TIMEOUT_S";
constexpr const char* kConnectTimeout =
    "MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S";
constexpr const char* kFailureThreshold =
    "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD";
constexpr const char* kHealthyThreshold =
    "MINERU_ROUTER_HEALTH_HEALTHY_THRESHOLD";
constexpr const char* kBackoffBase = "MINERU_ROUTER_HEALTH_BACKOFF_BASE_S";
constexpr const char* kBackoffMax = "MINERU_ROUTER_HEALTH_BACKOFF_MAX_S";
constexpr const char* kMaxAttempts = "MINERU_ROUTER_HEALTH_MAX_ATTEMPTS";
constexpr const char* kBootTimeout = "MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S";
constexpr const char* kConcurrency = "MINERU_ROUTER_HEALTH_CONCURRENCY";
constexpr const char* kJitter = "MINERU_ROUTER_HEALTH_JITTER";
constexpr const char* kExpectedStatus = "MINERU_ROUTER_HEALTH_EXPECTED_STATUS";
constexpr const char* kMaxBodyBytes = "MINERU_ROUTER_HEALTH_MAX_BODY_BYTES";
constexpr const char* kPreset = "MINERU_ROUTER_HEALTH_PRESET";
constexpr const char* kAuditPath = "MINERU_ROUTER_HEALTH_AUDIT_PATH";
constexpr const char* kCaFile = "MINERU_ROUTER_HEALTH_CA_FILE";
constexpr const char* kMainPortTimeout =
    "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S";
constexpr const char* kStableWindow = "MINERU_ROUTER_HEALTH_STABLE_WINDOW_S";
constexpr const char* kMaxEjectionPercent =
    "MINERU_ROUTER_HEALTH_MAX_EJECTION_PERCENT";
// A timeout or window longer than a day is a typo.
constexpr double kMaxDaySeconds = 24.0 * 3600;

// Durations beyond a year are typos, and would overflow nanosecond clocks
// long before they overflow a double.
constexpr double kMaxSeconds = 365.0 * 24 * 3600;
constexpr int kMaxConcurrency = 1000000;
constexpr std::size_t kMinBodyBytes = 256;
constexpr std::size_t kMaxBodyBytesLimit = 16 * 1024 * 1024;

[[noreturn]] void refuse(const char* variable, const std::string& message) {
  throw ConfigError(variable, message);
}

// `{}` prints doubles in their shortest round-trip form: 3 -> "3", 1.5 ->
// "1.5".
std::string show(const char* variable, double value) {
  return fmt::format("{}={}", variable, value);
}

void require_positive_seconds(const char* variable, double value) {
  if (!std::isfinite(value) || value <= 0) {
    refuse(variable, fmt::format("{} must be a positive number of seconds",
                                 show(variable, value)));
  }
  if (value > kMaxSeconds) {
    refuse(variable, fmt::format("{} must be at most {} (one year)",
                                 show(variable, value), kMaxSeconds));
  }
}

double parse_double(const char* variable, const std::string& text) {
  double value = 0;
  const char* end = text.data() + text.size();
  // from_chars: locale-independent, no leading blanks or '+', and it must
  // consume the whole string.
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end ||
      !std::isfinite(value)) {
    refuse(variable,
           fmt::format("{}={:?} is not a finite number", variable, text));
  }
  return value;
}

template <typename Int>
Int parse_int(const char* variable, const std::string& text) {
  Int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    refuse(variable,
           fmt::format("{}={:?} is not an integer in range", variable, text));
  }
  return value;
}

struct Setter {
  const char* name;
  std::function<void(HealthConfig&, const std::string&)> apply;
};

const std::vector<Setter>& setters() {
  static const std::vector<Setter> kSetters = {
      {kInterval,
       [](HealthConfig& c, const std::string& v) {
         c.interval_s = parse_double(kInterval, v);
       }},
      {kTimeout,
       [](HealthConfig& c, const std::string& v) {
         c.probe_timeout_s = parse_double(kTimeout, v);
       }},
      {kConnectTimeout,
       [](HealthConfig& c, const std::string& v) {
         c.connect_timeout_s = parse_double(kConnectTimeout, v);
       }},
      {kFailureThreshold,
       [](HealthConfig& c, const std::string& v) {
         c.failure_threshold = parse_int<int>(kFailureThreshold, v);
       }},
      {kHealthyThreshold,
       [](HealthConfig& c, const std::string& v) {
         c.healthy_threshold = parse_int<int>(kHealthyThreshold, v);
       }},
      {kBackoffBase,
       [](HealthConfig& c, const std::string& v) {
         c.backoff_base_s = parse_double(kBackoffBase, v);
       }},
      {kBackoffMax,
       [](HealthConfig& c, const std::string& v) {
         c.backoff_max_s = parse_double(kBackoffMax, v);
       }},
      {kMaxAttempts,
       [](HealthConfig& c, const std::string& v) {
         c.max_attempts = parse_int<int>(kMaxAttempts, v);
       }},
      {kBootTimeout,
       [](HealthConfig& c, const std::string& v) {
         c.boot_timeout_s = parse_double(kBootTimeout, v);
       }},
      {kConcurrency,
       [](HealthConfig& c, const std::string& v) {
         c.concurrency = parse_int<int>(kConcurrency, v);
       }},
      {kJitter,
       [](HealthConfig& c, const std::string& v) {
         c.jitter = parse_double(kJitter, v);
       }},
      {kExpectedStatus,
       [](HealthConfig& c, const std::string& v) { c.expected_status = v; }},
      {kMaxBodyBytes,
       [](HealthConfig& c, const std::string& v) {
         c.max_body_bytes = static_cast<std::size_t>(
             parse_int<std::uint64_t>(kMaxBodyBytes, v));
       }},
      {kAuditPath,
       [](HealthConfig& c, const std::string& v) { c.audit_path = v; }},
      {kCaFile, [](HealthConfig& c, const std::string& v) { c.ca_file = v; }},
  };
  return kSetters;
}

std::string known_names() {
  std::string names;
  for (const ConfigVariable& v : config_variables()) {
    if (!names.empty()) names += ", ";
    names += v.name;
  }
  return names;
}

}  // namespace

std::vector<ConfigVariable> config_variables() {
  const HealthConfig d;
  return {
      {kPreset, "production",
       "Starting point for every other variable: fast, production (the "
       "defaults) or "
       "outage-tolerant."},
      {kInterval, fmt::format("{}", d.interval_s),
       "Seconds between two probes of one worker (each jittered by JITTER)."},
      {kTimeout, fmt::format("{}", d.probe_timeout_s),
       "Seconds one GET /health may take in all; must be below INTERVAL_S."},
      {kConnectTimeout, fmt::format("{}", d.connect_timeout_s),
       "Seconds to establish the connection; at most TIMEOUT_S."},
      {kFailureThreshold, fmt::format("{}", d.failure_threshold),
       "Consecutive failed probes before a worker is marked failed (a 503 with "
       "engine_dead "
       "skips it)."},
      {kHealthyThreshold, fmt::format("{}", d.healthy_threshold),
       "Consecutive healthy probes before an ejected worker is routed to "
       "again."},
      {kBackoffBase, fmt::format("{}", d.backoff_base_s),
       "Seconds before the first restart of a failed local worker; doubles per "
       "attempt."},
      {kBackoffMax, fmt::format("{}", d.backoff_max_s),
       "Upper bound of the restart delay."},
      {kMaxAttempts, fmt::format("{}", d.max_attempts),
       "Failed restarts before giving up (the worker is still probed and "
       "re-admitted if it "
       "recovers); 0 never restarts."},
      {kBootTimeout, fmt::format("{}", d.boot_timeout_s),
       "Seconds a (re)started local worker has to answer healthy."},
      {kConcurrency, fmt::format("{}", d.concurrency),
       "Probes in flight at once (1..1000000)."},
      {kJitter, fmt::format("{}", d.jitter),
       "Random spread of each interval, as a fraction in [0, 0.5)."},
      {kExpectedStatus, d.expected_status,
       "Value of the `status` field a healthy /health body carries."},
      {kMaxBodyBytes, fmt::format("{}", d.max_body_bytes),
       "Largest /health body read (256..16777216); a longer one fails the "
       "probe."},
      {kAuditPath, "",
       "File that audit JSON lines are appended to; empty means stderr."},
      {kCaFile, "",
       "PEM file of the CAs that sign HTTPS workers' certificates; empty "
       "means the system's CA store. Certificates are always verified."},
  };
}

std::vector<std::string> preset_names() {
  return {"fast", "production", "outage-tolerant"};
}

HealthConfig preset(const std::string& name) {
  HealthConfig c;
  if (name == "production") return c;
  if (name == "fast") {
    c.interval_s = 1;
    c.probe_timeout_s = 0.5;
    c.connect_timeout_s = 0.25;
    c.failure_threshold = 2;
    c.backoff_base_s = 1;
    c.backoff_max_s = 10;
    c.max_attempts = 5;
    c.boot_timeout_s = 120;
    return c;
  }
  if (name == "outage-tolerant") {
    c.interval_s = 5;
    c.probe_timeout_s = 3;
    c.connect_timeout_s = 1;
    c.failure_threshold = 5;
    c.backoff_base_s = 5;
    c.backoff_max_s = 600;
    c.max_attempts = 12;
    c.boot_timeout_s = 600;
    return c;
  }
  refuse(
      kPreset,
      fmt::format("{}={:?} is not a preset (fast, production, outage-tolerant)",
                  kPreset, name));
}

HealthConfig health_config_from_env(
    const std::map<std::string, std::string>& env) {
  const std::string prefix = kPrefix;
  // Refuse typos before anything else: a misspelt variable silently falling
  // back to its default is worse than not starting.
  for (const auto& [name, value] : env) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    bool known = name == kPreset;
    for (const Setter& s : setters()) known = known || name == s.name;
    if (!known) {
      throw ConfigError(name, fmt::format("unknown variable {} (known: {})",
                                          name, known_names()));
    }
  }

  auto preset_it = env.find(kPreset);
  HealthConfig config =
      preset(preset_it == env.end() ? "production" : preset_it->second);
  for (const Setter& s : setters()) {
    auto it = env.find(s.name);
    if (it != env.end()) s.apply(config, it->second);
  }
  validate(config);
  return config;
}

void validate(const HealthConfig& c) {
  require_positive_seconds(kInterval, c.interval_s);
  require_positive_seconds(kTimeout, c.probe_timeout_s);
  require_positive_seconds(kConnectTimeout, c.connect_timeout_s);
  require_positive_seconds(kBackoffBase, c.backoff_base_s);
  require_positive_seconds(kBackoffMax, c.backoff_max_s);
  require_positive_seconds(kBootTimeout, c.boot_timeout_s);
  if (c.probe_timeout_s >= c.interval_s) {
    // Otherwise probes of one worker overlap and a hung worker costs more
    // than one interval per probe.
    refuse(kTimeout,
           fmt::format("{} must be below {}", show(kTimeout, c.probe_timeout_s),
                       show(kInterval, c.interval_s)));
  }
  if (c.connect_timeout_s > c.probe_timeout_s) {
    refuse(kConnectTimeout,
           fmt::format("{} must be at most {}",
                       show(kConnectTimeout, c.connect_timeout_s),
                       show(kTimeout, c.probe_timeout_s)));
  }
  if (c.failure_threshold < 1) {
    refuse(kFailureThreshold,
           fmt::format("{}={} must be at least 1", kFailureThreshold,
                       c.failure_threshold));
  }
  if (c.healthy_threshold < 1) {
    refuse(kHealthyThreshold,
           fmt::format("{}={} must be at least 1", kHealthyThreshold,
                       c.healthy_threshold));
  }
  if (c.max_attempts < 0) {
    refuse(kMaxAttempts, fmt::format("{}={} must be at least 0", kMaxAttempts,
                                     c.max_attempts));
  }
  if (c.backoff_base_s > c.backoff_max_s) {
    refuse(kBackoffBase, fmt::format("{} must be at most {}",
                                     show(kBackoffBase, c.backoff_base_s),
                                     show(kBackoffMax, c.backoff_max_s)));
  }
  if (!std::isfinite(c.jitter) || c.jitter < 0 || c.jitter >= 0.5) {
    refuse(kJitter,
           fmt::format("{} must be in [0, 0.5)", show(kJitter, c.jitter)));
  }
  if (c.concurrency < 1 || c.concurrency > kMaxConcurrency) {
    refuse(kConcurrency,
           fmt::format("{}={} must be between 1 and {}", kConcurrency,
                       c.concurrency, kMaxConcurrency));
  }
  if (c.max_body_bytes < kMinBodyBytes ||
      c.max_body_bytes > kMaxBodyBytesLimit) {
    refuse(kMaxBodyBytes,
           fmt::format("{}={} must be between {} and {}", kMaxBodyBytes,
                       c.max_body_bytes, kMinBodyBytes, kMaxBodyBytesLimit));
  }
  if (c.expected_status.empty()) {
    refuse(kExpectedStatus,
           fmt::format("{} must not be empty", kExpectedStatus));
  }
  require_positive_seconds(kMainPortTimeout, c.main_port_timeout_s);
  if (c.main_port_timeout_s > kMaxDaySeconds) {
    refuse(kMainPortTimeout,
           fmt::format("{} must be at most {} (one day)",
                       show(kMainPortTimeout, c.main_port_timeout_s),
                       kMaxDaySeconds));
  }
  if (c.main_port_timeout_s < c.connect_timeout_s) {
    refuse(kMainPortTimeout,
           fmt::format("{} must be at least {}",
                       show(kMainPortTimeout, c.main_port_timeout_s),
                       show(kConnectTimeout, c.connect_timeout_s)));
  }
  if (!std::isfinite(c.stable_window_s) || c.stable_window_s < 0 ||
      c.stable_window_s > kMaxDaySeconds) {
    refuse(kStableWindow,
           fmt::format("{} must be between 0 and {} seconds (one day)",
                       show(kStableWindow, c.stable_window_s), kMaxDaySeconds));
  }
  if (c.max_ejection_percent < 0 || c.max_ejection_percent > 100) {
    refuse(kMaxEjectionPercent,
           fmt::format("{}={} must be between 0 and 100", kMaxEjectionPercent,
                       c.max_ejection_percent));
  }
  // Checked here so that a typo stops the router at start-up instead of
  // failing every HTTPS probe later.
  if (!c.ca_file.empty() && !std::ifstream(c.ca_file).good()) {
    refuse(kCaFile,
           fmt::format("{}={} is not a readable file", kCaFile, c.ca_file));
  }
}

}  // namespace mineru_health
