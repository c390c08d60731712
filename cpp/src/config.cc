// Router and worker configuration: one table per component, from which the
// parser, the validator, the documentation and the Python field lists are all
// derived. Bad configuration is an operator error, so it throws ConfigError
// (naming the variable and the rule) once, at start-up.
//
// Over 500 lines because the two tables (about 200 lines of data: every
// variable's bounds and help text) live next to the one parser that reads
// them; splitting them apart would spread one definition over two files.
#include "mineru_health/config.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>

#include <charconv>
#include <cmath>
#include <locale>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <variant>

#include "path_checks.h"

namespace mineru_health {
namespace {

constexpr const char* kRouterPrefix = "MINERU_ROUTER_HEALTH_";
constexpr const char* kWorkerPrefix = "MINERU_HEALTH_";
constexpr const char* kPresetName = "MINERU_ROUTER_HEALTH_PRESET";
constexpr const char* kDefaultPreset = "production";

// No duration below a millisecond (timers and curl count in ms) nor above a
// day (nothing in a health check should wait that long; larger values are
// typos that would also overflow nanosecond clocks).
constexpr double kMinSeconds = 0.001;
constexpr double kDay = 24 * 3600;

using internal::PathCheck;

struct Limits {
  double min = 0;
  double max = 0;
  bool max_exclusive = false;
  bool zero_disables = false;
};

template <typename Config>
using Member =
    std::variant<std::monostate, double Config::*, int Config::*,
                 std::size_t Config::*, bool Config::*, std::string Config::*,
                 std::optional<int> Config::*>;

// One table row as written below; ConfigVariable is derived from it.
template <typename Config>
struct Row {
  const char* suffix;
  const char* field;
  Member<Config> member;
  ConfigType type;
  Limits limits;
  const char* meaning;
  PathCheck path_check = PathCheck::kNone;
  ConfigComponent component = ConfigComponent::kRouter;
  bool test_only = false;
};

bool is_numeric(ConfigType type) {
  return type == ConfigType::kSeconds || type == ConfigType::kNumber ||
         type == ConfigType::kInteger || type == ConfigType::kPort;
}

// clang-format off
// The router's variables, in README order. Bounds: see kMinSeconds/kDay.
const std::vector<Row<HealthConfig>>& router_rows() {
  using C = HealthConfig;
  using T = ConfigType;
  static const std::vector<Row<C>> kRows = {
      {"PRESET", "", {}, T::kChoice, {},
       "Starting point for every other variable: fast, production (the "
       "defaults) or outage-tolerant."},
      {"INTERVAL_S", "interval_s", &C::interval_s, T::kSeconds, {0.01, kDay},
       "Seconds between two probes of one worker (each jittered by JITTER)."},
      {"TIMEOUT_S", "probe_timeout_s", &C::probe_timeout_s, T::kSeconds,
       {kMinSeconds, kDay},
       "Seconds one GET /health may take in all; must be below INTERVAL_S."},
      {"CONNECT_TIMEOUT_S", "connect_timeout_s", &C::connect_timeout_s,
       T::kSeconds, {kMinSeconds, kDay},
       "Seconds to establish the connection; at most TIMEOUT_S."},
      {"FAILURE_THRESHOLD", "failure_threshold", &C::failure_threshold,
       T::kInteger, {1, 1000},
       "Consecutive failed probes before a worker is marked failed (a 503 "
       "with engine_dead skips it)."},
      {"HEALTHY_THRESHOLD", "healthy_threshold", &C::healthy_threshold,
       T::kInteger, {1, 1000},
       "Consecutive healthy probes before an ejected worker is routed to "
       "again."},
      {"BACKOFF_BASE_S", "backoff_base_s", &C::backoff_base_s, T::kSeconds,
       {kMinSeconds, kDay},
       "Seconds before the first restart of a failed local worker; doubles "
       "per attempt; at most BACKOFF_MAX_S."},
      {"BACKOFF_MAX_S", "backoff_max_s", &C::backoff_max_s, T::kSeconds,
       {kMinSeconds, kDay}, "Upper bound of the restart delay."},
      {"MAX_ATTEMPTS", "max_attempts", &C::max_attempts, T::kInteger,
       {0, 1000},
       "Failed restarts before giving up (the worker is still probed); 0 "
       "never restarts."},
      {"BOOT_TIMEOUT_S", "boot_timeout_s", &C::boot_timeout_s, T::kSeconds,
       {1, kDay},
       "Seconds a (re)started local worker has to answer healthy."},
      {"MAIN_PORT_TIMEOUT_S", "main_port_timeout_s", &C::main_port_timeout_s,
       T::kSeconds, {kMinSeconds, kDay},
       "Seconds one GET /health on a worker's main port may take (a worker "
       "with no native endpoint): MinerU blocks that port's event loop for "
       "seconds under load; may exceed INTERVAL_S."},
      {"STABLE_WINDOW_S", "stable_window_s", &C::stable_window_s, T::kSeconds,
       {0, kDay},
       "Seconds a restarted worker must stay healthy before the restart "
       "counts as successful and the attempt count resets."},
      {"CONCURRENCY", "concurrency", &C::concurrency, T::kInteger,
       {1, 1000000}, "Probes in flight at once."},
      {"JITTER", "jitter", &C::jitter, T::kNumber, {0, 0.5, true},
       "Random spread of each interval, as a fraction."},
      {"EXPECTED_STATUS", "expected_status", &C::expected_status, T::kText,
       {}, "Value of the `status` field a healthy /health body carries."},
      {"MAX_BODY_BYTES", "max_body_bytes", &C::max_body_bytes, T::kInteger,
       {256, 16 * 1024 * 1024},
       "Largest /health body read; a longer one fails the probe."},
      {"MAX_EJECTION_PERCENT", "max_ejection_percent",
       &C::max_ejection_percent, T::kInteger, {0, 100},
       "Largest share of workers, in percent, that timeouts and passive "
       "failures may hold out of rotation at once (one always stays); a "
       "worker whose own /health says it is dead is never held back."},
      {"TASK_RETRIES", "task_retries", &C::task_retries, T::kInteger, {0, 10},
       "Times one task is resubmitted to another worker after its worker's "
       "engine died; 0 never resubmits."},
      {"RETRY_BUDGET_PERCENT", "retry_budget_percent",
       &C::retry_budget_percent, T::kNumber, {0, 100},
       "Resubmissions in flight at most this share, in percent, of the tasks "
       "in flight; a task over it waits its turn, at most BOOT_TIMEOUT_S."},
      {"RETRY_BUDGET_MIN", "retry_budget_min", &C::retry_budget_min,
       T::kInteger, {0, 1000},
       "Resubmissions in flight always allowed, whatever the share."},
      {"MAX_KEPT_TASKS", "max_kept_tasks", &C::max_kept_tasks, T::kInteger,
       {1, 1000000},
       "Tasks whose uploads the router keeps for resubmission at most; past "
       "it new submissions get 503 with Retry-After."},
      {"MAX_KEPT_MB", "max_kept_mb", &C::max_kept_mb, T::kInteger,
       {1, 16 * 1024 * 1024},
       "MiB of kept uploads on disk at most; past it new submissions get 503 "
       "with Retry-After."},
      {"NATIVE_PROBES", "native_probes", &C::native_probes, T::kFlag, {},
       "Probe local workers' native health endpoints (MINERU_HEALTH_PORT, "
       "reserved and passed on by the router) and the one a remote worker "
       "advertises; 0 probes every main-port /health with TIMEOUT_S, as 0.1 "
       "did, where a busy worker times out."},
      {"AUDIT_PATH", "audit_path", &C::audit_path, T::kPath, {},
       "File that audit JSON lines are appended to; empty means stderr.",
       PathCheck::kWritableFile},
      {"CA_FILE", "ca_file", &C::ca_file, T::kPath, {},
       "PEM file of the CAs that sign HTTPS workers' certificates; empty "
       "means the system's CA store. Certificates are always verified.",
       PathCheck::kReadableFile},
  };
  return kRows;
}

// The worker's variables, then names other tools read, in README order.
const std::vector<Row<WorkerConfig>>& worker_rows() {
  using C = WorkerConfig;
  using T = ConfigType;
  constexpr auto kW = ConfigComponent::kWorker;
  constexpr auto kTool = ConfigComponent::kTooling;
  static const std::vector<Row<C>> kRows = {
      {"RULES", "rules_path", &C::rules_path, T::kPath, {},
       "Extra rules file (docs/rules.md), read by workers and the router; a "
       "bad file stops them at start-up naming file, line and rule.",
       PathCheck::kReadableFile, kW},
      {"PORT", "port", &C::port, T::kPort, {0, 65535},
       "Port of the native health endpoint, served off the event loop; 0 "
       "picks a free port; unset: not served.",
       PathCheck::kNone, kW},
      {"BIND", "bind", &C::bind, T::kAddress, {},
       "IP address the native health endpoint listens on.", PathCheck::kNone,
       kW},
      {"LOOP_HANG_S", "loop_hang_s", &C::loop_hang_s, T::kSeconds,
       {kMinSeconds, kDay},
       "Seconds the event loop may go without a heartbeat before the worker "
       "reports itself hung.",
       PathCheck::kNone, kW},
      {"STALL_S", "stall_s", &C::stall_s, T::kSeconds,
       {kMinSeconds, kDay, false, true},
       "Seconds engine calls may be in flight without one of them, or one "
       "engine request, completing before the worker reports its engine "
       "stalled (fatal); 0 disables the stall watchdog.",
       PathCheck::kNone, kW},
      {"TASK_HANG_S", "task_hang_s", &C::task_hang_s, T::kSeconds,
       {kMinSeconds, kDay, false, true},
       "Seconds a task may make no progress of its own (no engine call or "
       "request ending for it, in or out of engine calls) before it is failed "
       "as hung, for the router to resubmit; when every task is hung the "
       "worker is stalled (fatal); 0 disables.",
       PathCheck::kNone, kW},
      {"VERIFY_S", "verify_s", &C::verify_s, T::kSeconds,
       {kMinSeconds, 60, false, true},
       "Seconds the worker may spend asking its engine (vLLM's health call, "
       "lmdeploy's loops, llama.cpp, a device sync) whether it still works "
       "after a failure no rule decides; a dead engine makes it fatal "
       "(engine_check_failed); 0 never asks.",
       PathCheck::kNone, kW},
      {"EXIT_ON_FATAL", "exit_on_fatal", &C::exit_on_fatal, T::kFlag, {},
       "After an engine death, fail pending tasks, answer 503 for "
       "EXIT_GRACE_S, then exit with code 75 (for supervisors that only react "
       "to a process exit).",
       PathCheck::kNone, kW},
      {"EXIT_GRACE_S", "exit_grace_s", &C::exit_grace_s, T::kSeconds,
       {0, 3600}, "Seconds of 503 answers before that exit.",
       PathCheck::kNone, kW},
      {"RETRY_AFTER_S", "retry_after_s", &C::retry_after_s, T::kInteger,
       {1, 3600},
       "Retry-After, in whole seconds, on the 503 a dead worker gives new "
       "submissions.",
       PathCheck::kNone, kW},
      {"EXPOSE_ERRORS", "expose_errors", &C::expose_errors, T::kFlag, {},
       "Show the failing task's exception message in /health and in other "
       "tasks' errors (it can quote a user's document); off: rule, category, "
       "exception type and time only.",
       PathCheck::kNone, kW},
      {"ERROR_BUDGET", "error_budget", &C::error_budget, T::kInteger,
       {1, 10000},
       "Ambiguous device errors (a standalone out-of-memory...) within "
       "ERROR_BUDGET_WINDOW_S that make the worker fatal (error_budget); "
       "fewer stay task-local.",
       PathCheck::kNone, kW},
      {"ERROR_BUDGET_WINDOW_S", "error_budget_window_s",
       &C::error_budget_window_s, T::kSeconds, {1, kDay},
       "The window ERROR_BUDGET counts in.", PathCheck::kNone, kW},
      {"PARENT_PID", "parent_pid", &C::parent_pid, T::kInteger, {0, 4194304},
       "Set by mineru-router for the workers it launches: the worker exits "
       "when that process dies, however it dies; 0 or unset: no such link.",
       PathCheck::kNone, kW},
      {"TASK_STORE", "task_store", &C::task_store, T::kFlag, {},
       "Keep every finished task (status, verdict, where its output is) in a "
       "SQLite file in STATE_DIR, so that a restarted worker still serves "
       "results completed before the restart.",
       PathCheck::kNone, kW},
      {"STATE_DIR", "state_dir", &C::state_dir, T::kPath, {},
       "Directory of the task store (created if missing); unset: MinerU's "
       "output root (MINERU_API_OUTPUT_ROOT). mineru-router gives each local "
       "worker one that outlives its restarts.",
       PathCheck::kNone, kW},
      {"FAULT_PLAN", "", {}, T::kPath, {},
       "Tests and the demo only: fault injection plan file, read by the "
       "sandbox's plugin (python/mineru_health/testing/faults.py); `{port}` "
       "in it is replaced by the worker's port; workers ignore it.",
       PathCheck::kNone, kTool, true},
      {"FAULT_HANG_S", "", {}, T::kSeconds, {0, kDay},
       "Tests and the demo only: how long a `hang` fault blocks (default "
       "3600); workers ignore it.",
       PathCheck::kNone, kTool, true},
      {"MINERU_PYTHON", "", {}, T::kPath, {},
       "Tests and the demo only: the Python that runs MinerU (default: the "
       "current one); workers ignore it.",
       PathCheck::kNone, kTool, true},
      {"MINERU4_PYTHON", "", {}, T::kPath, {},
       "Tests and benchmarks only: the Python of a MinerU 4.0 environment "
       "(the 4.0 integration tests skip without it); workers ignore it.",
       PathCheck::kNone, kTool, true},
      {"RELEASE_WHEELS", "", {}, T::kPath, {},
       "Tests only: directory of the MinerU release wheels the patch "
       "manifests name (scripts/setup.sh fetches them); workers ignore it.",
       PathCheck::kNone, kTool, true},
      {"PATCHES_DIR", "", {}, T::kPath, {},
       "`mineru-health patch` only: directory of the patch sets (default: the "
       "installed ones); workers ignore it.",
       PathCheck::kNone, kTool},
  };
  return kRows;
}
// clang-format on

[[noreturn]] void refuse(const std::string& variable,
                         const std::string& message) {
  throw ConfigError(variable, message);
}

// `{}` prints doubles in their shortest round-trip form: 3 -> "3", 1.5 ->
// "1.5".
std::string number_text(double value) { return fmt::format("{}", value); }

// The value as fmt 9's "{:?}" writes a string: in double quotes, with quotes,
// backslashes and control characters escaped. Spelled out because fmt 7 and 8
// (Debian 11, Ubuntu 22.04) have no "?" specifier.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if ((c >= 0 && c < 0x20) || c == 0x7f) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Locale-independent and whole-string, with no leading blanks or '+'.
// libstdc++ has floating-point from_chars only from GCC 11; before that (Debian
// 11's GCC 10) a classic-locale stream reads the same decimal forms.
bool parse_double(const std::string& text, double& value) {
  if (text.empty() || text.front() == '+') return false;
#if defined(__cpp_lib_to_chars)
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end;
#else
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  in >> std::noskipws >> value;
  return !in.fail() && in.peek() == std::istringstream::traits_type::eof();
#endif
}

std::string range_text(const ConfigVariable& v) {
  return fmt::format("[{}, {}{}", number_text(*v.min_value),
                     number_text(*v.max_value), v.max_exclusive ? ")" : "]");
}

bool is_integral(ConfigType type) {
  return type == ConfigType::kInteger || type == ConfigType::kPort;
}

// The rule a numeric value breaks, as in "X=7 must be <rule>".
std::string range_rule(const ConfigVariable& v) {
  std::string rule =
      (is_integral(v.type) ? "an integer in " : "in ") + range_text(v);
  return v.zero_disables ? "0 (off) or " + rule : rule;
}

std::string allowed_text(const ConfigVariable& v, PathCheck check) {
  switch (v.type) {
    case ConfigType::kSeconds:
    case ConfigType::kNumber:
    case ConfigType::kInteger: {
      std::string range =
          (v.type == ConfigType::kInteger ? "integer " : "") + range_text(v);
      return v.zero_disables ? "0 (off) or " + range : range;
    }
    case ConfigType::kPort:
      return "unset, or integer " + range_text(v);
    case ConfigType::kFlag:
      return "1/0 (or true/false, yes/no, on/off)";
    case ConfigType::kText:
      return "non-empty text";
    case ConfigType::kAddress:
      return "IPv4 or IPv6 address";
    case ConfigType::kChoice:
      return fmt::format("{}", fmt::join(v.choices, ", "));
    case ConfigType::kPath:
      switch (check) {
        case PathCheck::kReadableFile:
          return "unset, or a readable regular file";
        case PathCheck::kWritableFile:
          return "unset, or a file that can be created and appended to";
        case PathCheck::kNone:
          return "unset, or a path";
      }
  }
  return "";
}

// --- reading and writing struct members ----------------------------------

template <typename Config>
std::string member_text(const Config& config, const Member<Config>& member) {
  return std::visit(
      [&](auto pointer) -> std::string {
        using P = decltype(pointer);
        if constexpr (std::is_same_v<P, std::monostate>) {
          return "";
        } else {
          const auto& value = config.*pointer;
          using V = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<V, bool>) {
            return value ? "1" : "0";
          } else if constexpr (std::is_same_v<V, std::string>) {
            return value;
          } else if constexpr (std::is_same_v<V, std::optional<int>>) {
            return value ? fmt::format("{}", *value) : "";
          } else if constexpr (std::is_same_v<V, double>) {
            return number_text(value);
          } else {
            return fmt::format("{}", value);
          }
        }
      },
      member);
}

// The member's value as a number, or nullopt (not numeric, or unset port).
template <typename Config>
std::optional<double> member_number(const Config& config,
                                    const Member<Config>& member) {
  return std::visit(
      [&](auto pointer) -> std::optional<double> {
        using P = decltype(pointer);
        if constexpr (std::is_same_v<P, std::monostate>) {
          return std::nullopt;
        } else {
          const auto& value = config.*pointer;
          using V = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<V, std::optional<int>>) {
            if (!value) return std::nullopt;
            return static_cast<double>(*value);
          } else if constexpr (std::is_arithmetic_v<V> &&
                               !std::is_same_v<V, bool>) {
            return static_cast<double>(value);
          } else {
            return std::nullopt;
          }
        }
      },
      member);
}

std::string lower(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return text;
}

void check_range(const ConfigVariable& v, double value) {
  if (!std::isfinite(value)) {
    refuse(v.name, fmt::format("{}={} is not a finite number", v.name,
                               number_text(value)));
  }
  if (v.zero_disables && value == 0) return;
  bool below = value < *v.min_value;
  bool above = v.max_exclusive ? value >= *v.max_value : value > *v.max_value;
  if (below || above) {
    refuse(v.name, fmt::format("{}={} must be {}", v.name, number_text(value),
                               range_rule(v)));
  }
}

double parse_number(const ConfigVariable& v, const std::string& text) {
  double value = 0;
  if (!parse_double(text, value) || !std::isfinite(value)) {
    refuse(v.name,
           fmt::format("{}={} is not a finite number", v.name, quoted(text)));
  }
  check_range(v, value);
  return value;
}

long long parse_integer(const ConfigVariable& v, const std::string& text) {
  long long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    refuse(v.name,
           fmt::format("{}={} is not {}", v.name, quoted(text), range_rule(v)));
  }
  check_range(v, static_cast<double>(value));
  return value;
}

bool parse_flag(const ConfigVariable& v, const std::string& text) {
  const std::string word = lower(text);
  if (word.empty() || word == "0" || word == "false" || word == "no" ||
      word == "off") {
    return false;
  }
  if (word == "1" || word == "true" || word == "yes" || word == "on") {
    return true;
  }
  refuse(v.name, fmt::format("{}={} is not a flag: use {}", v.name,
                             quoted(text), v.allowed));
}

bool is_ip_literal(const std::string& text) {
  in6_addr buffer{};
  return inet_pton(AF_INET, text.c_str(), &buffer) == 1 ||
         inet_pton(AF_INET6, text.c_str(), &buffer) == 1;
}

void check_text(const ConfigVariable& v, const std::string& text) {
  if (v.type == ConfigType::kText && text.empty()) {
    refuse(v.name, fmt::format("{} must not be empty", v.name));
  }
  if (v.type == ConfigType::kAddress && !is_ip_literal(text)) {
    refuse(v.name,
           fmt::format("{}={} is not an IP address (e.g. 127.0.0.1 or ::1; "
                       "host names are not resolved)",
                       v.name, quoted(text)));
  }
  if (v.type == ConfigType::kChoice) {
    for (const std::string& choice : v.choices) {
      if (text == choice) return;
    }
    refuse(v.name, fmt::format("{}={} is not one of {}", v.name, quoted(text),
                               v.allowed));
  }
}

template <typename Config>
void assign(Config& config, const Member<Config>& member,
            const ConfigVariable& v, const std::string& text) {
  std::visit(
      [&](auto pointer) {
        using P = decltype(pointer);
        if constexpr (!std::is_same_v<P, std::monostate>) {
          auto& target = config.*pointer;
          using V = std::decay_t<decltype(target)>;
          if constexpr (std::is_same_v<V, bool>) {
            // Empty means unset: the flag keeps its default (TASK_STORE is on).
            if (!text.empty()) target = parse_flag(v, text);
          } else if constexpr (std::is_same_v<V, std::string>) {
            check_text(v, text);
            target = text;
          } else if constexpr (std::is_same_v<V, std::optional<int>>) {
            if (text.empty()) {
              target.reset();
            } else {
              target = static_cast<int>(parse_integer(v, text));
            }
          } else if constexpr (std::is_same_v<V, double>) {
            target = parse_number(v, text);
          } else {
            target = static_cast<V>(parse_integer(v, text));
          }
        }
      },
      member);
}

// --- the derived tables ------------------------------------------------------

template <typename Config>
struct Entry {
  ConfigVariable variable;
  Member<Config> member;
  PathCheck path_check;
};

template <typename Config>
Entry<Config> derive(const Row<Config>& row, const char* prefix,
                     const Config& defaults) {
  ConfigVariable v;
  v.name = std::string(prefix) + row.suffix;
  v.field = row.field;
  v.component = row.component;
  v.type = row.type;
  v.default_value = member_text(defaults, row.member);
  if (is_numeric(row.type)) {
    v.min_value = row.limits.min;
    v.max_value = row.limits.max;
    v.max_exclusive = row.limits.max_exclusive;
    v.zero_disables = row.limits.zero_disables;
  }
  v.meaning = row.meaning;
  v.test_only = row.test_only;
  return {std::move(v), row.member, row.path_check};
}

const std::vector<Entry<HealthConfig>>& router_entries() {
  static const std::vector<Entry<HealthConfig>> kEntries = [] {
    std::vector<Entry<HealthConfig>> entries;
    const HealthConfig defaults;
    for (const Row<HealthConfig>& row : router_rows()) {
      Entry<HealthConfig> e = derive(row, kRouterPrefix, defaults);
      if (e.variable.name == kPresetName) {
        e.variable.choices = preset_names();
        e.variable.default_value = kDefaultPreset;
      } else {
        for (const std::string& name : preset_names()) {
          e.variable.preset_values.emplace_back(
              name, member_text(preset(name), e.member));
        }
      }
      e.variable.allowed = allowed_text(e.variable, e.path_check);
      entries.push_back(std::move(e));
    }
    return entries;
  }();
  return kEntries;
}

const std::vector<Entry<WorkerConfig>>& worker_entries() {
  static const std::vector<Entry<WorkerConfig>> kEntries = [] {
    std::vector<Entry<WorkerConfig>> entries;
    const WorkerConfig defaults;
    for (const Row<WorkerConfig>& row : worker_rows()) {
      Entry<WorkerConfig> e = derive(row, kWorkerPrefix, defaults);
      e.variable.allowed = allowed_text(e.variable, e.path_check);
      entries.push_back(std::move(e));
    }
    return entries;
  }();
  return kEntries;
}

const std::vector<ConfigVariable>& all_variables() {
  static const std::vector<ConfigVariable> kAll = [] {
    std::vector<ConfigVariable> all;
    for (const auto& e : router_entries()) all.push_back(e.variable);
    for (const auto& e : worker_entries()) all.push_back(e.variable);
    return all;
  }();
  return kAll;
}

PathCheck path_check_of(const ConfigVariable& variable) {
  for (const auto& e : router_entries()) {
    if (e.variable.name == variable.name) return e.path_check;
  }
  for (const auto& e : worker_entries()) {
    if (e.variable.name == variable.name) return e.path_check;
  }
  return PathCheck::kNone;
}

// Each value within its table bounds.
template <typename Config>
void validate_values(const std::vector<Entry<Config>>& entries,
                     const Config& config) {
  for (const Entry<Config>& e : entries) {
    const ConfigVariable& v = e.variable;
    if (is_numeric(v.type)) {
      if (auto value = member_number(config, e.member)) check_range(v, *value);
    } else if (v.type == ConfigType::kText || v.type == ConfigType::kAddress) {
      check_text(v, member_text(config, e.member));
    }
  }
}

// Checked at start-up so that a typo stops the process there instead of
// failing every HTTPS probe or audit record later.
template <typename Config>
void validate_files(const std::vector<Entry<Config>>& entries,
                    const Config& config) {
  for (const Entry<Config>& e : entries) {
    internal::check_path(e.path_check, e.variable.name,
                         member_text(config, e.member));
  }
}

template <typename Config>
void refuse_unknown(const std::vector<Entry<Config>>& entries,
                    const std::map<std::string, std::string>& env,
                    const std::string& prefix) {
  // Refuse typos before anything else: a misspelt variable silently falling
  // back to its default is worse than not starting.
  for (const auto& [name, value] : env) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    bool known = false;
    for (const auto& e : entries) known = known || e.variable.name == name;
    if (known) continue;
    std::vector<std::string> names;
    for (const auto& e : entries) names.push_back(e.variable.name);
    refuse(name, fmt::format("unknown variable {} (known: {})", name,
                             fmt::join(names, ", ")));
  }
}

template <typename Config>
void apply_env(const std::vector<Entry<Config>>& entries,
               const std::map<std::string, std::string>& env, Config& config) {
  for (const Entry<Config>& e : entries) {
    auto it = env.find(e.variable.name);
    if (it != env.end()) assign(config, e.member, e.variable, it->second);
  }
}

const ConfigVariable& router_variable(const char* field) {
  return config_variable_for(ConfigComponent::kRouter, field);
}

std::string show(const char* field, double value) {
  return fmt::format("{}={}", router_variable(field).name, number_text(value));
}

}  // namespace

const char* to_string(ConfigComponent component) {
  switch (component) {
    case ConfigComponent::kRouter:
      return "router";
    case ConfigComponent::kWorker:
      return "worker";
    case ConfigComponent::kTooling:
      return "tooling";
  }
  return "unknown";
}

const char* to_string(ConfigType type) {
  switch (type) {
    case ConfigType::kSeconds:
      return "seconds";
    case ConfigType::kNumber:
      return "number";
    case ConfigType::kInteger:
      return "integer";
    case ConfigType::kFlag:
      return "flag";
    case ConfigType::kText:
      return "text";
    case ConfigType::kPath:
      return "path";
    case ConfigType::kPort:
      return "port";
    case ConfigType::kAddress:
      return "address";
    case ConfigType::kChoice:
      return "choice";
  }
  return "unknown";
}

const char* env_prefix(ConfigComponent component) {
  return component == ConfigComponent::kRouter ? kRouterPrefix : kWorkerPrefix;
}

std::vector<ConfigVariable> config_variables() { return all_variables(); }

const ConfigVariable& config_variable_for(ConfigComponent component,
                                          const std::string& field) {
  for (const ConfigVariable& v : all_variables()) {
    if (v.component == component && v.field == field && !field.empty()) {
      return v;
    }
  }
  throw std::out_of_range(fmt::format("no {} configuration field {}",
                                      to_string(component), quoted(field)));
}

std::vector<std::string> preset_names() {
  return {"fast", kDefaultPreset, "outage-tolerant"};
}

HealthConfig preset(const std::string& name) {
  HealthConfig c;
  if (name == kDefaultPreset) return c;
  if (name == "fast") {
    c.interval_s = 1;
    c.probe_timeout_s = 0.5;
    c.connect_timeout_s = 0.25;
    c.failure_threshold = 2;
    c.backoff_base_s = 1;
    c.backoff_max_s = 10;
    c.max_attempts = 5;
    c.boot_timeout_s = 120;
    // Demos and tests watch a restart succeed within a minute.
    c.stable_window_s = 30;
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
    c.main_port_timeout_s = 120;
    c.stable_window_s = 1200;
    return c;
  }
  refuse(kPresetName,
         fmt::format("{}={} is not a preset ({})", kPresetName, quoted(name),
                     fmt::join(preset_names(), ", ")));
}

HealthConfig health_config_from_env(
    const std::map<std::string, std::string>& env) {
  refuse_unknown(router_entries(), env, kRouterPrefix);
  auto preset_it = env.find(kPresetName);
  HealthConfig config =
      preset(preset_it == env.end() ? kDefaultPreset : preset_it->second);
  apply_env(router_entries(), env, config);
  validate(config);
  check_files(config);
  return config;
}

WorkerConfig worker_config_from_env(
    const std::map<std::string, std::string>& env) {
  refuse_unknown(worker_entries(), env, kWorkerPrefix);
  WorkerConfig config;
  apply_env(worker_entries(), env, config);
  validate(config);
  check_files(config);
  return config;
}

void validate(const HealthConfig& c) {
  // Each value within its bounds first, so a cross-field message never
  // quotes a value that is wrong on its own.
  validate_values(router_entries(), c);
  if (c.probe_timeout_s >= c.interval_s) {
    // Otherwise probes of one worker overlap and a hung worker costs more
    // than one interval per probe.
    refuse(router_variable("probe_timeout_s").name,
           fmt::format("{} must be below {}",
                       show("probe_timeout_s", c.probe_timeout_s),
                       show("interval_s", c.interval_s)));
  }
  if (c.connect_timeout_s > c.probe_timeout_s) {
    refuse(router_variable("connect_timeout_s").name,
           fmt::format("{} must be at most {}",
                       show("connect_timeout_s", c.connect_timeout_s),
                       show("probe_timeout_s", c.probe_timeout_s)));
  }
  if (c.main_port_timeout_s < c.connect_timeout_s) {
    refuse(router_variable("main_port_timeout_s").name,
           fmt::format("{} must be at least {}",
                       show("main_port_timeout_s", c.main_port_timeout_s),
                       show("connect_timeout_s", c.connect_timeout_s)));
  }
  if (c.backoff_base_s > c.backoff_max_s) {
    refuse(router_variable("backoff_base_s").name,
           fmt::format("{} must be at most {}",
                       show("backoff_base_s", c.backoff_base_s),
                       show("backoff_max_s", c.backoff_max_s)));
  }
}

void validate(const WorkerConfig& config) {
  validate_values(worker_entries(), config);
}

void check_files(const HealthConfig& config) {
  validate_files(router_entries(), config);
}

void check_files(const WorkerConfig& config) {
  validate_files(worker_entries(), config);
}

void check_path(const ConfigVariable& variable, const std::string& path) {
  internal::check_path(path_check_of(variable), variable.name, path);
}

}  // namespace mineru_health
