#include "mineru_health/probe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mineru_health {
namespace {

const char* kHealthyBody =
    R"({"status":"healthy","version":"3.4.4","protocol_version":2,"queued_tasks":3,)"
    R"("processing_tasks":1,"completed_tasks":10,"failed_tasks":2,)"
    R"("max_concurrent_requests":4,"processing_window_size":8,)"
    R"("task_retention_seconds":3600,"task_cleanup_interval_seconds":60})";

ProbeExpectations mineru_expectations() {
  ProbeExpectations e;
  e.protocol_version = 2;
  return e;
}

struct Case {
  const char* name;
  long http_status;
  std::string body;
  bool truncated;
  ProbeExpectations expect;
  ProbeStatus want;
  const char* detail_has;  // substring of detail; "" = detail must be empty
};

std::vector<Case> cases() {
  ProbeExpectations ok_engine;
  ok_engine.expected_status = "ok";
  ok_engine.require_load_fields = false;
  return {
      {"healthy", 200, kHealthyBody, false, mineru_expectations(),
       ProbeStatus::kHealthy, ""},
      {"plain_503", 503,
       R"({"status":"unhealthy","version":"3.4.4","error":"Task dispatcher is not running"})",
       false, mineru_expectations(), ProbeStatus::kHttpStatus,
       "Task dispatcher is not running"},
      {"503_engine_dead", 503,
       R"({"status":"unhealthy","error":"EngineDeadError: EngineCore encountered an issue",)"
       R"("rule":"vllm-engine-dead","category":"engine_dead","engine_dead":true})",
       false, mineru_expectations(), ProbeStatus::kEngineDead,
       "EngineDeadError"},
      {"503_engine_dead_false", 503,
       R"({"status":"unhealthy","engine_dead":false})", false,
       mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 503"},
      {"503_engine_dead_string_is_not_definitive", 503,
       R"({"status":"unhealthy","engine_dead":"true"})", false,
       mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 503"},
      {"500_engine_dead_is_not_definitive", 500, R"({"engine_dead":true})",
       false, mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 500"},
      {"503_truncated_engine_dead", 503, R"({"engine_dead":tr)", true,
       mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 503"},
      {"404_html", 404, "<html>nope</html>", false, mineru_expectations(),
       ProbeStatus::kHttpStatus, "HTTP 404"},
      {"200_status_unhealthy", 200,
       R"({"status":"unhealthy","error":"dispatcher died"})", false,
       mineru_expectations(), ProbeStatus::kUnexpectedStatus,
       "dispatcher died"},
      {"200_status_missing", 200, R"({"protocol_version":2})", false,
       mineru_expectations(), ProbeStatus::kUnexpectedStatus, "missing"},
      {"200_status_not_string", 200, R"({"status":1})", false,
       mineru_expectations(), ProbeStatus::kUnexpectedStatus, "status 1"},
      {"200_not_json", 200, "OK", false, mineru_expectations(),
       ProbeStatus::kNotJsonObject, "not valid JSON"},
      {"200_empty", 200, "", false, mineru_expectations(),
       ProbeStatus::kNotJsonObject, "not valid JSON"},
      {"200_json_array", 200, R"([{"status":"healthy"}])", false,
       mineru_expectations(), ProbeStatus::kNotJsonObject, "array"},
      {"200_invalid_utf8", 200, std::string("{\"status\":\"healthy\xff\xfe\"}"),
       false, mineru_expectations(), ProbeStatus::kNotJsonObject, "UTF-8"},
      {"200_truncated", 200, std::string(100, 'x'), true, mineru_expectations(),
       ProbeStatus::kBodyTooLarge, "larger than"},
      {"bad_protocol", 200,
       R"({"status":"healthy","protocol_version":1,"max_concurrent_requests":4})",
       false, mineru_expectations(), ProbeStatus::kBadProtocol,
       "protocol_version 1 (expected 2)"},
      {"missing_protocol", 200,
       R"({"status":"healthy","max_concurrent_requests":4})", false,
       mineru_expectations(), ProbeStatus::kBadProtocol, "missing"},
      {"protocol_as_string", 200,
       R"({"status":"healthy","protocol_version":"2","max_concurrent_requests":4})",
       false, mineru_expectations(), ProbeStatus::kBadProtocol,
       "protocol_version"},
      {"max_concurrent_zero", 200,
       R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":0})",
       false, mineru_expectations(), ProbeStatus::kBadFields,
       "max_concurrent_requests"},
      {"max_concurrent_missing", 200,
       R"({"status":"healthy","protocol_version":2})", false,
       mineru_expectations(), ProbeStatus::kBadFields,
       "max_concurrent_requests"},
      {"queued_as_string", 200,
       R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":4,"queued_tasks":"3"})",
       false, mineru_expectations(), ProbeStatus::kBadFields, "queued_tasks"},
      {"queued_as_float", 200,
       R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":4,"queued_tasks":1.5})",
       false, mineru_expectations(), ProbeStatus::kBadFields, "queued_tasks"},
      {"negative_count", 200,
       R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":4,"failed_tasks":-1})",
       false, mineru_expectations(), ProbeStatus::kBadFields, "failed_tasks"},
      {"huge_unsigned", 200,
       R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":18446744073709551615})",
       false, mineru_expectations(), ProbeStatus::kBadFields,
       "max_concurrent_requests"},
      {"ok_engine", 200, R"({"status":"ok"})", false, ok_engine,
       ProbeStatus::kHealthy, ""},
      {"ok_engine_with_junk_fields", 200,
       R"({"status":"ok","queued_tasks":"many"})", false, ok_engine,
       ProbeStatus::kHealthy, ""},
      {"ok_engine_healthy_word_is_wrong", 200, R"({"status":"healthy"})", false,
       ok_engine, ProbeStatus::kUnexpectedStatus, "expected \"ok\""},
  };
}

class ProbeTableTest : public ::testing::TestWithParam<Case> {};

TEST_P(ProbeTableTest, Classifies) {
  const Case& c = GetParam();
  ProbeResult r =
      classify_health_response(c.http_status, c.body, c.truncated, c.expect);
  EXPECT_EQ(to_string(r.status), std::string(to_string(c.want))) << r.detail;
  EXPECT_EQ(r.http_status, c.http_status);
  if (std::string(c.detail_has).empty()) {
    EXPECT_EQ(r.detail, "");
  } else {
    EXPECT_NE(r.detail.find(c.detail_has), std::string::npos) << r.detail;
  }
  EXPECT_EQ(r.healthy(), c.want == ProbeStatus::kHealthy);
  EXPECT_EQ(r.definitive(), c.want == ProbeStatus::kEngineDead);
}

INSTANTIATE_TEST_SUITE_P(Bodies, ProbeTableTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(ProbeTest, HealthyBodyFillsLoad) {
  ProbeResult r =
      classify_health_response(200, kHealthyBody, false, mineru_expectations());
  ASSERT_TRUE(r.healthy()) << r.detail;
  EXPECT_EQ(r.load.queued_tasks, 3);
  EXPECT_EQ(r.load.processing_tasks, 1);
  EXPECT_EQ(r.load.completed_tasks, 10);
  EXPECT_EQ(r.load.failed_tasks, 2);
  EXPECT_EQ(r.load.max_concurrent_requests, 4);
  EXPECT_EQ(r.load.processing_window_size, 8);
}

TEST(ProbeTest, MissingCountsAreZeroAndWindowAtLeastOne) {
  ProbeResult r = classify_health_response(
      200,
      R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":2,)"
      R"("processing_window_size":0})",
      false, mineru_expectations());
  ASSERT_TRUE(r.healthy()) << r.detail;
  EXPECT_EQ(r.load.queued_tasks, 0);
  EXPECT_EQ(r.load.failed_tasks, 0);
  EXPECT_EQ(r.load.processing_window_size, 1);
}

TEST(ProbeTest, NoProtocolExpectedAcceptsAnyOrNone) {
  ProbeExpectations e;  // no protocol_version
  ProbeResult r = classify_health_response(
      200, R"({"status":"healthy","max_concurrent_requests":1})", false, e);
  EXPECT_TRUE(r.healthy()) << r.detail;
}

TEST(ProbeTest, WorkerErrorTextIsCapped) {
  const std::string long_error(5000, 'e');
  ProbeResult r = classify_health_response(
      200, R"({"status":"unhealthy","error":")" + long_error + R"("})", false,
      mineru_expectations());
  EXPECT_EQ(r.status, ProbeStatus::kUnexpectedStatus);
  EXPECT_LT(r.detail.size(), 400u);
}

TEST(ProbeTest, CappedErrorStaysValidUtf8) {
  // 300 three-byte characters: a byte cut would split one.
  std::string error;
  for (int i = 0; i < 300; ++i) error += "\xe5\xbc\x95";
  ProbeResult r = classify_health_response(
      503, R"({"error":")" + error + R"("})", false, mineru_expectations());
  EXPECT_EQ(r.status, ProbeStatus::kHttpStatus);
  // Re-parse the detail as a JSON string: fails if a sequence was split.
  ProbeResult again = classify_health_response(
      200, R"({"status":")" + r.detail + R"("})", false, ProbeExpectations{});
  EXPECT_NE(again.status, ProbeStatus::kNotJsonObject) << again.detail;
}

TEST(ProbeTest, DeeplyNestedBodyDoesNotThrow) {
  std::string body(20000, '[');
  body += std::string(20000, ']');
  ProbeResult r =
      classify_health_response(200, body, false, mineru_expectations());
  EXPECT_EQ(r.status, ProbeStatus::kNotJsonObject);
}

// Found by probe_fuzz: a million-deep `error` value used to recurse once
// per level when copied into the detail and overflow the poller's stack.
TEST(ProbeTest, MillionDeepErrorValueIsStillAnHttpFailure) {
  std::string body = R"({"status":"unhealthy","error":)";
  body += std::string(1000000, '[');
  body += std::string(1000000, ']');
  body += "}";
  ProbeResult r =
      classify_health_response(503, body, false, mineru_expectations());
  EXPECT_EQ(r.status, ProbeStatus::kHttpStatus);
  EXPECT_EQ(r.http_status, 503);
}

TEST(ProbeTest, EveryStatusHasAName) {
  for (int s = 0; s <= static_cast<int>(ProbeStatus::kTransportError); ++s) {
    EXPECT_STRNE(to_string(static_cast<ProbeStatus>(s)), "unknown");
  }
}

}  // namespace
}  // namespace mineru_health
