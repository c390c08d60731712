// Poller::Impl: the poller's shared state and its thread (private to the
// core library). poller.cc holds the public methods, poller_loop.cc the
// thread: one loop that moves transfers (TransferDriver), feeds results to
// each worker's RestartPolicy and queues events.
//
// Threads: public methods take `mu`, change the shared state and write the
// wake eventfd. The poller thread takes `mu` around policy work only and
// never holds it while waiting on sockets. Every member read by both sides
// is GUARDED_BY(mu), checked by clang's -Wthread-safety (the
// "thread-safety" preset).
#ifndef MINERU_HEALTH_SRC_POLLER_IMPL_H_
#define MINERU_HEALTH_SRC_POLLER_IMPL_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "curl_handles.h"
#include "curl_transfer.h"
#include "due_queue.h"
#include "event_queue.h"
#include "mineru_health/poller.h"
#include "thread_annotations.h"
#include "unique_fd.h"

namespace mineru_health {

namespace internal {

// Tests reach into a Poller through this (cpp/tests only).
struct PollerTestPeer {
  // Every loop iteration asks `fault` first; a non-empty answer is handled
  // as an I/O error of the transfer driver. Pass nullptr to stop.
  static void inject_io_fault(Poller& poller,
                              std::function<std::string()> fault);
  // For tests on an injected clock, which moves without the poller thread
  // noticing: wakes the thread and returns once it has read the clock again
  // and acted on that time: policy deadlines run and due probes taken off
  // the schedule, or, while its own I/O fails, the retry backoff checked
  // (and the retry made, if it was due). False when the thread is not
  // running or did not get there within `limit` (real time).
  static bool sync(Poller& poller, std::chrono::milliseconds limit);
  // When `id`'s next probe is due; nullopt while none is scheduled (one is
  // in flight, the worker has no URL, or there is no such worker).
  static std::optional<TimePoint> probe_due(const Poller& poller,
                                            const std::string& id);
};

// Loop pacing shared by the poller thread and sweep().
inline constexpr int kMaxWaitMs = 1000;
// New transfers added per loop iteration. A probe's timeout runs from the
// moment it is added; adding 10,000 at once on a small machine makes healthy
// workers time out before the loop gets round to reading their answers.
inline constexpr std::size_t kMaxStartsPerIteration = 500;

Duration to_duration(double seconds);
double unix_now();
// A probe that never started: transport_error saying why.
ProbeResult not_started(const std::string& id, std::string why);
// File descriptors the probes may use under the current RLIMIT_NOFILE.
std::size_t fd_budget(std::size_t wanted);
// The config is what the operator set (MINERU_ROUTER_HEALTH_EXPECTED_STATUS,
// ..._MAX_BODY_BYTES); it wins over the caller's expectations.
ProbeExpectations effective(ProbeExpectations expect,
                            const HealthConfig& config);

}  // namespace internal

struct Poller::Impl {
  using Mutex = internal::Mutex;
  using Transfers = std::map<std::string, std::unique_ptr<internal::Transfer>>;

  struct Worker {
    Worker(Target t, RestartPolicy p, std::uint64_t g);

    Target target;
    std::string main_url;    // target.url + "/health"
    std::string discovered;  // native URL learnt from the main port
    int native_misses = 0;   // discovered endpoint not answering, in a row
    RestartPolicy policy;
    // Changes on add and set_url: results of older transfers are dropped.
    std::uint64_t generation;
    bool in_flight = false;
    TimePoint started_at{};
    std::uint64_t probes = 0;
    WorkerCounters counters;
    std::optional<double> last_latency_s;
    std::optional<ProbeResult> last_probe;
  };

  struct ProbeTarget {
    std::string url;  // "" = not probed
    ProbeEndpoint endpoint = ProbeEndpoint::kMain;
    double timeout_s = 0;
  };

  struct Started {
    std::string id;
    std::uint64_t generation;
    ProbeTarget target;
  };

  struct Finished {
    std::string id;
    std::uint64_t generation;
    ProbeResult result;
  };

  Impl(HealthConfig c, ProbeExpectations e, NowFn n, std::uint64_t seed);

  PolicyOptions options_for(const Target& target) const;
  ProbeTarget probe_target(const Worker& w) const;

  // --- under mu (poller.cc and poller_loop.cc) ---
  void wake_locked() REQUIRES(mu);
  Duration jittered_interval_locked() REQUIRES(mu);
  // May a non-definitive failure take one more worker out of rotation?
  EjectionGate gate_locked() const REQUIRES(mu);
  WorkerStatus snapshot_locked(const Worker& w, TimePoint t_now) const
      REQUIRES(mu);
  // Rotation count, events and deadlines after a policy call.
  void after_transition_locked(Worker& w, bool was_in_rotation,
                               const Transition& t, TimePoint t_now,
                               bool after_tick) REQUIRES(mu);
  void refresh_deadline_locked(const Worker& w, TimePoint t_now,
                               bool after_tick) REQUIRES(mu);
  void record_io_error_locked(const std::string& error, TimePoint t_now)
      REQUIRES(mu);
  // The poller thread read the clock and acted on it (PollerTestPeer::sync).
  void clock_checked_locked() REQUIRES(mu);
  template <typename Call>
  void report_locked(const std::string& id, Call call) REQUIRES(mu);

  // --- the poller thread (poller_loop.cc) ---
  void run(std::unique_ptr<internal::TransferDriver> driver) noexcept;
  // One iteration; returns "" or the loop-level I/O error.
  std::string iterate(internal::TransferDriver& driver,
                      internal::EasyPool& pool, Transfers& transfers,
                      const internal::RequestSetup& setup, bool* stop)
      EXCLUDES(mu);
  void run_ticks_locked(TimePoint t_now) REQUIRES(mu);
  std::vector<Started> select_due_locked(TimePoint t_now, std::size_t slots)
      REQUIRES(mu);
  void apply_locked(std::vector<Finished>& finished, TimePoint t_now)
      REQUIRES(mu);
  void update_endpoint_locked(Worker& w, const ProbeResult& r) REQUIRES(mu);
  int wait_ms_locked(TimePoint t_now, bool slots_free) REQUIRES(mu);
  // Drops the transfers in flight after a loop error and returns how long
  // to wait before rebuilding the driver.
  Duration drop_in_flight_locked(const Transfers& transfers, TimePoint t_now)
      REQUIRES(mu);
  // Waits `delay` on the poller's clock, or until stop(); false when
  // stopping.
  bool wait_before_retry(Duration delay) EXCLUDES(mu);

  const HealthConfig config;
  const ProbeExpectations expect;
  const NowFn now;
  const internal::UniqueFd wake_fd;  // wakes the poller thread
  internal::EventQueue events;

  mutable Mutex mu;
  std::map<std::string, Worker> workers GUARDED_BY(mu);
  internal::DueQueue<std::string> probe_queue GUARDED_BY(mu);
  internal::DueQueue<std::string> deadline_queue GUARDED_BY(mu);
  // Worker ids whose transfer must be dropped by the poller thread.
  std::vector<std::string> aborts GUARDED_BY(mu);
  std::mt19937_64 rng GUARDED_BY(mu);
  std::uint64_t next_generation GUARDED_BY(mu) = 1;
  bool stop_requested GUARDED_BY(mu) = false;
  bool thread_running GUARDED_BY(mu) = false;
  std::size_t in_rotation GUARDED_BY(mu) = 0;
  // Set by the poller thread when the fleet size changes.
  std::size_t cap GUARDED_BY(mu) = 1;
  std::size_t capped_for GUARDED_BY(mu) = SIZE_MAX;
  PollerStats stats GUARDED_BY(mu);
  std::optional<TimePoint> last_error_event GUARDED_BY(mu);
  std::function<std::string()> fault GUARDED_BY(mu);
  std::condition_variable_any retry_cv;  // stop() ends a retry wait early
  // Times the poller thread has read the clock and acted on it; signalled
  // on clock_checked_cv (what PollerTestPeer::sync waits for).
  std::uint64_t clock_checks GUARDED_BY(mu) = 0;
  std::condition_variable_any clock_checked_cv;

  Mutex lifecycle_mu;  // serializes start() and stop()
  std::thread thread GUARDED_BY(lifecycle_mu);
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_SRC_POLLER_IMPL_H_
