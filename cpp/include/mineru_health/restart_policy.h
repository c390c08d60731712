// Restart policy: the per-worker state machine that turns probe results into
// rotation decisions, restarts with exponential backoff, and give-up.
//
//   mineru_health::RestartPolicy policy(options, clock_now);
//   auto t = policy.on_probe(result, clock_now);      // may eject, schedule
//   auto due = policy.on_tick(clock_now);             // restart now?
//   if (due.restart_now) start_restart();  ... policy.on_restart_finished(...)
//
// The policy never sleeps or reads a clock: every call takes `now` and the
// caller waits until next_deadline(). Not thread-safe: one owner serializes
// calls (the poller holds its lock around them).
#ifndef MINERU_HEALTH_RESTART_POLICY_H_
#define MINERU_HEALTH_RESTART_POLICY_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "mineru_health/probe.h"

namespace mineru_health {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;
using Duration = std::chrono::nanoseconds;

enum class WorkerPhase {
  kStarting,          // not yet answered healthy since it was added
  kHealthy,           // in rotation
  kUnhealthy,         // failures below threshold: out of rotation, counting
  kFailed,            // threshold reached (remote workers stay here)
  kRestartScheduled,  // waiting out the backoff
  kRestarting,        // restart requested; must be healthy by boot deadline
  kGaveUp,            // max attempts spent; still probed, recovers by itself
};

const char* to_string(WorkerPhase phase);

enum class AuditAction {
  kHealthFailed,
  kRestartScheduled,
  kRestartSucceeded,
  kRestartFailed,
  kGaveUp,
  kRecovered,
  kEjected,
};

const char* to_string(AuditAction action);

struct AuditEvent {
  AuditAction action;
  int attempt = 0;  // restart attempt the event concerns (0-based)
  std::string reason;
  WorkerPhase from;
  WorkerPhase to;
};

struct PolicyOptions {
  int failure_threshold = 3;
  int healthy_threshold = 1;
  Duration backoff_base = std::chrono::seconds(1);
  Duration backoff_max = std::chrono::seconds(60);
  int max_attempts = 5;
  Duration boot_timeout = std::chrono::seconds(300);
  bool restartable = true;  // false for remote workers: eject/readmit only
};

// What one call changed. `restart_now` asks the owner to restart the worker.
struct Transition {
  WorkerPhase from;
  WorkerPhase to;
  std::vector<AuditEvent> events;
  bool restart_now = false;
  bool changed() const { return from != to; }
};

// min(base * 2^attempt, max), without overflow for any attempt.
Duration backoff_delay(const PolicyOptions& options, int attempt);

class RestartPolicy {
 public:
  RestartPolicy(PolicyOptions options, TimePoint now);

  Transition on_probe(const ProbeResult& result, TimePoint now);
  // The local worker process exited: definitive.
  Transition on_process_exit(const std::string& reason, TimePoint now);
  // Seen outside probes (a task failed fatally, a submission got 503 from a
  // dead engine): out of rotation at once; restart scheduled when restartable.
  Transition on_passive_failure(const std::string& reason, TimePoint now);
  // The owner could not even start the replacement process.
  Transition on_restart_failed(const std::string& reason, TimePoint now);
  // Deadlines: a due restart (restart_now) or a boot timeout.
  Transition on_tick(TimePoint now);

  WorkerPhase phase() const { return phase_; }
  bool in_rotation() const { return phase_ == WorkerPhase::kHealthy; }
  int consecutive_failures() const { return consecutive_failures_; }
  int consecutive_successes() const { return consecutive_successes_; }
  int attempt() const { return attempt_; }
  const std::string& last_error() const { return last_error_; }
  // The next time on_tick has work to do; nullopt when none.
  std::optional<TimePoint> next_deadline() const;
  std::optional<TimePoint> next_restart_at() const;

 private:
  Transition fail_definitively(const std::string& reason, AuditAction first,
                               TimePoint now);
  void schedule_restart(Transition& t, const std::string& reason,
                        TimePoint now);
  // Threshold or boot deadline reached: failed, then a restart is scheduled
  // (restartable workers only).
  void mark_failed(Transition& t, const std::string& reason, TimePoint now);
  // One restart attempt failed: count it, then reschedule or give up.
  void count_failed_restart(Transition& t, const std::string& reason,
                            TimePoint now);
  void enter(Transition& t, WorkerPhase to);

  PolicyOptions options_;
  WorkerPhase phase_ = WorkerPhase::kStarting;
  int consecutive_failures_ = 0;
  int consecutive_successes_ = 0;
  int attempt_ = 0;
  std::string last_error_;
  std::optional<TimePoint> restart_at_;
  std::optional<TimePoint> boot_deadline_;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_RESTART_POLICY_H_
