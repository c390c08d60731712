// Poller: one background thread that probes every worker's /health with
// libcurl's multi interface, all probes concurrent, and drives one
// RestartPolicy per worker. The owner (the router's asyncio loop) reads
// events from it when notify_fd() turns readable.
//
//   mineru_health::Poller poller(config, expect);
//   poller.add_worker({"local-gpu-0", "http://127.0.0.1:8001", true});
//   poller.start();
//   // loop.add_reader(poller.notify_fd(), on_ready) -> poller.drain_events()
//   poller.stop();
//
// Thread-safety: all public methods are safe to call from any thread; the
// CURLM handle and the curl easy handles belong to the poller thread alone.
// Nothing throws off the poller thread.
#ifndef MINERU_HEALTH_POLLER_H_
#define MINERU_HEALTH_POLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mineru_health/config.h"
#include "mineru_health/probe.h"
#include "mineru_health/restart_policy.h"

namespace mineru_health {

struct Target {
  std::string id;
  std::string url;  // base URL; "/health" is appended. "" = not probed yet
  bool restartable = false;  // true for router-managed local workers
};

enum class PollerEventKind {
  kProbe,             // a probe finished (probe is set)
  kAudit,             // a policy transition (audit is set)
  kRestartRequested,  // the owner must restart this worker now
};

const char* to_string(PollerEventKind kind);

struct PollerEvent {
  PollerEventKind kind = PollerEventKind::kProbe;
  std::string worker_id;
  double unix_time = 0;
  std::optional<ProbeResult> probe;
  std::optional<AuditEvent> audit;
  bool in_rotation = false;  // the worker's rotation state after this event
};

struct WorkerStatus {
  std::string id;
  std::string url;
  bool restartable = false;
  WorkerPhase phase = WorkerPhase::kStarting;
  bool in_rotation = false;
  int consecutive_failures = 0;
  int attempt = 0;
  std::optional<double> next_restart_in_s;  // seconds from now
  std::string last_error;
  std::optional<double> last_latency_s;
  std::uint64_t probes = 0;
};

struct SweepStats {
  std::size_t probes = 0;
  std::size_t healthy = 0;
  double wall_s = 0;
};

using NowFn = std::function<TimePoint()>;

class Poller {
 public:
  // Throws ConfigError if `config` is invalid. config.expected_status and
  // config.max_body_bytes (what the operator set) override the same fields of
  // `expect`. `now` may be called from any thread, always under one lock.
  Poller(HealthConfig config, ProbeExpectations expect,
         NowFn now = SteadyClock::now, std::uint64_t seed = 0);
  ~Poller();  // stops the thread
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  void add_worker(const Target& target);  // replaces a worker of the same id
  void remove_worker(const std::string& id);
  // A restarted local worker came back on a new URL.
  void set_url(const std::string& id, const std::string& url);

  void start();
  void stop();  // idempotent; returns once the thread has joined
  bool running() const;

  // Inputs from the owner; each wakes the poller thread.
  void report_process_exit(const std::string& id, const std::string& reason);
  void report_passive_failure(const std::string& id, const std::string& reason);
  void report_restart_failed(const std::string& id, const std::string& reason);

  // Readable (an eventfd) while drain_events() has something to return.
  int notify_fd() const;
  std::vector<PollerEvent> drain_events();
  std::vector<WorkerStatus> statuses() const;

  // One synchronous sweep of `targets`, all concurrent up to
  // config.concurrency; no policy, no background thread. Used by the CLI's
  // `probe` and the benchmarks. Blocks: release the GIL around it.
  static std::vector<ProbeResult> sweep(const std::vector<Target>& targets,
                                        const HealthConfig& config,
                                        const ProbeExpectations& expect,
                                        SweepStats* stats = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_POLLER_H_
