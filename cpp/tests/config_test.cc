#include "mineru_health/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>

namespace mineru_health {
namespace {

using Env = std::map<std::string, std::string>;

// A fresh directory under the test's temporary directory, removed by the OS.
std::string scratch_dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "mineru_health_config_" + name +
                    "_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// Returns the ConfigError's variable and message, or "" when nothing threw.
template <typename Read>
std::pair<std::string, std::string> error_of(Read read, const Env& env) {
  try {
    read(env);
  } catch (const ConfigError& e) {
    return {e.variable(), e.what()};
  }
  return {"", ""};
}

std::pair<std::string, std::string> router_error(const Env& env) {
  return error_of(health_config_from_env, env);
}

std::pair<std::string, std::string> worker_error(const Env& env) {
  return error_of(worker_config_from_env, env);
}

TEST(ConfigTest, DefaultsAreValidAndMatchTheHeader) {
  EXPECT_NO_THROW(validate(HealthConfig{}));
  EXPECT_NO_THROW(validate(WorkerConfig{}));
  HealthConfig from_env = health_config_from_env({});
  EXPECT_EQ(from_env.interval_s, 2.0);
  EXPECT_EQ(from_env.probe_timeout_s, 1.5);
  EXPECT_EQ(from_env.connect_timeout_s, 0.5);
  EXPECT_EQ(from_env.failure_threshold, 3);
  EXPECT_EQ(from_env.healthy_threshold, 1);
  EXPECT_EQ(from_env.backoff_base_s, 1.0);
  EXPECT_EQ(from_env.backoff_max_s, 60.0);
  EXPECT_EQ(from_env.max_attempts, 5);
  EXPECT_EQ(from_env.boot_timeout_s, 300.0);
  EXPECT_EQ(from_env.concurrency, 10000);
  EXPECT_EQ(from_env.jitter, 0.1);
  EXPECT_EQ(from_env.expected_status, "healthy");
  EXPECT_EQ(from_env.max_body_bytes, 64u * 1024u);
  EXPECT_EQ(from_env.audit_path, "");
  EXPECT_EQ(from_env.main_port_timeout_s, 60.0);
  EXPECT_EQ(from_env.stable_window_s, 600.0);
  EXPECT_EQ(from_env.max_ejection_percent, 50.0);
  EXPECT_EQ(from_env.task_retries, 2);
  EXPECT_EQ(from_env.retry_budget_percent, 20.0);
  EXPECT_EQ(from_env.retry_budget_min, 3);

  WorkerConfig worker = worker_config_from_env({});
  EXPECT_FALSE(worker.port.has_value());
  EXPECT_EQ(worker.bind, "127.0.0.1");
  EXPECT_EQ(worker.loop_hang_s, 60.0);
  EXPECT_EQ(worker.stall_s, 300.0);
  EXPECT_EQ(worker.verify_s, 2.0);
  EXPECT_FALSE(worker.exit_on_fatal);
  EXPECT_EQ(worker.exit_grace_s, 5.0);
  EXPECT_EQ(worker.retry_after_s, 30);
  EXPECT_FALSE(worker.expose_errors);
  EXPECT_EQ(worker.error_budget, 3);
  EXPECT_EQ(worker.error_budget_window_s, 60.0);
  EXPECT_EQ(worker.rules_path, "");
  EXPECT_TRUE(worker.task_store);
  EXPECT_EQ(worker.state_dir, "");
}

TEST(ConfigTest, EachSideIgnoresTheOthersVariables) {
  EXPECT_NO_THROW(health_config_from_env({{"PATH", "/bin"},
                                          {"MINERU_ROUTER_PORT", "8000"},
                                          {"MINERU_HEALTH_TYPO", "1"}}));
  EXPECT_NO_THROW(worker_config_from_env(
      {{"MINERU_ROUTER_HEALTH_TYPO", "1"}, {"MINERU_API_PORT", "8000"}}));
}

TEST(ConfigTest, Presets) {
  ASSERT_EQ(preset_names(), (std::vector<std::string>{"fast", "production",
                                                      "outage-tolerant"}));
  for (const std::string& name : preset_names())
    EXPECT_NO_THROW(validate(preset(name))) << name;

  HealthConfig fast = preset("fast");
  EXPECT_EQ(fast.interval_s, 1.0);
  EXPECT_EQ(fast.probe_timeout_s, 0.5);
  EXPECT_EQ(fast.connect_timeout_s, 0.25);
  EXPECT_EQ(fast.failure_threshold, 2);
  EXPECT_EQ(fast.backoff_base_s, 1.0);
  EXPECT_EQ(fast.backoff_max_s, 10.0);
  EXPECT_EQ(fast.max_attempts, 5);
  EXPECT_EQ(fast.boot_timeout_s, 120.0);

  HealthConfig production = preset("production");
  HealthConfig defaults;
  EXPECT_EQ(production.interval_s, defaults.interval_s);
  EXPECT_EQ(production.failure_threshold, defaults.failure_threshold);
  EXPECT_EQ(production.backoff_max_s, defaults.backoff_max_s);

  HealthConfig tolerant = preset("outage-tolerant");
  EXPECT_EQ(tolerant.interval_s, 5.0);
  EXPECT_EQ(tolerant.probe_timeout_s, 3.0);
  EXPECT_EQ(tolerant.connect_timeout_s, 1.0);
  EXPECT_EQ(tolerant.failure_threshold, 5);
  EXPECT_EQ(tolerant.backoff_base_s, 5.0);
  EXPECT_EQ(tolerant.backoff_max_s, 600.0);
  EXPECT_EQ(tolerant.max_attempts, 12);
  EXPECT_EQ(tolerant.boot_timeout_s, 600.0);

  try {
    preset("slow");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.variable(), "MINERU_ROUTER_HEALTH_PRESET");
  }
}

TEST(ConfigTest, PresetThenVariablesOverIt) {
  HealthConfig c = health_config_from_env(
      {{"MINERU_ROUTER_HEALTH_PRESET", "outage-tolerant"},
       {"MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "3"},
       {"MINERU_ROUTER_HEALTH_EXPECTED_STATUS", "ok"},
       {"MINERU_ROUTER_HEALTH_AUDIT_PATH",
        scratch_dir("preset") + "/a.jsonl"}});
  EXPECT_EQ(c.interval_s, 5.0);
  EXPECT_EQ(c.max_attempts, 3);
  EXPECT_EQ(c.expected_status, "ok");
}

// --- values that parse ---------------------------------------------------

struct RouterValue {
  const char* variable;
  const char* value;
  std::function<bool(const HealthConfig&)> holds;
};

class RouterValueTest : public ::testing::TestWithParam<RouterValue> {};

TEST_P(RouterValueTest, Parses) {
  const RouterValue& v = GetParam();
  // Interval and timeout are raised together so that each value fits the
  // cross-field rules on its own.
  Env env = {{"MINERU_ROUTER_HEALTH_INTERVAL_S", "20000"},
             {"MINERU_ROUTER_HEALTH_TIMEOUT_S", "10000"},
             {"MINERU_ROUTER_HEALTH_BACKOFF_MAX_S", "86400"}};
  env[v.variable] = v.value;
  EXPECT_TRUE(v.holds(health_config_from_env(env)))
      << v.variable << "=" << v.value;
}

INSTANTIATE_TEST_SUITE_P(
    Values, RouterValueTest,
    ::testing::Values(
        RouterValue{
            "MINERU_ROUTER_HEALTH_INTERVAL_S", "86400",
            [](const HealthConfig& c) { return c.interval_s == 86400; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_TIMEOUT_S", "2.5",
            [](const HealthConfig& c) { return c.probe_timeout_s == 2.5; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "1e-3",
            [](const HealthConfig& c) { return c.connect_timeout_s == 0.001; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "4",
            [](const HealthConfig& c) { return c.failure_threshold == 4; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_HEALTHY_THRESHOLD", "2",
            [](const HealthConfig& c) { return c.healthy_threshold == 2; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_BACKOFF_BASE_S", "5",
            [](const HealthConfig& c) { return c.backoff_base_s == 5; }},
        RouterValue{"MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "0",
                    [](const HealthConfig& c) { return c.max_attempts == 0; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "1",
            [](const HealthConfig& c) { return c.boot_timeout_s == 1; }},
        RouterValue{"MINERU_ROUTER_HEALTH_CONCURRENCY", "50",
                    [](const HealthConfig& c) { return c.concurrency == 50; }},
        RouterValue{"MINERU_ROUTER_HEALTH_JITTER", "0",
                    [](const HealthConfig& c) { return c.jitter == 0; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "1024",
            [](const HealthConfig& c) { return c.max_body_bytes == 1024; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S", "30",
            [](const HealthConfig& c) { return c.main_port_timeout_s == 30; }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_STABLE_WINDOW_S", "0",
            [](const HealthConfig& c) { return c.stable_window_s == 0; }},
        RouterValue{"MINERU_ROUTER_HEALTH_MAX_EJECTION_PERCENT", "100",
                    [](const HealthConfig& c) {
                      return c.max_ejection_percent == 100;
                    }},
        RouterValue{"MINERU_ROUTER_HEALTH_TASK_RETRIES", "10",
                    [](const HealthConfig& c) { return c.task_retries == 10; }},
        RouterValue{"MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT", "2.5",
                    [](const HealthConfig& c) {
                      return c.retry_budget_percent == 2.5;
                    }},
        RouterValue{
            "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN", "0",
            [](const HealthConfig& c) { return c.retry_budget_min == 0; }}));

struct WorkerValue {
  const char* variable;
  const char* value;
  std::function<bool(const WorkerConfig&)> holds;
};

class WorkerValueTest : public ::testing::TestWithParam<WorkerValue> {};

TEST_P(WorkerValueTest, Parses) {
  const WorkerValue& v = GetParam();
  EXPECT_TRUE(v.holds(worker_config_from_env({{v.variable, v.value}})))
      << v.variable << "=" << v.value;
}

INSTANTIATE_TEST_SUITE_P(
    Values, WorkerValueTest,
    ::testing::Values(
        WorkerValue{"MINERU_HEALTH_PORT", "",
                    [](const WorkerConfig& c) { return !c.port; }},
        WorkerValue{"MINERU_HEALTH_PORT", "0",
                    [](const WorkerConfig& c) { return c.port == 0; }},
        WorkerValue{"MINERU_HEALTH_PORT", "65535",
                    [](const WorkerConfig& c) { return c.port == 65535; }},
        WorkerValue{"MINERU_HEALTH_BIND", "::1",
                    [](const WorkerConfig& c) { return c.bind == "::1"; }},
        WorkerValue{"MINERU_HEALTH_BIND", "0.0.0.0",
                    [](const WorkerConfig& c) { return c.bind == "0.0.0.0"; }},
        WorkerValue{"MINERU_HEALTH_LOOP_HANG_S", "0.5",
                    [](const WorkerConfig& c) { return c.loop_hang_s == 0.5; }},
        WorkerValue{"MINERU_HEALTH_STALL_S", "0",
                    [](const WorkerConfig& c) { return c.stall_s == 0; }},
        WorkerValue{"MINERU_HEALTH_VERIFY_S", "0",
                    [](const WorkerConfig& c) { return c.verify_s == 0; }},
        WorkerValue{"MINERU_HEALTH_EXIT_ON_FATAL", "1",
                    [](const WorkerConfig& c) { return c.exit_on_fatal; }},
        WorkerValue{"MINERU_HEALTH_EXIT_ON_FATAL", "Yes",
                    [](const WorkerConfig& c) { return c.exit_on_fatal; }},
        WorkerValue{"MINERU_HEALTH_EXIT_ON_FATAL", "off",
                    [](const WorkerConfig& c) { return !c.exit_on_fatal; }},
        WorkerValue{"MINERU_HEALTH_EXIT_ON_FATAL", "",
                    [](const WorkerConfig& c) { return !c.exit_on_fatal; }},
        WorkerValue{"MINERU_HEALTH_EXIT_GRACE_S", "0",
                    [](const WorkerConfig& c) { return c.exit_grace_s == 0; }},
        WorkerValue{
            "MINERU_HEALTH_EXIT_GRACE_S", "3600",
            [](const WorkerConfig& c) { return c.exit_grace_s == 3600; }},
        WorkerValue{
            "MINERU_HEALTH_RETRY_AFTER_S", "3600",
            [](const WorkerConfig& c) { return c.retry_after_s == 3600; }},
        WorkerValue{"MINERU_HEALTH_EXPOSE_ERRORS", "TRUE",
                    [](const WorkerConfig& c) { return c.expose_errors; }},
        WorkerValue{"MINERU_HEALTH_ERROR_BUDGET", "1",
                    [](const WorkerConfig& c) { return c.error_budget == 1; }},
        WorkerValue{"MINERU_HEALTH_ERROR_BUDGET_WINDOW_S", "3600",
                    [](const WorkerConfig& c) {
                      return c.error_budget_window_s == 3600;
                    }},
        WorkerValue{"MINERU_HEALTH_TASK_STORE", "0",
                    [](const WorkerConfig& c) { return !c.task_store; }},
        WorkerValue{"MINERU_HEALTH_TASK_STORE", "on",
                    [](const WorkerConfig& c) { return c.task_store; }},
        // An empty flag is unset: a default-on flag stays on.
        WorkerValue{"MINERU_HEALTH_TASK_STORE", "",
                    [](const WorkerConfig& c) { return c.task_store; }},
        WorkerValue{"MINERU_HEALTH_STATE_DIR", "/var/lib/mineru-health",
                    [](const WorkerConfig& c) {
                      return c.state_dir == "/var/lib/mineru-health";
                    }},
        // Names the harness, the fault plugin and the CLI read: accepted,
        // not stored, not checked (the plugin checks its own).
        WorkerValue{"MINERU_HEALTH_FAULT_PLAN", "/tmp/plan-{port}.json",
                    [](const WorkerConfig&) { return true; }},
        WorkerValue{"MINERU_HEALTH_FAULT_HANG_S", "-1",
                    [](const WorkerConfig&) { return true; }},
        WorkerValue{"MINERU_HEALTH_MINERU_PYTHON", "/usr/bin/python3",
                    [](const WorkerConfig&) { return true; }},
        WorkerValue{"MINERU_HEALTH_PATCHES_DIR", "/opt/patches",
                    [](const WorkerConfig&) { return true; }}));

// --- values refused, naming their variable --------------------------------

struct BadValue {
  const char* variable;
  std::string value;
};

class RouterBadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(RouterBadValueTest, NamesItsVariable) {
  const BadValue& bad = GetParam();
  auto [variable, message] = router_error({{bad.variable, bad.value}});
  EXPECT_EQ(variable, bad.variable) << bad.value << ": " << message;
  EXPECT_NE(message.find(bad.variable), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Values, RouterBadValueTest,
    ::testing::Values(
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "two"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", ""},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", " 2"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "2s"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "-2"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "inf"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "nan"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "1e300"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVAL_S", "86401"},
        BadValue{"MINERU_ROUTER_HEALTH_TIMEOUT_S", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_TIMEOUT_S", "1e-300"},
        BadValue{"MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "-0.1"},
        BadValue{"MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "1e-300"},
        BadValue{"MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "1.6"},
        BadValue{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "2.5"},
        BadValue{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "99999999999"},
        BadValue{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "1001"},
        BadValue{"MINERU_ROUTER_HEALTH_HEALTHY_THRESHOLD", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_BACKOFF_BASE_S", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_BACKOFF_BASE_S", "61"},
        BadValue{"MINERU_ROUTER_HEALTH_BACKOFF_MAX_S", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "+3"},
        BadValue{"MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "1e-300"},
        BadValue{"MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "0.5"},
        BadValue{"MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S", "0.0001"},
        BadValue{"MINERU_ROUTER_HEALTH_STABLE_WINDOW_S", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_STABLE_WINDOW_S", "1e9"},
        BadValue{"MINERU_ROUTER_HEALTH_CONCURRENCY", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_CONCURRENCY", "1000001"},
        BadValue{"MINERU_ROUTER_HEALTH_JITTER", "0.5"},
        BadValue{"MINERU_ROUTER_HEALTH_JITTER", "-0.1"},
        BadValue{"MINERU_ROUTER_HEALTH_EXPECTED_STATUS", ""},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "255"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "16777217"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_EJECTION_PERCENT", "100.5"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_EJECTION_PERCENT", "nan"},
        BadValue{"MINERU_ROUTER_HEALTH_TASK_RETRIES", "11"},
        BadValue{"MINERU_ROUTER_HEALTH_TASK_RETRIES", "1.5"},
        BadValue{"MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT", "inf"},
        BadValue{"MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN", "1001"},
        BadValue{"MINERU_ROUTER_HEALTH_CA_FILE", "/nonexistent/ca.pem"},
        BadValue{"MINERU_ROUTER_HEALTH_CA_FILE", "/etc"},
        BadValue{"MINERU_ROUTER_HEALTH_CA_FILE", "/dev/null"},
        BadValue{"MINERU_ROUTER_HEALTH_AUDIT_PATH", "/nonexistent/x"},
        BadValue{"MINERU_ROUTER_HEALTH_AUDIT_PATH", "/etc"},
        BadValue{"MINERU_ROUTER_HEALTH_AUDIT_PATH", "/etc/hostname/x"},
        BadValue{"MINERU_ROUTER_HEALTH_PRESET", "Fast"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVALS", "2"}));

class WorkerBadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(WorkerBadValueTest, NamesItsVariable) {
  const BadValue& bad = GetParam();
  auto [variable, message] = worker_error({{bad.variable, bad.value}});
  EXPECT_EQ(variable, bad.variable) << bad.value << ": " << message;
  EXPECT_NE(message.find(bad.variable), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Values, WorkerBadValueTest,
    ::testing::Values(BadValue{"MINERU_HEALTH_PORT", "-1"},
                      BadValue{"MINERU_HEALTH_PORT", "65536"},
                      BadValue{"MINERU_HEALTH_PORT", "http"},
                      BadValue{"MINERU_HEALTH_PORT", "80.5"},
                      BadValue{"MINERU_HEALTH_BIND", "localhost"},
                      BadValue{"MINERU_HEALTH_BIND", ""},
                      BadValue{"MINERU_HEALTH_BIND", "[::1]"},
                      BadValue{"MINERU_HEALTH_BIND", "127.0.0.1:8000"},
                      BadValue{"MINERU_HEALTH_LOOP_HANG_S", "0"},
                      BadValue{"MINERU_HEALTH_LOOP_HANG_S", "86401"},
                      BadValue{"MINERU_HEALTH_STALL_S", "1e-300"},
                      BadValue{"MINERU_HEALTH_STALL_S", "-1"},
                      BadValue{"MINERU_HEALTH_EXIT_ON_FATAL", "maybe"},
                      BadValue{"MINERU_HEALTH_EXIT_ON_FATAL", "2"},
                      BadValue{"MINERU_HEALTH_EXIT_GRACE_S", "inf"},
                      BadValue{"MINERU_HEALTH_EXIT_GRACE_S", "1e300"},
                      BadValue{"MINERU_HEALTH_EXIT_GRACE_S", "nan"},
                      BadValue{"MINERU_HEALTH_EXIT_GRACE_S", "-1"},
                      BadValue{"MINERU_HEALTH_EXIT_GRACE_S", "3601"},
                      BadValue{"MINERU_HEALTH_EXIT_GRACE_S", ""},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER_S", "inf"},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER_S", "nan"},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER_S",
                               std::string(31, '9')},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER_S", "1e30"},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER_S", "0"},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER_S", "2.5"},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER_S", "3601"},
                      BadValue{"MINERU_HEALTH_EXPOSE_ERRORS", "sometimes"},
                      BadValue{"MINERU_HEALTH_TASK_STORE", "maybe"},
                      BadValue{"MINERU_HEALTH_ERROR_BUDGET", "0"},
                      BadValue{"MINERU_HEALTH_ERROR_BUDGET_WINDOW_S", "0.5"},
                      BadValue{"MINERU_HEALTH_RULES", "/nonexistent/rules.txt"},
                      BadValue{"MINERU_HEALTH_RULES", "/etc"},
                      BadValue{"MINERU_HEALTH_RULES", "/dev/zero"},
                      BadValue{"MINERU_HEALTH_RETRY_AFTER", "30"},
                      BadValue{"MINERU_HEALTH_", "1"}));

// --- messages --------------------------------------------------------------

struct Message {
  std::function<std::pair<std::string, std::string>(const Env&)> read;
  Env env;
  const char* variable;
  const char* message;
};

class MessageTest : public ::testing::TestWithParam<Message> {};

TEST_P(MessageTest, SaysTheRule) {
  const Message& m = GetParam();
  auto [variable, message] = m.read(m.env);
  EXPECT_EQ(variable, m.variable);
  EXPECT_EQ(message, m.message);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, MessageTest,
    ::testing::Values(
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_INTERVAL_S", "2"},
                 {"MINERU_ROUTER_HEALTH_TIMEOUT_S", "3"}},
                "MINERU_ROUTER_HEALTH_TIMEOUT_S",
                "MINERU_ROUTER_HEALTH_TIMEOUT_S=3 must be below "
                "MINERU_ROUTER_HEALTH_INTERVAL_S=2"},
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_INTERVAL_S", "2"},
                 {"MINERU_ROUTER_HEALTH_TIMEOUT_S", "2"}},
                "MINERU_ROUTER_HEALTH_TIMEOUT_S",
                "MINERU_ROUTER_HEALTH_TIMEOUT_S=2 must be below "
                "MINERU_ROUTER_HEALTH_INTERVAL_S=2"},
        // fast's interval is 1 s: the default 1.5 s timeout would not fit,
        // but the preset brings its own 0.5 s; overriding the interval alone
        // can break it.
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_PRESET", "fast"},
                 {"MINERU_ROUTER_HEALTH_INTERVAL_S", "0.4"}},
                "MINERU_ROUTER_HEALTH_TIMEOUT_S",
                "MINERU_ROUTER_HEALTH_TIMEOUT_S=0.5 must be below "
                "MINERU_ROUTER_HEALTH_INTERVAL_S=0.4"},
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "1e-300"}},
                "MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S",
                "MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S=1e-300 must be in "
                "[1, 86400]"},
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_JITTER", "0.7"}},
                "MINERU_ROUTER_HEALTH_JITTER",
                "MINERU_ROUTER_HEALTH_JITTER=0.7 must be in [0, 0.5)"},
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "2.5"}},
                "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD",
                "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD=\"2.5\" is not an "
                "integer in [1, 1000]"},
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_CA_FILE", "/etc"}},
                "MINERU_ROUTER_HEALTH_CA_FILE",
                "MINERU_ROUTER_HEALTH_CA_FILE=/etc is not a regular file"},
        Message{router_error,
                {{"MINERU_ROUTER_HEALTH_AUDIT_PATH", "/nonexistent/x"}},
                "MINERU_ROUTER_HEALTH_AUDIT_PATH",
                "MINERU_ROUTER_HEALTH_AUDIT_PATH=/nonexistent/x cannot be "
                "created: directory /nonexistent does not exist"},
        Message{worker_error,
                {{"MINERU_HEALTH_RETRY_AFTER_S", "0"}},
                "MINERU_HEALTH_RETRY_AFTER_S",
                "MINERU_HEALTH_RETRY_AFTER_S=0 must be an integer in "
                "[1, 3600]"},
        Message{worker_error,
                {{"MINERU_HEALTH_EXIT_GRACE_S", "inf"}},
                "MINERU_HEALTH_EXIT_GRACE_S",
                "MINERU_HEALTH_EXIT_GRACE_S=\"inf\" is not a finite number"},
        // Whole-string decimal numbers only (the pre-GCC 11 fallback too).
        Message{worker_error,
                {{"MINERU_HEALTH_EXIT_GRACE_S", " 5"}},
                "MINERU_HEALTH_EXIT_GRACE_S",
                "MINERU_HEALTH_EXIT_GRACE_S=\" 5\" is not a finite number"},
        Message{worker_error,
                {{"MINERU_HEALTH_EXIT_GRACE_S", "+5"}},
                "MINERU_HEALTH_EXIT_GRACE_S",
                "MINERU_HEALTH_EXIT_GRACE_S=\"+5\" is not a finite number"},
        Message{worker_error,
                {{"MINERU_HEALTH_EXIT_GRACE_S", "0x10"}},
                "MINERU_HEALTH_EXIT_GRACE_S",
                "MINERU_HEALTH_EXIT_GRACE_S=\"0x10\" is not a finite number"},
        // Quotes, backslashes and control characters are escaped.
        Message{
            worker_error,
            {{"MINERU_HEALTH_EXIT_ON_FATAL", "a\"b\\\t\x01"}},
            "MINERU_HEALTH_EXIT_ON_FATAL",
            "MINERU_HEALTH_EXIT_ON_FATAL=\"a\\\"b\\\\\\t\\x01\" is not a flag: "
            "use 1/0 (or true/false, yes/no, on/off)"},
        Message{worker_error,
                {{"MINERU_HEALTH_STALL_S", "1e-300"}},
                "MINERU_HEALTH_STALL_S",
                "MINERU_HEALTH_STALL_S=1e-300 must be 0 (off) or in "
                "[0.001, 86400]"},
        Message{worker_error,
                {{"MINERU_HEALTH_EXIT_ON_FATAL", "maybe"}},
                "MINERU_HEALTH_EXIT_ON_FATAL",
                "MINERU_HEALTH_EXIT_ON_FATAL=\"maybe\" is not a flag: use 1/0 "
                "(or true/false, yes/no, on/off)"}));

TEST(ConfigTest, UnknownVariableRefusedListingTheKnownOnes) {
  auto [variable, message] =
      router_error({{"MINERU_ROUTER_HEALTH_TIMEOUT", "1"}});
  EXPECT_EQ(variable, "MINERU_ROUTER_HEALTH_TIMEOUT");
  EXPECT_NE(message.find("unknown variable"), std::string::npos) << message;
  EXPECT_NE(message.find("MINERU_ROUTER_HEALTH_TIMEOUT_S"), std::string::npos)
      << message;

  std::tie(variable, message) = worker_error({{"MINERU_HEALTH_RULE", "x"}});
  EXPECT_EQ(variable, "MINERU_HEALTH_RULE");
  EXPECT_NE(message.find("MINERU_HEALTH_RULES"), std::string::npos) << message;
}

TEST(ConfigTest, ValidateNamesTheVariable) {
  HealthConfig c;
  c.jitter = 0.7;
  try {
    validate(c);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.variable(), "MINERU_ROUTER_HEALTH_JITTER");
  }
  WorkerConfig w;
  w.exit_grace_s = std::nan("");
  try {
    validate(w);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.variable(), "MINERU_HEALTH_EXIT_GRACE_S");
  }
}

// --- file-system checks ------------------------------------------------------

TEST(ConfigTest, FilesAreCheckedWithoutBeingCreated) {
  const std::string dir = scratch_dir("files");
  const std::string pem = write_file(dir + "/ca.pem", "not checked here\n");
  const std::string audit = dir + "/audit.jsonl";
  EXPECT_NO_THROW(
      health_config_from_env({{"MINERU_ROUTER_HEALTH_CA_FILE", pem},
                              {"MINERU_ROUTER_HEALTH_AUDIT_PATH", audit}}));
  struct stat info {};
  EXPECT_NE(::stat(audit.c_str(), &info), 0) << "the check created the file";
  // An existing file and a character device can be appended to.
  write_file(audit, "");
  EXPECT_NO_THROW(
      health_config_from_env({{"MINERU_ROUTER_HEALTH_AUDIT_PATH", audit}}));
  EXPECT_NO_THROW(health_config_from_env(
      {{"MINERU_ROUTER_HEALTH_AUDIT_PATH", "/dev/null"}}));
  EXPECT_NO_THROW(worker_config_from_env({{"MINERU_HEALTH_RULES", pem}}));

  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(router_error({{"MINERU_ROUTER_HEALTH_AUDIT_PATH", fifo}}).first,
            "MINERU_ROUTER_HEALTH_AUDIT_PATH");
  EXPECT_EQ(worker_error({{"MINERU_HEALTH_RULES", fifo}}).first,
            "MINERU_HEALTH_RULES");

  if (::geteuid() != 0) {  // root may write anywhere
    const std::string locked = dir + "/locked";
    ::mkdir(locked.c_str(), 0500);
    EXPECT_EQ(router_error({{"MINERU_ROUTER_HEALTH_AUDIT_PATH",
                             locked + "/audit.jsonl"}})
                  .first,
              "MINERU_ROUTER_HEALTH_AUDIT_PATH");
  }
}

TEST(ConfigTest, ValidateLeavesFilesToCheckFiles) {
  const std::string missing = scratch_dir("pure") + "/missing/file";
  HealthConfig c;
  c.ca_file = missing;
  EXPECT_NO_THROW(validate(c));  // values only: no file-system access
  try {
    check_files(c);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.variable(), "MINERU_ROUTER_HEALTH_CA_FILE");
  }
  c.ca_file.clear();
  c.audit_path = missing;
  EXPECT_NO_THROW(validate(c));
  EXPECT_THROW(check_files(c), ConfigError);

  WorkerConfig w;
  w.rules_path = missing;
  EXPECT_NO_THROW(validate(w));
  try {
    check_files(w);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.variable(), "MINERU_HEALTH_RULES");
  }
  EXPECT_NO_THROW(check_files(HealthConfig{}));
  EXPECT_NO_THROW(check_files(WorkerConfig{}));
}

// --- the table itself
// ----------------------------------------------------------

TEST(ConfigTest, TableDescribesEveryVariable) {
  const std::vector<ConfigVariable> vars = config_variables();
  int router = 0;
  for (const ConfigVariable& v : vars) {
    SCOPED_TRACE(v.name);
    const bool is_router = v.component == ConfigComponent::kRouter;
    router += is_router;
    EXPECT_EQ(
        v.name.rfind(is_router ? "MINERU_ROUTER_HEALTH_" : "MINERU_HEALTH_", 0),
        0u);
    EXPECT_FALSE(v.meaning.empty());
    EXPECT_FALSE(v.allowed.empty());
    EXPECT_EQ(v.field.empty(), v.component == ConfigComponent::kTooling ||
                                   v.name == "MINERU_ROUTER_HEALTH_PRESET");
    EXPECT_EQ(v.preset_values.size(),
              is_router && !v.field.empty() ? preset_names().size() : 0u);
    const bool numeric =
        v.type == ConfigType::kSeconds || v.type == ConfigType::kNumber ||
        v.type == ConfigType::kInteger || v.type == ConfigType::kPort;
    ASSERT_EQ(v.min_value.has_value(), numeric);
    ASSERT_EQ(v.max_value.has_value(), numeric);
    if (numeric) {
      EXPECT_TRUE(std::isfinite(*v.min_value) && std::isfinite(*v.max_value));
      EXPECT_LT(*v.min_value, *v.max_value);
    }
    if (v.type == ConfigType::kSeconds) {
      // No duration below a millisecond or above a day (0 may mean "none").
      EXPECT_TRUE(*v.min_value == 0 || *v.min_value >= 0.001);
      EXPECT_LE(*v.max_value, 86400);
    }
    // Every documented default is accepted as written.
    if (!v.default_value.empty() && v.component != ConfigComponent::kTooling) {
      Env env = {{v.name, v.default_value}};
      if (is_router) {
        EXPECT_NO_THROW(health_config_from_env(env));
      } else {
        EXPECT_NO_THROW(worker_config_from_env(env));
      }
    }
    if (!v.field.empty()) {
      EXPECT_EQ(config_variable_for(v.component, v.field).name, v.name);
    }
  }
  EXPECT_EQ(router, 38);
  EXPECT_THROW(config_variable_for(ConfigComponent::kRouter, "nope"),
               std::out_of_range);
  EXPECT_THROW(config_variable_for(ConfigComponent::kWorker, ""),
               std::out_of_range);
}

TEST(ConfigTest, PresetValuesComeFromThePresets) {
  const ConfigVariable& interval =
      config_variable_for(ConfigComponent::kRouter, "interval_s");
  EXPECT_EQ(interval.default_value, "2");
  EXPECT_EQ(interval.allowed, "[0.01, 86400]");
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"fast", "1"}, {"production", "2"}, {"outage-tolerant", "5"}};
  EXPECT_EQ(interval.preset_values, expected);
  EXPECT_EQ(config_variable_for(ConfigComponent::kWorker, "stall_s").allowed,
            "0 (off) or [0.001, 86400]");
  EXPECT_EQ(config_variable_for(ConfigComponent::kWorker, "port").allowed,
            "unset, or integer [0, 65535]");
}

// A label is kept as written, whatever it holds; empty is unset.
TEST(ConfigTest, LabelsAreKeptAsWritten) {
  EXPECT_EQ(config_variable_for(ConfigComponent::kWorker, "worker_tag").allowed,
            "unset, or any text");
  EXPECT_EQ(worker_config_from_env({}).worker_tag, "");
  EXPECT_EQ(
      worker_config_from_env({{"MINERU_HEALTH_WORKER_TAG", ""}}).worker_tag,
      "");
  const std::string tag = "4026531836.12.345/local-gpu-0.1/";
  EXPECT_EQ(
      worker_config_from_env({{"MINERU_HEALTH_WORKER_TAG", tag}}).worker_tag,
      tag);
}

TEST(ConfigTest, EnumNames) {
  EXPECT_STREQ(to_string(ConfigComponent::kRouter), "router");
  EXPECT_STREQ(to_string(ConfigComponent::kTooling), "tooling");
  EXPECT_STREQ(to_string(ConfigType::kSeconds), "seconds");
  EXPECT_STREQ(to_string(ConfigType::kChoice), "choice");
  EXPECT_STREQ(to_string(ConfigType::kLabel), "label");
  EXPECT_STREQ(env_prefix(ConfigComponent::kRouter), "MINERU_ROUTER_HEALTH_");
  EXPECT_STREQ(env_prefix(ConfigComponent::kWorker), "MINERU_HEALTH_");
  EXPECT_STREQ(env_prefix(ConfigComponent::kTooling), "MINERU_HEALTH_");
}

}  // namespace
}  // namespace mineru_health
