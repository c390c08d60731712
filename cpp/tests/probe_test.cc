#include "mineru_health/probe.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mineru_health {
namespace {

const char* kHealthyBody =
    R"({"status":"healthy","version":"3.4.4","protocol_version":2,"queued_tasks":3,)"
    R"("processing_tasks":1,"completed_tasks":10,"failed_tasks":2,)"
    R"("max_concurrent_requests":4,"processing_window_size":8,)"
    R"("task_retention_seconds":3600,"task_cleanup_interval_seconds":60})";

// The native endpoint of a busy worker: healthy, its loop lagging.
const char* kNativeBusyBody =
    R"({"status":"healthy","version":"3.4.4","protocol_version":2,"queued_tasks":5,)"
    R"("processing_tasks":2,"completed_tasks":10,"failed_tasks":0,)"
    R"("max_concurrent_requests":2,"processing_window_size":64,)"
    R"("endpoint":"native","loop_lag_s":4.25,"loop_hung":false,)"
    R"("engine_calls_in_flight":3,"seconds_since_progress":1.5,"engine_dead":false})";

const char* kNativeLoopHungBody =
    R"({"status":"unhealthy","version":"3.4.4","protocol_version":2,)"
    R"("endpoint":"native","loop_lag_s":75.5,"loop_hung":true,)"
    R"("engine_calls_in_flight":0,"seconds_since_progress":null,)"
    R"("engine_dead":false,"rule":"loop_hang","category":"loop_hung",)"
    R"("since":"2025-01-01T00:00:00Z"})";

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
      {"503_mineru4_engine_dead", 503,
       R"({"error":{"type":"engine_error","code":"engine_dead",)"
       R"("message":"EngineDeadError: EngineCore died"}})",
       false, ok_engine, ProbeStatus::kEngineDead, "EngineCore died"},
      {"503_mineru4_other_code_is_not_definitive", 503,
       R"({"error":{"code":"model_preload_failed","message":"x"}})", false,
       ok_engine, ProbeStatus::kHttpStatus, "HTTP 503"},
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
      // The native endpoint: MinerU's body plus our fields.
      {"native_healthy_busy", 200, kNativeBusyBody, false,
       mineru_expectations(), ProbeStatus::kHealthy, ""},
      {"native_loop_hung", 503, kNativeLoopHungBody, false,
       mineru_expectations(), ProbeStatus::kLoopHung, "event loop hung"},
      {"native_loop_hung_says_how_long", 503, kNativeLoopHungBody, false,
       mineru_expectations(), ProbeStatus::kLoopHung, "for 75.5s"},
      {"native_engine_stalled_is_engine_dead", 503,
       R"({"status":"unhealthy","endpoint":"native","engine_dead":true,)"
       R"("loop_hung":false,"rule":"watchdog","category":"engine_stalled"})",
       false, mineru_expectations(), ProbeStatus::kEngineDead, "engine dead"},
      {"engine_dead_wins_over_loop_hung", 503,
       R"({"status":"unhealthy","engine_dead":true,"loop_hung":true})", false,
       mineru_expectations(), ProbeStatus::kEngineDead, "engine dead"},
      {"native_starting_is_not_definitive", 503,
       R"({"status":"starting","endpoint":"native","engine_dead":false,)"
       R"("loop_hung":false})",
       false, mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 503"},
      {"loop_hung_string_is_not_definitive", 503,
       R"({"status":"unhealthy","loop_hung":"true"})", false,
       mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 503"},
      {"500_loop_hung_is_not_definitive", 500, R"({"loop_hung":true})", false,
       mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 500"},
      {"503_truncated_loop_hung", 503, R"({"loop_hung":tr)", true,
       mineru_expectations(), ProbeStatus::kHttpStatus, "HTTP 503"},
      // A 200 that claims a hung loop contradicts itself; the status wins.
      {"200_loop_hung_is_still_healthy", 200,
       R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":1,)"
       R"("loop_hung":true})",
       false, mineru_expectations(), ProbeStatus::kHealthy, ""},
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
  EXPECT_EQ(r.definitive(), c.want == ProbeStatus::kEngineDead ||
                                c.want == ProbeStatus::kLoopHung);
  EXPECT_EQ(r.endpoint, ProbeEndpoint::kMain);  // only the poller sets it
  EXPECT_EQ(r.url, "");
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

TEST(ProbeTest, NativeFiguresAreRead) {
  ProbeResult r = classify_health_response(200, kNativeBusyBody, false,
                                           mineru_expectations());
  ASSERT_TRUE(r.healthy()) << r.detail;
  EXPECT_EQ(r.loop_lag_s, 4.25);
  EXPECT_EQ(r.engine_calls_in_flight, 3);
  EXPECT_EQ(r.seconds_since_progress, 1.5);
  EXPECT_FALSE(r.native_health_port.has_value());
  EXPECT_EQ(r.load.processing_window_size, 64);
}

TEST(ProbeTest, FiguresOfAnUnhealthyAnswerAreKept) {
  ProbeResult r = classify_health_response(503, kNativeLoopHungBody, false,
                                           mineru_expectations());
  ASSERT_EQ(r.status, ProbeStatus::kLoopHung);
  EXPECT_EQ(r.loop_lag_s, 75.5);
  EXPECT_EQ(r.engine_calls_in_flight, 0);
  EXPECT_FALSE(r.seconds_since_progress.has_value());  // null
  EXPECT_EQ(r.rule, "loop_hang");
  EXPECT_EQ(r.category, "loop_hung");
  EXPECT_EQ(r.load.max_concurrent_requests, 0);  // no load from a failure
}

struct FigureCase {
  const char* name;
  std::string fields;  // appended to a healthy body
  std::optional<double> loop_lag_s;
  std::optional<std::int64_t> engine_calls_in_flight;
  std::optional<int> native_health_port;
};

class ProbeFigureTest : public ::testing::TestWithParam<FigureCase> {};

// Advisory figures never fail a probe: bad ones are simply not set.
TEST_P(ProbeFigureTest, MalformedFiguresAreIgnored) {
  const FigureCase& c = GetParam();
  const std::string body =
      R"({"status":"healthy","protocol_version":2,"max_concurrent_requests":1)" +
      c.fields + "}";
  ProbeResult r =
      classify_health_response(200, body, false, mineru_expectations());
  ASSERT_TRUE(r.healthy()) << r.detail;
  EXPECT_EQ(r.loop_lag_s, c.loop_lag_s);
  EXPECT_EQ(r.engine_calls_in_flight, c.engine_calls_in_flight);
  EXPECT_EQ(r.native_health_port, c.native_health_port);
}

INSTANTIATE_TEST_SUITE_P(
    Figures, ProbeFigureTest,
    ::testing::Values(
        FigureCase{"none", "", std::nullopt, std::nullopt, std::nullopt},
        FigureCase{"integers", R"(,"loop_lag_s":2,"engine_calls_in_flight":7)",
                   2.0, 7, std::nullopt},
        FigureCase{"negative",
                   R"(,"loop_lag_s":-1,"engine_calls_in_flight":-2)",
                   std::nullopt, std::nullopt, std::nullopt},
        FigureCase{"strings",
                   R"(,"loop_lag_s":"1","engine_calls_in_flight":"2",)"
                   R"("native_health_port":"9000")",
                   std::nullopt, std::nullopt, std::nullopt},
        FigureCase{"fraction_count", R"(,"engine_calls_in_flight":1.5)",
                   std::nullopt, std::nullopt, std::nullopt},
        FigureCase{"huge_count",
                   R"(,"engine_calls_in_flight":18446744073709551615)",
                   std::nullopt, std::nullopt, std::nullopt},
        FigureCase{"port", R"(,"native_health_port":18001)", std::nullopt,
                   std::nullopt, 18001},
        FigureCase{"port_zero", R"(,"native_health_port":0)", std::nullopt,
                   std::nullopt, std::nullopt},
        FigureCase{"port_too_big", R"(,"native_health_port":65536)",
                   std::nullopt, std::nullopt, std::nullopt},
        FigureCase{"port_fraction", R"(,"native_health_port":80.5)",
                   std::nullopt, std::nullopt, std::nullopt},
        FigureCase{"port_null", R"(,"native_health_port":null)", std::nullopt,
                   std::nullopt, std::nullopt}),
    [](const ::testing::TestParamInfo<FigureCase>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(ProbeTest, EveryStatusHasAName) {
  for (int s = 0; s <= static_cast<int>(ProbeStatus::kLoopHung); ++s) {
    EXPECT_STRNE(to_string(static_cast<ProbeStatus>(s)), "unknown");
  }
  EXPECT_STREQ(to_string(ProbeStatus::kLoopHung), "loop_hung");
  EXPECT_STREQ(to_string(ProbeEndpoint::kMain), "main");
  EXPECT_STREQ(to_string(ProbeEndpoint::kNative), "native");
}

}  // namespace
}  // namespace mineru_health
