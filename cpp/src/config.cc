// Router and worker configuration: one table per component, from which the
// parser, the validator, the documentation and the Python field lists are all
// derived. Bad configuration is an operator error, so it throws ConfigError
// (naming the variable and the rule) once, at start-up.
//
// The rows themselves are config_variables.def, which also declares the
// struct members: this file turns them into ConfigVariable entries and holds
// the one parser and validator that read them.
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

// Numeric bounds of a row; `range` in config_variables.def is the argument
// list of limits().
enum Edge { kClosed, kMaxExclusive, kZeroDisables };

struct Limits {
  double min = 0;
  double max = 0;
  bool max_exclusive = false;
  bool zero_disables = false;
};

constexpr Limits limits() { return {}; }
constexpr Limits limits(double min, double max, Edge edge = kClosed) {
  return {min, max, edge == kMaxExclusive, edge == kZeroDisables};
}

template <typename Config>
using Member =
    std::variant<std::monostate, double Config::*, int Config::*,
                 std::size_t Config::*, bool Config::*, std::string Config::*,
                 std::optional<int> Config::*>;

// One row of config_variables.def; ConfigVariable is derived from it.
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
  // Router rows: the value in the fast and outage-tolerant presets, as an
  // operator writes it; "" = the default.
  const char* fast = "";
  const char* outage_tolerant = "";
};

// The presets, in preset_names() order: each reads its column of the router
// rows over the defaults (production's column is the defaults themselves).
struct Preset {
  const char* name;
  const char* Row<HealthConfig>::*column;  // nullptr: the defaults
};
constexpr Preset kPresets[] = {
    {"fast", &Row<HealthConfig>::fast},
    {kDefaultPreset, nullptr},
    {"outage-tolerant", &Row<HealthConfig>::outage_tolerant},
};

bool is_numeric(ConfigType type) {
  return type == ConfigType::kSeconds || type == ConfigType::kNumber ||
         type == ConfigType::kInteger || type == ConfigType::kPort;
}

// The router's variables, in README order.
const std::vector<Row<HealthConfig>>& router_rows() {
  static const std::vector<Row<HealthConfig>> kRows = {
#define MINERU_HEALTH_ROUTER_NAME(suffix, type, meaning) \
  {#suffix, "", {}, ConfigType::type, {}, meaning},
#define MINERU_HEALTH_ROUTER_FIELD(suffix, field, cpp_type, default_value, \
                                   type, range, path_check, fast,          \
                                   outage_tolerant, meaning)               \
  {#suffix,      #field,  &HealthConfig::field,  ConfigType::type,         \
   limits range, meaning, PathCheck::path_check, ConfigComponent::kRouter, \
   false,        fast,    outage_tolerant},
#include "mineru_health/config_variables.def"
  };
  return kRows;
}

// The worker's variables, then names other tools read, in README order.
const std::vector<Row<WorkerConfig>>& worker_rows() {
  static const std::vector<Row<WorkerConfig>> kRows = {
#define MINERU_HEALTH_WORKER_FIELD(suffix, field, cpp_type, default_value, \
                                   type, range, path_check, test_only,     \
                                   meaning)                                \
  {#suffix,      #field,  &WorkerConfig::field,  ConfigType::type,         \
   limits range, meaning, PathCheck::path_check, ConfigComponent::kWorker, \
   test_only},
#define MINERU_HEALTH_TOOLING_NAME(suffix, type, range, test_only, meaning) \
  {#suffix,                                                                 \
   "",                                                                      \
   {},                                                                      \
   ConfigType::type,                                                        \
   limits range,                                                            \
   meaning,                                                                 \
   PathCheck::kNone,                                                        \
   ConfigComponent::kTooling,                                               \
   test_only},
#include "mineru_health/config_variables.def"
  };
  return kRows;
}

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
    case ConfigType::kLabel:
      return "unset, or any text";
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
  const Row<Config>* row;  // member, path check and preset columns
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
  return {std::move(v), &row};
}

// The defaults with `preset`'s column of the router rows applied (parsed
// and checked like the operator's own values).
HealthConfig apply_preset(const std::vector<Entry<HealthConfig>>& entries,
                          const Preset& preset) {
  HealthConfig config;
  if (preset.column == nullptr) return config;
  for (const Entry<HealthConfig>& e : entries) {
    const std::string text = e.row->*preset.column;
    if (!text.empty()) assign(config, e.row->member, e.variable, text);
  }
  return config;
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
      }
      e.variable.allowed = allowed_text(e.variable, row.path_check);
      entries.push_back(std::move(e));
    }
    // Each preset's value of each field, as the operator would write it.
    for (const Preset& p : kPresets) {
      const HealthConfig config = apply_preset(entries, p);
      for (Entry<HealthConfig>& e : entries) {
        if (e.variable.field.empty()) continue;
        e.variable.preset_values.emplace_back(
            p.name, member_text(config, e.row->member));
      }
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
      e.variable.allowed = allowed_text(e.variable, row.path_check);
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
    if (e.variable.name == variable.name) return e.row->path_check;
  }
  for (const auto& e : worker_entries()) {
    if (e.variable.name == variable.name) return e.row->path_check;
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
      if (auto value = member_number(config, e.row->member))
        check_range(v, *value);
    } else if (v.type == ConfigType::kText || v.type == ConfigType::kAddress) {
      check_text(v, member_text(config, e.row->member));
    }
  }
}

// Checked at start-up so that a typo stops the process there instead of
// failing every HTTPS probe or audit record later.
template <typename Config>
void validate_files(const std::vector<Entry<Config>>& entries,
                    const Config& config) {
  for (const Entry<Config>& e : entries) {
    internal::check_path(e.row->path_check, e.variable.name,
                         member_text(config, e.row->member));
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
    if (it != env.end()) assign(config, e.row->member, e.variable, it->second);
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
    case ConfigType::kLabel:
      return "label";
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
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

HealthConfig preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return apply_preset(router_entries(), p);
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
