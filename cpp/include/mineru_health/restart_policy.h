// Restart policy: the per-worker state machine that turns probe results and
// the owner's reports into rotation decisions, restarts with exponential
// backoff, a stability window, and give-up.
//
//   mineru_health::RestartPolicy policy(options, clock_now);
//   auto t = policy.on_probe(result, clock_now, gate);  // may eject, schedule
//   auto due = policy.on_tick(clock_now);               // restart now?
//   if (due.restart_now) start_restart();
//   policy.on_process_started(clock_now);   // the new process is running
//
// The policy never sleeps or reads a clock: every call takes `now` and the
// caller waits until next_deadline(). Not thread-safe: one owner serializes
// calls (the poller holds its lock around them).
//
// Rules, in the order a worker meets them:
// - Rotation. Only kHealthy is in rotation. Every phase change records an
//   audit event: starting -> healthy and restarting -> healthy `admitted`,
//   restart_scheduled -> restarting `auto_restart_requested` (with
//   Transition::restart_now).
// - Failures. A definitive failure (engine_dead or loop_hung 503, process
//   exit, the worker's own verdict seen in traffic) fails the worker at once,
//   in any phase that can fail, including `restarting` once the owner reported
//   the new process started: that attempt fails immediately instead of waiting
//   out the boot timeout. Other probe failures eject at the first and fail at
//   failure_threshold.
// - Mass-ejection guard. A non-definitive ejection (a failed probe taking a
//   healthy worker out of rotation) happens only
//   when the owner's EjectionGate allows it; otherwise the worker stays in
//   rotation, the first held-back ejection of a failure streak records
//   `ejection_suppressed` with the gate's reason, and the next failure asks
//   again. Definitive failures never ask.
// - Restarts. failed -> restart_scheduled after min(base*2^attempt, max);
//   restarting until a healthy answer. The boot deadline runs from
//   on_process_started(), not from the restart request (a request that never
//   leads to a started process fails after one boot timeout too).
// - Stability window. A restart counts as successful (`auto_restart_success`,
//   attempt reset to 0) only once the worker has stayed healthy for
//   stable_window. Failing before that counts as a failed attempt
//   (`auto_restart_failed`), so a worker that dies again right after each
//   restart reaches gave_up. stable_window = 0 confirms at the first healthy
//   answer.
// - gave_up. A gave_up worker is still probed and comes back (`recovered`)
//   when it answers healthy again: a remote worker that recovers, or a local
//   worker whose last replacement process eventually answered. Its attempt
//   count is kept until it has been healthy for stable_window, so failing
//   again soon gives up again at once. A local worker whose process exited
//   never answers again: it stays gave_up until the owner replaces it
//   (add_worker with the same id starts a fresh policy).
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
  kRestartSucceeded,  // healthy for the whole stability window
  kRestartFailed,
  kGaveUp,
  kRecovered,
  kEjected,
  kAdmitted,            // starting/restarting -> healthy
  kEjectionSuppressed,  // the mass-ejection guard kept the worker in rotation
  kRestartRequested,    // restart_scheduled -> restarting: owner restarts it
};

const char* to_string(AuditAction action);

// Failure causes other than a probe status. AuditEvent::cause and
// last_cause() hold one of these or the to_string() of the ProbeStatus that
// failed ("timeout", "engine_dead", "loop_hung", ...).
inline constexpr const char* kCauseProcessExit = "process_exit";
inline constexpr const char* kCausePassiveFailure = "passive_failure";
inline constexpr const char* kCauseBootTimeout = "boot_timeout";
inline constexpr const char* kCauseRestartFailed = "restart_failed";

// Every value a cause can take, probe statuses first (for metric labels).
std::vector<std::string> failure_cause_names();

struct AuditEvent {
  AuditAction action;
  int attempt = 0;  // restart attempt the event concerns (0-based)
  std::string reason;
  WorkerPhase from;
  WorkerPhase to;
  std::string cause;  // for failures and suppressions; "" otherwise
};

struct PolicyOptions {
  int failure_threshold = 3;
  int healthy_threshold = 1;
  Duration backoff_base = std::chrono::seconds(1);
  Duration backoff_max = std::chrono::seconds(60);
  int max_attempts = 5;
  Duration boot_timeout = std::chrono::seconds(300);
  Duration stable_window = std::chrono::seconds(600);
  bool restartable = true;  // false for remote workers: eject/readmit only
};

// The owner's answer to "may a non-definitive failure take this worker out
// of rotation now?" (the mass-ejection guard; see the header comment).
struct EjectionGate {
  bool allowed = true;
  std::string why;  // when not allowed: recorded in ejection_suppressed
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

  Transition on_probe(const ProbeResult& result, TimePoint now,
                      const EjectionGate& gate = {});
  // The owner started the worker's (new) process: a local worker's boot
  // deadline runs from here. While restarting, probe answers and exits
  // before this report belong to the old process and are not held against
  // the attempt.
  Transition on_process_started(TimePoint now);
  // The local worker process exited: definitive. `exit_code` as the owner
  // has it (negative: killed by that signal), recorded for statuses.
  Transition on_process_exit(const std::string& reason,
                             std::optional<int> exit_code, TimePoint now);
  // The worker's own verdict seen outside probes (a task failed fatally, a
  // submission got 503 from a dead engine): definitive, as its /health saying
  // engine_dead is; out of rotation at once, restart scheduled when
  // restartable. Ignored once the worker is out of rotation or restarting.
  Transition on_passive_failure(const std::string& reason, TimePoint now);
  // The owner could not even start the replacement process.
  Transition on_restart_failed(const std::string& reason, TimePoint now);
  // Deadlines: a due restart (restart_now), a boot timeout, the end of a
  // stability window.
  Transition on_tick(TimePoint now);

  WorkerPhase phase() const { return phase_; }
  bool in_rotation() const { return phase_ == WorkerPhase::kHealthy; }
  int consecutive_failures() const { return consecutive_failures_; }
  int consecutive_successes() const { return consecutive_successes_; }
  int attempt() const { return attempt_; }
  const std::string& last_error() const { return last_error_; }
  const std::string& last_cause() const { return last_cause_; }
  std::optional<int> last_exit_code() const { return last_exit_code_; }
  // Restart requested, new process not reported started yet.
  bool awaiting_process() const {
    return phase_ == WorkerPhase::kRestarting && !process_started_;
  }
  // The first non-definitive ejection of this failure streak was held back.
  bool ejection_suppressed() const { return ejection_suppressed_; }
  // The next time on_tick has work to do; nullopt when none.
  std::optional<TimePoint> next_deadline() const;
  std::optional<TimePoint> next_restart_at() const;
  std::optional<TimePoint> boot_deadline() const;
  // When the running restart counts as successful (healthy until then).
  std::optional<TimePoint> stable_at() const;

 private:
  Transition begin() const { return Transition{phase_, phase_, {}, false}; }
  void audit(Transition& t, AuditAction action, const std::string& reason,
             WorkerPhase from, const std::string& cause = "");
  void enter(Transition& t, WorkerPhase to);
  void enter_healthy(Transition& t, AuditAction action,
                     const std::string& reason, TimePoint now);
  // A healthy worker that stayed healthy long enough: its restart counts.
  void confirm_restart(Transition& t, const std::string& reason);
  void fail_definitively(Transition& t, const std::string& reason,
                         const std::string& cause, TimePoint now);
  // A non-definitive failure of a healthy worker: ejected when the gate
  // allows it. False when held back.
  bool eject(Transition& t, const std::string& reason, const std::string& cause,
             const EjectionGate& gate);
  void schedule_restart(Transition& t, const std::string& reason,
                        TimePoint now);
  // Threshold, boot deadline or a definitive failure: failed, then a restart
  // is scheduled (restartable workers only). A failure while a restart is
  // still unconfirmed counts as that restart's failure.
  void mark_failed(Transition& t, const std::string& reason,
                   const std::string& cause, TimePoint now);
  // One restart attempt failed: count it, then reschedule or give up.
  void count_failed_restart(Transition& t, const std::string& reason,
                            const std::string& cause, TimePoint now);

  PolicyOptions options_;
  WorkerPhase phase_ = WorkerPhase::kStarting;
  int consecutive_failures_ = 0;
  int consecutive_successes_ = 0;
  int attempt_ = 0;
  std::string last_error_;
  std::string last_cause_;
  std::optional<int> last_exit_code_;
  std::optional<TimePoint> restart_at_;
  std::optional<TimePoint> boot_deadline_;
  std::optional<TimePoint> stable_at_;
  // While restarting: the owner reported the new process started.
  bool process_started_ = false;
  // A restart was made and is not yet confirmed by the stability window.
  bool restart_unconfirmed_ = false;
  bool ejection_suppressed_ = false;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_RESTART_POLICY_H_
