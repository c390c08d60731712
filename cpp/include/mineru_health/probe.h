// Probe results: what one `GET /health` answer means for routing.
//
//   mineru_health::ProbeExpectations expect;
//   expect.protocol_version = 1;
//   auto result = mineru_health::classify_health_response(200, body, false,
//   expect); if (result.status == mineru_health::ProbeStatus::kHealthy)
//   use(result.load);
//
// Pure functions; thread-safe.
#ifndef MINERU_HEALTH_PROBE_H_
#define MINERU_HEALTH_PROBE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mineru_health {

enum class ProbeStatus {
  kHealthy,           // 2xx, JSON object, expected status and protocol
  kConnectError,      // refused, reset, DNS, TLS handshake
  kTimeout,           // connect or total timeout
  kHttpStatus,        // a status outside 2xx
  kEngineDead,        // 503 whose body says the engine died: definitive
  kBodyTooLarge,      // more than max_body_bytes
  kNotJsonObject,     // body is not a JSON object (or not UTF-8)
  kUnexpectedStatus,  // `status` is not the expected value
  kBadProtocol,       // `protocol_version` missing or unsupported
  kBadFields,         // numeric fields of the wrong type or range
  kTransportError,    // anything else curl reports (closed mid-response...)
};

const char* to_string(ProbeStatus status);

// The load figures the router scores workers by.
struct WorkerLoad {
  std::int64_t queued_tasks = 0;
  std::int64_t processing_tasks = 0;
  std::int64_t completed_tasks = 0;
  std::int64_t failed_tasks = 0;
  std::int64_t max_concurrent_requests = 0;
  std::int64_t processing_window_size = 1;
};

struct ProbeExpectations {
  std::string expected_status = "healthy";
  // When set, a healthy body must carry exactly this protocol_version.
  std::optional<std::int64_t> protocol_version;
  std::size_t max_body_bytes = 64 * 1024;
  // MinerU workers must report max_concurrent_requests > 0 (the router
  // divides by it); engines that answer {"status": "ok"} need not.
  bool require_load_fields = true;
};

struct ProbeResult {
  std::string worker_id;
  ProbeStatus status = ProbeStatus::kTransportError;
  long http_status = 0;  // 0 when no response arrived
  double latency_s = 0;
  std::string detail;  // human-readable reason; "" when healthy
  WorkerLoad load;     // meaningful only when healthy
  bool healthy() const { return status == ProbeStatus::kHealthy; }
  // A definitive failure skips the failure threshold.
  bool definitive() const { return status == ProbeStatus::kEngineDead; }
};

// Classifies a complete HTTP answer. `truncated` means the body was cut at
// max_body_bytes. Never throws.
ProbeResult classify_health_response(long http_status, std::string_view body,
                                     bool truncated,
                                     const ProbeExpectations& expect);

}  // namespace mineru_health

#endif  // MINERU_HEALTH_PROBE_H_
