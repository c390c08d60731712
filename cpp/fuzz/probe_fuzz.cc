// libFuzzer target for classify_health_response: an arbitrary HTTP status
// and body, judged under every combination of protocol_version (unset or
// set) and require_load_fields (on or off).
//
// Input: bytes 0-1 the HTTP status, big-endian (0..65535); byte 2 flags:
// bit 0 the body was truncated, bit 1 expect status "ok" instead of
// "healthy", bit 2 expect protocol_version 1 instead of MinerU's 2; the rest
// is the body. Every violated invariant ends in __builtin_trap().
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "mineru_health/probe.h"

namespace {

using mineru_health::fuzz::is_valid_utf8;
using mineru_health::fuzz::require;

using mineru_health::ProbeExpectations;
using mineru_health::ProbeResult;
using mineru_health::ProbeStatus;
using mineru_health::WorkerLoad;
using nlohmann::json;

constexpr std::size_t kHeaderBytes = 3;
// Details quote worker text capped at 200 bytes, plus our own words.
constexpr std::size_t kMaxDetailBytes = 512;

bool same_load(const WorkerLoad& a, const WorkerLoad& b) {
  return a.queued_tasks == b.queued_tasks &&
         a.processing_tasks == b.processing_tasks &&
         a.completed_tasks == b.completed_tasks &&
         a.failed_tasks == b.failed_tasks &&
         a.max_concurrent_requests == b.max_concurrent_requests &&
         a.processing_window_size == b.processing_window_size;
}

bool is_2xx(long status) { return status >= 200 && status <= 299; }

// The body as the oracle sees it: a JSON object or nothing. Parsed once per
// input; only top-level fields are consulted, so deeper levels are dropped.
std::optional<json> body_object(std::string_view body) {
  json doc = json::parse(
      body.begin(), body.end(),
      [](int depth, json::parse_event_t /*event*/, json& /*parsed*/) {
        return depth <= 1;
      },
      /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  return doc;
}

void check_result(const ProbeResult& r, long http_status,
                  const std::optional<json>& doc, bool truncated,
                  const ProbeExpectations& expect) {
  require(r.http_status == http_status, "http_status echoed");
  require(r.worker_id.empty() && r.latency_s == 0,
          "no worker id or latency from a pure classification");
  require(r.status != ProbeStatus::kConnectError &&
              r.status != ProbeStatus::kTimeout &&
              r.status != ProbeStatus::kTransportError,
          "transport statuses never come from a complete answer");
  require(r.definitive() == (r.status == ProbeStatus::kEngineDead ||
                             r.status == ProbeStatus::kLoopHung),
          "only engine_dead and loop_hung are definitive");
  require(is_valid_utf8(r.rule) && r.rule.size() <= kMaxDetailBytes &&
              is_valid_utf8(r.category) && r.category.size() <= kMaxDetailBytes,
          "rule and category bounded UTF-8");
  require(!r.loop_lag_s || (std::isfinite(*r.loop_lag_s) && *r.loop_lag_s >= 0),
          "loop_lag_s finite and not negative");
  require(
      !r.seconds_since_progress || (std::isfinite(*r.seconds_since_progress) &&
                                    *r.seconds_since_progress >= 0),
      "seconds_since_progress finite and not negative");
  require(!r.engine_calls_in_flight || *r.engine_calls_in_flight >= 0,
          "engine_calls_in_flight not negative");
  require(!r.native_health_port ||
              (*r.native_health_port >= 1 && *r.native_health_port <= 65535),
          "native_health_port is a port");
  require(is_valid_utf8(r.detail), "detail is valid UTF-8");
  require(r.detail.size() <= kMaxDetailBytes, "detail bounded");

  if (!is_2xx(http_status)) {
    require(r.status == ProbeStatus::kHttpStatus ||
                r.status == ProbeStatus::kEngineDead ||
                r.status == ProbeStatus::kLoopHung,
            "non-2xx is http_status, engine_dead or loop_hung, never healthy");
    auto flag = [&](const char* name) {
      if (http_status != 503 || truncated || !doc) return false;
      auto it = doc->find(name);
      return it != doc->end() && it->is_boolean() && it->get<bool>();
    };
    const bool engine_dead = flag("engine_dead");
    require((r.status == ProbeStatus::kEngineDead) == engine_dead,
            "engine_dead iff a complete 503 object says engine_dead: true");
    require((r.status == ProbeStatus::kLoopHung) ==
                (!engine_dead && flag("loop_hung")),
            "loop_hung iff a complete 503 object says loop_hung: true and "
            "not engine_dead");
  } else if (truncated) {
    require(r.status == ProbeStatus::kBodyTooLarge,
            "a truncated 2xx body is body_too_large");
  }

  if (!r.healthy()) {
    require(!r.detail.empty(), "a failure says why");
    require(same_load(r.load, WorkerLoad{}), "a failure carries no load");
    return;
  }
  require(r.detail.empty(), "healthy has no detail");
  require(is_2xx(http_status) && !truncated, "healthy needs a complete 2xx");
  require(doc.has_value(), "healthy body is a JSON object");
  auto status = doc->find("status");
  require(status != doc->end() && status->is_string() &&
              status->get<std::string>() == expect.expected_status,
          "healthy body has the expected status");
  if (expect.protocol_version) {
    auto version = doc->find("protocol_version");
    require(
        version != doc->end() &&
            (version->is_number_integer() || version->is_number_unsigned()) &&
            *version == *expect.protocol_version,
        "healthy body has the expected protocol_version");
  }
  require(r.load.processing_window_size >= 1, "window at least 1");
  if (expect.require_load_fields) {
    require(r.load.max_concurrent_requests > 0,
            "max_concurrent_requests > 0 when load fields are required");
    require(r.load.queued_tasks >= 0 && r.load.processing_tasks >= 0 &&
                r.load.completed_tasks >= 0 && r.load.failed_tasks >= 0,
            "counts not negative when load fields are required");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < kHeaderBytes) return 0;
  const long http_status = static_cast<long>((data[0] << 8) | data[1]);
  const bool truncated = (data[2] & 1) != 0;
  const std::string_view body(
      reinterpret_cast<const char*>(data) + kHeaderBytes, size - kHeaderBytes);

  ProbeExpectations base;
  base.expected_status = (data[2] & 2) != 0 ? "ok" : "healthy";
  const std::int64_t version = (data[2] & 4) != 0 ? 1 : 2;

  const std::optional<json> doc = body_object(body);
  // [protocol set][load fields required]
  std::array<std::array<ProbeResult, 2>, 2> results;
  for (int with_protocol = 0; with_protocol < 2; ++with_protocol) {
    for (int with_load = 0; with_load < 2; ++with_load) {
      ProbeExpectations expect = base;
      if (with_protocol) expect.protocol_version = version;
      expect.require_load_fields = with_load != 0;
      ProbeResult r = mineru_health::classify_health_response(
          http_status, body, truncated, expect);
      check_result(r, http_status, doc, truncated, expect);
      results[with_protocol][with_load] = std::move(r);
    }
  }
  // Each expectation only adds requirements: dropping one can turn a failure
  // into a success, never the reverse, and never changes the load read.
  for (int with_protocol = 0; with_protocol < 2; ++with_protocol) {
    const ProbeResult& strict = results[with_protocol][1];
    const ProbeResult& lenient = results[with_protocol][0];
    if (strict.healthy()) {
      require(lenient.healthy() && same_load(strict.load, lenient.load),
              "healthy with load fields required is healthy without");
    }
  }
  for (int with_load = 0; with_load < 2; ++with_load) {
    const ProbeResult& strict = results[1][with_load];
    const ProbeResult& lenient = results[0][with_load];
    if (strict.healthy()) {
      require(lenient.healthy() && same_load(strict.load, lenient.load),
              "healthy with protocol_version required is healthy without");
    }
  }
  return 0;
}
