#include "mineru_health/config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace mineru_health {
namespace {

using Env = std::map<std::string, std::string>;

// Returns the ConfigError's variable and message, or "" when nothing threw.
std::pair<std::string, std::string> error_of(const Env& env) {
  try {
    health_config_from_env(env);
  } catch (const ConfigError& e) {
    return {e.variable(), e.what()};
  }
  return {"", ""};
}

TEST(ConfigTest, DefaultsAreValidAndMatchTheHeader) {
  HealthConfig c;
  EXPECT_NO_THROW(validate(c));
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
}

TEST(ConfigTest, UnrelatedVariablesAreIgnored) {
  EXPECT_NO_THROW(health_config_from_env(
      {{"PATH", "/bin"}, {"MINERU_ROUTER_PORT", "8000"}}));
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
       {"MINERU_ROUTER_HEALTH_AUDIT_PATH", "/tmp/a.jsonl"}});
  EXPECT_EQ(c.interval_s, 5.0);
  EXPECT_EQ(c.max_attempts, 3);
  EXPECT_EQ(c.expected_status, "ok");
  EXPECT_EQ(c.audit_path, "/tmp/a.jsonl");
}

TEST(ConfigTest, ParsesEveryVariable) {
  HealthConfig c = health_config_from_env({
      {"MINERU_ROUTER_HEALTH_INTERVAL_S", "10"},
      {"MINERU_ROUTER_HEALTH_TIMEOUT_S", "2.5"},
      {"MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "1e-1"},
      {"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "4"},
      {"MINERU_ROUTER_HEALTH_HEALTHY_THRESHOLD", "2"},
      {"MINERU_ROUTER_HEALTH_BACKOFF_BASE_S", "5"},
      {"MINERU_ROUTER_HEALTH_BACKOFF_MAX_S", "300"},
      {"MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "0"},
      {"MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "60"},
      {"MINERU_ROUTER_HEALTH_CONCURRENCY", "50"},
      {"MINERU_ROUTER_HEALTH_JITTER", "0"},
      {"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "1024"},
  });
  EXPECT_EQ(c.interval_s, 10.0);
  EXPECT_EQ(c.probe_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(c.connect_timeout_s, 0.1);
  EXPECT_EQ(c.failure_threshold, 4);
  EXPECT_EQ(c.healthy_threshold, 2);
  EXPECT_EQ(c.backoff_base_s, 5.0);
  EXPECT_EQ(c.backoff_max_s, 300.0);
  EXPECT_EQ(c.max_attempts, 0);
  EXPECT_EQ(c.boot_timeout_s, 60.0);
  EXPECT_EQ(c.concurrency, 50);
  EXPECT_EQ(c.jitter, 0.0);
  EXPECT_EQ(c.max_body_bytes, 1024u);
}

struct BadValue {
  const char* variable;
  const char* value;
};

class BadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(BadValueTest, NamesItsVariable) {
  const BadValue& bad = GetParam();
  auto [variable, message] = error_of({{bad.variable, bad.value}});
  EXPECT_EQ(variable, bad.variable) << message;
  EXPECT_NE(message.find(bad.variable), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Values, BadValueTest,
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
        BadValue{"MINERU_ROUTER_HEALTH_TIMEOUT_S", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "-0.1"},
        BadValue{"MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "1.6"},
        BadValue{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "2.5"},
        BadValue{"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "99999999999"},
        BadValue{"MINERU_ROUTER_HEALTH_HEALTHY_THRESHOLD", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_BACKOFF_BASE_S", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_BACKOFF_BASE_S", "61"},
        BadValue{"MINERU_ROUTER_HEALTH_BACKOFF_MAX_S", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "+3"},
        BadValue{"MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_CONCURRENCY", "0"},
        BadValue{"MINERU_ROUTER_HEALTH_CONCURRENCY", "1000001"},
        BadValue{"MINERU_ROUTER_HEALTH_JITTER", "0.5"},
        BadValue{"MINERU_ROUTER_HEALTH_JITTER", "-0.1"},
        BadValue{"MINERU_ROUTER_HEALTH_EXPECTED_STATUS", ""},
        BadValue{"MINERU_ROUTER_HEALTH_CA_FILE", "/nonexistent/ca.pem"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "255"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "16777217"},
        BadValue{"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES", "-1"},
        BadValue{"MINERU_ROUTER_HEALTH_PRESET", "Fast"},
        BadValue{"MINERU_ROUTER_HEALTH_INTERVALS", "2"}));

TEST(ConfigTest, TimeoutMustBeBelowInterval) {
  auto [variable, message] =
      error_of({{"MINERU_ROUTER_HEALTH_INTERVAL_S", "2"},
                {"MINERU_ROUTER_HEALTH_TIMEOUT_S", "3"}});
  EXPECT_EQ(variable, "MINERU_ROUTER_HEALTH_TIMEOUT_S");
  EXPECT_EQ(message,
            "MINERU_ROUTER_HEALTH_TIMEOUT_S=3 must be below "
            "MINERU_ROUTER_HEALTH_INTERVAL_S=2");

  std::tie(variable, message) =
      error_of({{"MINERU_ROUTER_HEALTH_INTERVAL_S", "2"},
                {"MINERU_ROUTER_HEALTH_TIMEOUT_S", "2"}});
  EXPECT_EQ(variable, "MINERU_ROUTER_HEALTH_TIMEOUT_S");
}

TEST(ConfigTest, PresetValuesAreCheckedAgainstOverrides) {
  // fast's interval is 1 s: the default 1.5 s timeout would not fit, but the
  // preset brings its own 0.5 s; overriding the interval alone can break it.
  auto [variable, message] =
      error_of({{"MINERU_ROUTER_HEALTH_PRESET", "fast"},
                {"MINERU_ROUTER_HEALTH_INTERVAL_S", "0.4"}});
  EXPECT_EQ(variable, "MINERU_ROUTER_HEALTH_TIMEOUT_S") << message;
}

TEST(ConfigTest, UnknownVariableRefused) {
  auto [variable, message] = error_of({{"MINERU_ROUTER_HEALTH_TIMEOUT", "1"}});
  EXPECT_EQ(variable, "MINERU_ROUTER_HEALTH_TIMEOUT");
  EXPECT_NE(message.find("unknown variable"), std::string::npos) << message;
  EXPECT_NE(message.find("MINERU_ROUTER_HEALTH_TIMEOUT_S"), std::string::npos)
      << message;
}

TEST(ConfigTest, ValidateNamesTheVariable) {
  HealthConfig c;
  c.jitter = 0.7;
  try {
    validate(c);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.variable(), "MINERU_ROUTER_HEALTH_JITTER");
    EXPECT_STREQ(e.what(),
                 "MINERU_ROUTER_HEALTH_JITTER=0.7 must be in [0, 0.5)");
  }
}

TEST(ConfigTest, VariablesAreDocumented) {
  std::vector<ConfigVariable> vars = config_variables();
  ASSERT_EQ(vars.size(), 16u);
  for (const ConfigVariable& v : vars) {
    EXPECT_EQ(v.name.rfind("MINERU_ROUTER_HEALTH_", 0), 0u) << v.name;
    EXPECT_FALSE(v.meaning.empty()) << v.name;
    if (v.name != "MINERU_ROUTER_HEALTH_AUDIT_PATH" &&
        v.name != "MINERU_ROUTER_HEALTH_CA_FILE") {
      EXPECT_FALSE(v.default_value.empty()) << v.name;
    }
    // Every documented name is accepted.
    if (v.name == "MINERU_ROUTER_HEALTH_PRESET" ||
        v.name == "MINERU_ROUTER_HEALTH_AUDIT_PATH" ||
        v.name == "MINERU_ROUTER_HEALTH_EXPECTED_STATUS") {
      continue;
    }
    EXPECT_NO_THROW(health_config_from_env({{v.name, v.default_value}}))
        << v.name;
  }
}

}  // namespace
}  // namespace mineru_health
