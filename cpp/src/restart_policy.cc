// The per-worker restart state machine. Pure: every input carries `now`, and
// the owner waits until next_deadline() before calling on_tick(). Every
// switch lists every phase, so a new phase is a compile error (-Wswitch).
#include "mineru_health/restart_policy.h"

#include <fmt/format.h>

#include <limits>
#include <utility>

namespace mineru_health {
namespace {

double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

const char* to_string(WorkerPhase phase) {
  switch (phase) {
    case WorkerPhase::kStarting:
      return "starting";
    case WorkerPhase::kHealthy:
      return "healthy";
    case WorkerPhase::kUnhealthy:
      return "unhealthy";
    case WorkerPhase::kFailed:
      return "failed";
    case WorkerPhase::kRestartScheduled:
      return "restart_scheduled";
    case WorkerPhase::kRestarting:
      return "restarting";
    case WorkerPhase::kGaveUp:
      return "gave_up";
  }
  return "unknown";
}

const char* to_string(AuditAction action) {
  switch (action) {
    case AuditAction::kHealthFailed:
      return "health_failed";
    case AuditAction::kRestartScheduled:
      return "auto_restart_scheduled";
    case AuditAction::kRestartSucceeded:
      return "auto_restart_success";
    case AuditAction::kRestartFailed:
      return "auto_restart_failed";
    case AuditAction::kGaveUp:
      return "auto_restart_gave_up";
    case AuditAction::kRecovered:
      return "recovered";
    case AuditAction::kEjected:
      return "ejected";
    case AuditAction::kAdmitted:
      return "admitted";
    case AuditAction::kEjectionSuppressed:
      return "ejection_suppressed";
    case AuditAction::kRestartRequested:
      return "auto_restart_requested";
  }
  return "unknown";
}

std::vector<std::string> failure_cause_names() {
  std::vector<std::string> names;
  for (int s = static_cast<int>(ProbeStatus::kHealthy) + 1;
       s <= static_cast<int>(ProbeStatus::kLoopHung); ++s) {
    names.emplace_back(to_string(static_cast<ProbeStatus>(s)));
  }
  for (const char* cause : {kCauseProcessExit, kCausePassiveFailure,
                            kCauseBootTimeout, kCauseRestartFailed}) {
    names.emplace_back(cause);
  }
  return names;
}

Duration backoff_delay(const PolicyOptions& options, int attempt) {
  const Duration::rep base = options.backoff_base.count();
  const Duration::rep max = options.backoff_max.count();
  if (base <= 0) return Duration(0);
  if (attempt < 0) attempt = 0;
  // Doubling `base` `attempt` times overflows int64 after at most 63 steps;
  // compare against max / 2^attempt instead of multiplying.
  if (attempt >= std::numeric_limits<Duration::rep>::digits)
    return Duration(max);
  if (base > (max >> attempt)) return Duration(max);
  return Duration(base << attempt);
}

RestartPolicy::RestartPolicy(PolicyOptions options, TimePoint now)
    : options_(std::move(options)) {
  // A local worker gets the boot timeout to answer healthy for the first
  // time (loading models takes minutes); a remote one is judged by the
  // failure threshold alone. on_process_started() restarts the count.
  if (options_.restartable) boot_deadline_ = now + options_.boot_timeout;
}

void RestartPolicy::audit(Transition& t, AuditAction action,
                          const std::string& reason, WorkerPhase from,
                          const std::string& cause) {
  t.events.push_back(AuditEvent{action, attempt_, reason, from, phase_, cause});
}

void RestartPolicy::enter(Transition& t, WorkerPhase to) {
  phase_ = to;
  t.to = to;
}

void RestartPolicy::enter_healthy(Transition& t, AuditAction action,
                                  const std::string& reason, TimePoint now) {
  const WorkerPhase from = phase_;
  boot_deadline_.reset();
  process_started_ = false;
  last_error_.clear();
  ejection_suppressed_ = false;
  enter(t, WorkerPhase::kHealthy);
  audit(t, action, reason, from);
  if (!restart_unconfirmed_ && attempt_ == 0) return;
  if (options_.stable_window <= Duration::zero()) {
    confirm_restart(t, "healthy (no stability window)");
  } else {
    // Left rotation during a window: the whole window starts again.
    stable_at_ = now + options_.stable_window;
  }
}

void RestartPolicy::confirm_restart(Transition& t, const std::string& reason) {
  stable_at_.reset();
  if (restart_unconfirmed_) {
    restart_unconfirmed_ = false;
    audit(t, AuditAction::kRestartSucceeded, reason, phase_);
  }
  attempt_ = 0;
}

bool RestartPolicy::eject(Transition& t, const std::string& reason,
                          const std::string& cause, const EjectionGate& gate) {
  if (!gate.allowed) {
    if (!ejection_suppressed_) {
      ejection_suppressed_ = true;
      audit(t, AuditAction::kEjectionSuppressed,
            fmt::format("{} (ejection held back: {})", reason, gate.why),
            phase_, cause);
    }
    return false;
  }
  ejection_suppressed_ = false;
  stable_at_.reset();
  enter(t, WorkerPhase::kUnhealthy);
  audit(t, AuditAction::kEjected, reason, WorkerPhase::kHealthy, cause);
  return true;
}

void RestartPolicy::schedule_restart(Transition& t, const std::string& reason,
                                     TimePoint now) {
  if (!options_.restartable)
    return;  // remote workers stay failed until they recover
  const WorkerPhase from = phase_;
  boot_deadline_.reset();
  if (attempt_ >= options_.max_attempts) {
    restart_at_.reset();
    enter(t, WorkerPhase::kGaveUp);
    audit(t, AuditAction::kGaveUp, reason, from, last_cause_);
    return;
  }
  restart_at_ = now + backoff_delay(options_, attempt_);
  enter(t, WorkerPhase::kRestartScheduled);
  audit(t, AuditAction::kRestartScheduled,
        fmt::format("{} (restart in {}s)", reason,
                    seconds(backoff_delay(options_, attempt_))),
        from, last_cause_);
}

void RestartPolicy::mark_failed(Transition& t, const std::string& reason,
                                const std::string& cause, TimePoint now) {
  const WorkerPhase from = phase_;
  stable_at_.reset();
  enter(t, WorkerPhase::kFailed);
  audit(t, AuditAction::kHealthFailed, reason, from, cause);
  if (restart_unconfirmed_) {
    // Failed before the stability window ended: the restart did not work.
    restart_unconfirmed_ = false;
    audit(t, AuditAction::kRestartFailed,
          fmt::format("failed within the stability window: {}", reason), phase_,
          cause);
    ++attempt_;
  }
  schedule_restart(t, reason, now);
}

void RestartPolicy::count_failed_restart(Transition& t,
                                         const std::string& reason,
                                         const std::string& cause,
                                         TimePoint now) {
  last_error_ = reason;
  last_cause_ = cause;
  consecutive_successes_ = 0;
  boot_deadline_.reset();
  stable_at_.reset();
  process_started_ = false;
  restart_unconfirmed_ = false;
  const WorkerPhase from = phase_;
  enter(t, WorkerPhase::kFailed);
  audit(t, AuditAction::kRestartFailed, reason, from, cause);
  ++attempt_;
  schedule_restart(t, reason, now);
}

void RestartPolicy::fail_definitively(Transition& t, const std::string& reason,
                                      const std::string& cause, TimePoint now) {
  switch (phase_) {
    case WorkerPhase::kHealthy:
      // Out of rotation first (never held back), then failed without
      // waiting for the threshold.
      eject(t, reason, cause, EjectionGate{});
      [[fallthrough]];
    case WorkerPhase::kStarting:
    case WorkerPhase::kUnhealthy:
      mark_failed(t, reason, cause, now);
      break;
    case WorkerPhase::kRestarting:
      // The new process says it cannot serve: this attempt failed, no need
      // to wait for the boot deadline. Before the owner reported the new
      // process, the signal came from the old one.
      if (process_started_) count_failed_restart(t, reason, cause, now);
      break;
    case WorkerPhase::kFailed:
    case WorkerPhase::kRestartScheduled:
    case WorkerPhase::kGaveUp:
      // Already out of rotation and handled: a second signal must not
      // reschedule (that would thrash).
      break;
  }
}

Transition RestartPolicy::on_probe(const ProbeResult& result, TimePoint now,
                                   const EjectionGate& gate) {
  Transition t = begin();
  if (result.healthy()) {
    consecutive_failures_ = 0;
    ++consecutive_successes_;
    ejection_suppressed_ = false;
    const bool enough = consecutive_successes_ >= options_.healthy_threshold;
    switch (phase_) {
      case WorkerPhase::kHealthy:
        break;
      case WorkerPhase::kStarting:
        if (enough) enter_healthy(t, AuditAction::kAdmitted, "", now);
        break;
      case WorkerPhase::kUnhealthy:
      case WorkerPhase::kFailed:
      case WorkerPhase::kGaveUp:
        if (enough) enter_healthy(t, AuditAction::kRecovered, "", now);
        break;
      case WorkerPhase::kRestarting:
        if (enough && process_started_) {
          enter_healthy(
              t, AuditAction::kAdmitted,
              fmt::format("restart attempt {} answered healthy", attempt_),
              now);
        }
        break;
      case WorkerPhase::kRestartScheduled:
        // The failure was already established (threshold or definitive): a
        // probe answered from before the crash, or a worker that flaps back,
        // must not cancel the restart.
        break;
    }
    return t;
  }

  // A restarting worker's probes before the owner reported the new process
  // are the old process's: not held against the attempt.
  if (phase_ == WorkerPhase::kRestarting && !process_started_) return t;

  const std::string cause = to_string(result.status);
  last_error_ = result.detail;
  last_cause_ = cause;
  consecutive_successes_ = 0;
  ++consecutive_failures_;
  if (result.definitive()) {
    fail_definitively(t, result.detail, cause, now);
    return t;
  }

  const bool at_threshold = consecutive_failures_ >= options_.failure_threshold;
  switch (phase_) {
    case WorkerPhase::kHealthy:
      if (eject(t, result.detail, cause, gate) && at_threshold) {
        mark_failed(t, result.detail, cause, now);
      }
      break;
    case WorkerPhase::kUnhealthy:
      if (at_threshold) mark_failed(t, result.detail, cause, now);
      break;
    case WorkerPhase::kStarting:
      if (options_.restartable) {
        // A booting local worker is judged by its boot deadline, not by
        // refused connections while it loads.
        if (boot_deadline_ && now >= *boot_deadline_) {
          last_cause_ = kCauseBootTimeout;
          mark_failed(
              t,
              fmt::format("not healthy within boot timeout: {}", result.detail),
              kCauseBootTimeout, now);
        }
      } else if (at_threshold) {
        mark_failed(t, result.detail, cause, now);  // remote: stays failed
      }
      break;
    case WorkerPhase::kFailed:
    case WorkerPhase::kRestartScheduled:
    case WorkerPhase::kRestarting:
    case WorkerPhase::kGaveUp:
      // Counted, but the boot deadline or the schedule decides what's next.
      break;
  }
  return t;
}

Transition RestartPolicy::on_process_started(TimePoint now) {
  Transition t = begin();
  if (!options_.restartable) return t;
  switch (phase_) {
    case WorkerPhase::kStarting:
      boot_deadline_ = now + options_.boot_timeout;
      break;
    case WorkerPhase::kRestarting:
      process_started_ = true;
      consecutive_successes_ = 0;
      boot_deadline_ = now + options_.boot_timeout;
      break;
    case WorkerPhase::kHealthy:
    case WorkerPhase::kUnhealthy:
    case WorkerPhase::kFailed:
    case WorkerPhase::kRestartScheduled:
    case WorkerPhase::kGaveUp:
      // A new URL for a process the policy did not ask for: its probes
      // decide, as for any answer.
      break;
  }
  return t;
}

Transition RestartPolicy::on_process_exit(const std::string& reason,
                                          std::optional<int> exit_code,
                                          TimePoint now) {
  Transition t = begin();
  last_exit_code_ = exit_code;
  // The old process on its way out after a restart request.
  if (phase_ == WorkerPhase::kRestarting && !process_started_) return t;
  last_error_ = reason;
  last_cause_ = kCauseProcessExit;
  ++consecutive_failures_;
  consecutive_successes_ = 0;
  fail_definitively(t, reason, kCauseProcessExit, now);
  return t;
}

Transition RestartPolicy::on_passive_failure(const std::string& reason,
                                             TimePoint now) {
  Transition t = begin();
  switch (phase_) {
    case WorkerPhase::kHealthy:
    case WorkerPhase::kStarting:
    case WorkerPhase::kUnhealthy:
      last_error_ = reason;
      last_cause_ = kCausePassiveFailure;
      ++consecutive_failures_;
      consecutive_successes_ = 0;
      // The worker's own verdict on its engine (its task failed fatally, it
      // refused a submission for a dead engine) is as definitive as its
      // /health saying so: never held back by the gate, failed at once.
      fail_definitively(t, reason, kCausePassiveFailure, now);
      break;
    case WorkerPhase::kFailed:
    case WorkerPhase::kRestartScheduled:
    case WorkerPhase::kRestarting:
    case WorkerPhase::kGaveUp:
      // Out of rotation already (a restarting worker takes no tasks).
      break;
  }
  return t;
}

Transition RestartPolicy::on_restart_failed(const std::string& reason,
                                            TimePoint now) {
  Transition t = begin();
  if (phase_ == WorkerPhase::kRestarting) {
    count_failed_restart(t, reason, kCauseRestartFailed, now);
  }
  return t;
}

Transition RestartPolicy::on_tick(TimePoint now) {
  Transition t = begin();
  switch (phase_) {
    case WorkerPhase::kRestartScheduled:
      if (restart_at_ && now >= *restart_at_) {
        restart_at_.reset();
        // Until the owner reports the new process, the boot deadline runs
        // from the request: a launch that never happens fails too.
        boot_deadline_ = now + options_.boot_timeout;
        process_started_ = false;
        restart_unconfirmed_ = true;
        consecutive_successes_ = 0;
        enter(t, WorkerPhase::kRestarting);
        audit(t, AuditAction::kRestartRequested,
              fmt::format("restart attempt {}", attempt_),
              WorkerPhase::kRestartScheduled, last_cause_);
        t.restart_now = true;
      }
      break;
    case WorkerPhase::kRestarting:
      if (boot_deadline_ && now >= *boot_deadline_) {
        const double limit = seconds(options_.boot_timeout);
        count_failed_restart(
            t,
            process_started_
                ? fmt::format("not healthy within boot timeout of {}s", limit)
                : fmt::format("replacement process not reported started "
                              "within boot timeout of {}s",
                              limit),
            kCauseBootTimeout, now);
      }
      break;
    case WorkerPhase::kStarting:
      if (options_.restartable && boot_deadline_ && now >= *boot_deadline_) {
        const std::string reason =
            last_error_.empty()
                ? fmt::format("not healthy within boot timeout of {}s",
                              seconds(options_.boot_timeout))
                : fmt::format("not healthy within boot timeout of {}s: {}",
                              seconds(options_.boot_timeout), last_error_);
        last_error_ = reason;
        last_cause_ = kCauseBootTimeout;
        mark_failed(t, reason, kCauseBootTimeout, now);
      }
      break;
    case WorkerPhase::kHealthy:
      if (stable_at_ && now >= *stable_at_) {
        confirm_restart(
            t, fmt::format("healthy for {}s", seconds(options_.stable_window)));
      }
      break;
    case WorkerPhase::kUnhealthy:
    case WorkerPhase::kFailed:
    case WorkerPhase::kGaveUp:
      break;
  }
  return t;
}

std::optional<TimePoint> RestartPolicy::next_deadline() const {
  switch (phase_) {
    case WorkerPhase::kRestartScheduled:
      return restart_at_;
    case WorkerPhase::kRestarting:
    case WorkerPhase::kStarting:
      return boot_deadline_;
    case WorkerPhase::kHealthy:
      return stable_at_;
    case WorkerPhase::kUnhealthy:
    case WorkerPhase::kFailed:
    case WorkerPhase::kGaveUp:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<TimePoint> RestartPolicy::next_restart_at() const {
  return phase_ == WorkerPhase::kRestartScheduled ? restart_at_ : std::nullopt;
}

std::optional<TimePoint> RestartPolicy::boot_deadline() const {
  return phase_ == WorkerPhase::kStarting || phase_ == WorkerPhase::kRestarting
             ? boot_deadline_
             : std::nullopt;
}

std::optional<TimePoint> RestartPolicy::stable_at() const {
  return phase_ == WorkerPhase::kHealthy ? stable_at_ : std::nullopt;
}

}  // namespace mineru_health
