// Probe results: what one `GET /health` answer means for routing, from a
// worker's main port or from its native health endpoint.
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
  kLoopHung,          // 503 whose body says the event loop is hung: definitive
};

const char* to_string(ProbeStatus status);

// Which of a worker's endpoints a probe went to. The native endpoint is
// served by a thread of its own in the worker, so it answers even while
// MinerU blocks its event loop; the main port's /health waits behind that
// work and is judged with a generous timeout (HealthConfig's
// main_port_timeout_s).
enum class ProbeEndpoint {
  kMain,    // <url>/health on the worker's API port
  kNative,  // the native health endpoint (explicit or advertised)
};

const char* to_string(ProbeEndpoint endpoint);

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
  // The healthy `status` of a main port's /health when it differs from
  // expected_status ("" = the same): MinerU 4.0's /v1/health says "ok"
  // while the native endpoint says "healthy".
  std::string main_port_status;
};

struct ProbeResult {
  std::string worker_id;
  ProbeStatus status = ProbeStatus::kTransportError;
  long http_status = 0;  // 0 when no response arrived
  double latency_s = 0;
  std::string detail;  // human-readable reason; "" when healthy
  WorkerLoad load;     // meaningful only when healthy
  // Set by the poller (the classifier cannot know): where the probe went.
  ProbeEndpoint endpoint = ProbeEndpoint::kMain;
  std::string url;  // the URL probed; "" from classify_health_response

  // Optional figures of the native endpoint's body, read from any complete
  // JSON object answer (healthy or not) for metrics and statuses. Advisory:
  // a missing, null or malformed figure is left unset and never fails a
  // probe. Non-negative and finite when set.
  std::optional<double> loop_lag_s;
  std::optional<std::int64_t> engine_calls_in_flight;
  std::optional<double> seconds_since_progress;
  // Port of the native endpoint that a main port's body advertises
  // (1..65535); the poller switches to it after a healthy answer.
  std::optional<int> native_health_port;
  // The worker's verdict when it says it is unhealthy (capped text).
  std::string rule;
  std::string category;

  bool healthy() const { return status == ProbeStatus::kHealthy; }
  // A definitive failure skips the failure threshold and the mass-ejection
  // guard: the worker itself says it cannot serve.
  bool definitive() const {
    return status == ProbeStatus::kEngineDead ||
           status == ProbeStatus::kLoopHung;
  }
};

// Classifies a complete HTTP answer. `truncated` means the body was cut at
// max_body_bytes. A complete 503 object with `"engine_dead": true` (or, as
// MinerU 4.0 words it, `"error": {"code": "engine_dead"}`) is kEngineDead, else
// with `"loop_hung": true` kLoopHung; any other non-2xx (a native endpoint's
// 503 while the worker starts, too) is kHttpStatus. Never throws.
ProbeResult classify_health_response(long http_status, std::string_view body,
                                     bool truncated,
                                     const ProbeExpectations& expect);

}  // namespace mineru_health

#endif  // MINERU_HEALTH_PROBE_H_
