// Poller: one background thread that probes every worker's health endpoint
// with libcurl's multi interface, all probes concurrent, and drives one
// RestartPolicy per worker. The owner (the router's asyncio loop) reads
// events from it when notify_fd() turns readable.
//
//   mineru_health::raise_fd_limit(config.concurrency);  // once, at start-up
//   mineru_health::Poller poller(config, expect);
//   poller.add_worker({"local-gpu-0", "http://127.0.0.1:8001", true,
//                      "http://127.0.0.1:18001/health"});
//   poller.start();
//   // loop.add_reader(poller.notify_fd(), on_ready) -> poller.drain_events()
//   poller.stop();
//
// Which endpoint a worker is probed on:
// - Target::health_url set (the router knows a local worker's native port):
//   that URL, judged with probe_timeout_s; never anything else.
// - Otherwise `url + "/health"` (the main port), judged with the generous
//   main_port_timeout_s. A healthy main-port answer that advertises
//   `"native_health_port": N` switches the worker to
//   `http://<host of url>:N/health` (only the port comes from the body).
//   Fallback: when that discovered endpoint stops answering (connect error,
//   timeout or transport error, failure_threshold probes in a row, each
//   counted by the policy like any failure), the next probe goes to the
//   main port again, which re-discovers the port (the worker may have been
//   replaced) or keeps judging the worker there. Any HTTP answer, a 503
//   included, counts as answering.
// A worker has at most one probe in flight; its next probe is due one
// jittered interval after the previous one started, or when it ended if
// that is later.
//
// Mass-ejection guard: the poller answers the policy's EjectionGate so that
// non-definitive ejections (failed probes) never hold more than
// max_ejection_percent of the workers out of rotation, and never the last one
// in rotation. Workers out of rotation for any reason (starting, restarting,
// dead) count. Definitive failures (a worker's own engine_dead or loop_hung,
// in a probe or seen in traffic: report_passive_failure) never ask.
//
// Errors of the poller's own event loop (epoll, curl_multi_socket_action,
// curl_multi_setopt) are never held against a worker: the probes in flight
// are dropped and rescheduled, the transfer driver is rebuilt after a
// backoff (100 ms doubling to 5 s, so a persistent failure cannot spin), and
// the owner sees a kError event (at most one a second) and stats(). A probe
// that curl refuses to set up (curl_easy_setopt, curl_multi_add_handle: a
// URL curl rejects, out of memory) fails that probe as transport_error and
// is reported the same way.
//
// Thread-safety: all public methods are safe to call from any thread; the
// curl handles belong to the poller thread alone. Nothing throws off the
// poller thread.
#ifndef MINERU_HEALTH_POLLER_H_
#define MINERU_HEALTH_POLLER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mineru_health/config.h"
#include "mineru_health/probe.h"
#include "mineru_health/restart_policy.h"
#include "mineru_health/worker_counters.h"

namespace mineru_health {

struct Target {
  Target() = default;
  // Brace-initializable with or without health_url.
  Target(std::string id_, std::string url_ = "", bool restartable_ = false,
         std::string health_url_ = "")
      : id(std::move(id_)),
        url(std::move(url_)),
        restartable(restartable_),
        health_url(std::move(health_url_)) {}

  std::string id;
  std::string url;  // base URL; "/health" is appended. "" = not probed yet
  bool restartable = false;  // true for router-managed local workers
  // Explicit native health endpoint (full URL, e.g.
  // "http://127.0.0.1:18001/health"); "" = probe the main port and discover.
  std::string health_url;
};

enum class PollerEventKind {
  kProbe,             // a probe finished (probe is set)
  kAudit,             // a policy transition (audit is set)
  kRestartRequested,  // the owner must restart this worker now
  kError,             // the poller's own I/O failed (error is set)
};

const char* to_string(PollerEventKind kind);

struct WorkerStatus {
  std::string id;
  std::string url;
  std::string health_url;  // the explicit one; "" when none
  std::string probe_url;   // what is probed now; "" = not probed
  ProbeEndpoint endpoint = ProbeEndpoint::kMain;  // kind of probe_url
  bool restartable = false;
  WorkerPhase phase = WorkerPhase::kStarting;
  bool in_rotation = false;
  int consecutive_failures = 0;
  int consecutive_successes = 0;
  int attempt = 0;
  std::optional<double> next_restart_in_s;   // seconds from now
  std::optional<double> boot_deadline_in_s;  // starting / restarting
  std::optional<double> stable_in_s;  // until the restart counts as success
  bool awaiting_process = false;      // restart requested, no new process yet
  bool ejection_suppressed = false;   // held in rotation by the guard
  std::string last_error;
  std::string last_cause;  // see restart_policy.h (kCause*, probe statuses)
  std::optional<int> last_exit_code;
  std::optional<double> last_latency_s;
  // The last finished probe, figures included (loop_lag_s, ...).
  std::optional<ProbeResult> last_probe;
  std::uint64_t probes = 0;
  // Its probes and policy events, counted by the poller (worker_counters.h).
  WorkerCounters counters;
};

struct PollerEvent {
  PollerEventKind kind = PollerEventKind::kProbe;
  std::string worker_id;  // "" for kError
  double unix_time = 0;
  std::optional<ProbeResult> probe;
  std::optional<AuditEvent> audit;
  // The worker's rotation state after the policy call that produced this
  // event (one call may produce several audit events; they all carry the
  // state the last one ends in). The rest of its state: Poller::status().
  bool in_rotation = false;
  std::string error;  // kError: what failed
};

// Counters of the poller itself (not of any worker). Monotonic except the
// current-state fields.
struct PollerStats {
  std::uint64_t loop_iterations = 0;
  std::uint64_t probes_started = 0;
  std::uint64_t probes_finished = 0;
  // Results thrown away: stale (the worker moved on) or lost to an I/O error.
  std::uint64_t probes_discarded = 0;
  std::uint64_t dropped_events = 0;  // probe events dropped: queue full
  std::uint64_t queued_events = 0;   // current
  std::uint64_t event_notify_errors = 0;
  std::uint64_t io_errors = 0;
  std::uint64_t consecutive_io_errors = 0;  // current streak
  bool io_failing = false;  // current: the last iteration failed
  std::string last_io_error;
  std::uint64_t driver_rebuilds = 0;
  std::uint64_t ejections_suppressed = 0;
  std::size_t workers = 0;          // current
  std::size_t in_rotation = 0;      // current
  std::size_t in_flight = 0;        // current
  std::size_t concurrency_cap = 0;  // current: min(concurrency, fd budget)
};

struct SweepStats {
  std::size_t probes = 0;
  std::size_t healthy = 0;
  double wall_s = 0;
};

// The outcome of raise_fd_limit. Limits are as getrlimit reports them
// (RLIM_INFINITY as UINT64_MAX).
struct FdLimit {
  std::uint64_t soft_before = 0;
  std::uint64_t soft = 0;
  std::uint64_t hard = 0;
  bool raised = false;
  std::string error;  // "" or why getrlimit/setrlimit failed
};

// File descriptors the probes leave to the rest of the process.
inline constexpr std::size_t kReservedFds = 256;

// Raises this process's soft RLIMIT_NOFILE to `probe_fds + kReservedFds`
// (never above the hard limit, never lowering it). Process-wide, so the
// library never calls it by itself: the router calls it once at start-up,
// before starting pollers, with the most probes it wants in flight (e.g.
// min(worker count, concurrency)). Without it a poller keeps probes within
// the current limit (stats().concurrency_cap), so large fleets are probed
// in more rounds instead of failing with EMFILE.
FdLimit raise_fd_limit(std::size_t probe_fds);

using NowFn = std::function<TimePoint()>;

namespace internal {
struct PollerTestPeer;
}

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
  // The owner (re)started the worker's process on `url` (and, when it knows
  // it, its native endpoint `health_url`; "" = discover from the main
  // port). Replaces both URLs and any discovered endpoint; a non-empty URL
  // reports the process started to the policy (the boot deadline runs from
  // here). url = health_url = "" stops probing.
  void set_url(const std::string& id, const std::string& url,
               const std::string& health_url = "");

  // Throws std::runtime_error when the transfer driver cannot be created.
  void start();
  void stop();  // idempotent; returns once the thread has joined
  bool running() const;

  // Inputs from the owner; each wakes the poller thread.
  // `exit_code`: the process's exit status (negative: killed by a signal).
  void report_process_exit(const std::string& id, const std::string& reason,
                           std::optional<int> exit_code = std::nullopt);
  void report_passive_failure(const std::string& id, const std::string& reason);
  void report_restart_failed(const std::string& id, const std::string& reason);

  // Readable (an eventfd) while drain_events() has something to return.
  int notify_fd() const;
  std::vector<PollerEvent> drain_events();
  std::vector<WorkerStatus> statuses() const;
  // One worker's state; nullopt for an unknown id.
  std::optional<WorkerStatus> status(const std::string& id) const;
  PollerStats stats() const;

  // One synchronous sweep of `targets`, all concurrent up to
  // config.concurrency (and the fd limit); no policy, no background thread.
  // Probes Target::health_url when set, else url + "/health", with
  // probe_timeout_s. Used by the CLI's `probe` and the benchmarks. Blocks:
  // release the GIL around it.
  static std::vector<ProbeResult> sweep(const std::vector<Target>& targets,
                                        const HealthConfig& config,
                                        const ProbeExpectations& expect,
                                        SweepStats* stats = nullptr);

 private:
  friend struct internal::PollerTestPeer;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_POLLER_H_
