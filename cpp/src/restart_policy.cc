// The per-worker restart state machine. Pure: every input carries `now`, and
// the owner waits until next_deadline() before calling on_tick().
#include "mineru_health/restart_policy.h"

#include <fmt/format.h>

#include <limits>
#include <utility>

namespace mineru_health {
namespace {

void audit(Transition& t, AuditAction action, int attempt,
           const std::string& reason, WorkerPhase from, WorkerPhase to) {
  t.events.push_back(AuditEvent{action, attempt, reason, from, to});
}

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
  }
  return "unknown";
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
  // failure threshold alone.
  if (options_.restartable) boot_deadline_ = now + options_.boot_timeout;
}

void RestartPolicy::enter(Transition& t, WorkerPhase to) {
  phase_ = to;
  t.to = to;
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
    audit(t, AuditAction::kGaveUp, attempt_, reason, from, phase_);
    return;
  }
  restart_at_ = now + backoff_delay(options_, attempt_);
  enter(t, WorkerPhase::kRestartScheduled);
  audit(t, AuditAction::kRestartScheduled, attempt_,
        fmt::format("{} (restart in {}s)", reason,
                    seconds(backoff_delay(options_, attempt_))),
        from, phase_);
}

void RestartPolicy::mark_failed(Transition& t, const std::string& reason,
                                TimePoint now) {
  const WorkerPhase from = phase_;
  enter(t, WorkerPhase::kFailed);
  audit(t, AuditAction::kHealthFailed, attempt_, reason, from, phase_);
  schedule_restart(t, reason, now);
}

void RestartPolicy::count_failed_restart(Transition& t,
                                         const std::string& reason,
                                         TimePoint now) {
  last_error_ = reason;
  consecutive_successes_ = 0;
  boot_deadline_.reset();
  const WorkerPhase from = phase_;
  enter(t, WorkerPhase::kFailed);
  audit(t, AuditAction::kRestartFailed, attempt_, reason, from, phase_);
  ++attempt_;
  schedule_restart(t, reason, now);
}

Transition RestartPolicy::fail_definitively(const std::string& reason,
                                            AuditAction first, TimePoint now) {
  Transition t{phase_, phase_, {}, false};
  last_error_ = reason;
  ++consecutive_failures_;
  consecutive_successes_ = 0;
  switch (phase_) {
    case WorkerPhase::kHealthy:
      // Out of rotation first, then failed without waiting for the threshold.
      enter(t, WorkerPhase::kUnhealthy);
      audit(t, first, attempt_, reason, WorkerPhase::kHealthy, phase_);
      [[fallthrough]];
    case WorkerPhase::kStarting:
    case WorkerPhase::kUnhealthy:
      mark_failed(t, reason, now);
      break;
    case WorkerPhase::kFailed:
    case WorkerPhase::kRestartScheduled:
    case WorkerPhase::kRestarting:
    case WorkerPhase::kGaveUp:
      // Already out of rotation and handled: a second signal must not
      // reschedule (that would thrash).
      break;
  }
  return t;
}

Transition RestartPolicy::on_probe(const ProbeResult& result, TimePoint now) {
  Transition t{phase_, phase_, {}, false};
  if (result.healthy()) {
    consecutive_failures_ = 0;
    ++consecutive_successes_;
    const bool enough = consecutive_successes_ >= options_.healthy_threshold;
    const WorkerPhase from = phase_;
    switch (phase_) {
      case WorkerPhase::kHealthy:
        break;
      case WorkerPhase::kStarting:
        if (enough) {
          boot_deadline_.reset();
          last_error_.clear();
          enter(t, WorkerPhase::kHealthy);
        }
        break;
      case WorkerPhase::kUnhealthy:
      case WorkerPhase::kFailed:
      case WorkerPhase::kGaveUp:
        if (enough) {
          attempt_ = 0;
          last_error_.clear();
          enter(t, WorkerPhase::kHealthy);
          audit(t, AuditAction::kRecovered, 0, result.detail, from, phase_);
        }
        break;
      case WorkerPhase::kRestarting:
        if (enough) {
          const int attempt = attempt_;
          attempt_ = 0;
          boot_deadline_.reset();
          last_error_.clear();
          enter(t, WorkerPhase::kHealthy);
          audit(t, AuditAction::kRestartSucceeded, attempt, "", from, phase_);
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

  if (result.definitive())
    return fail_definitively(result.detail, AuditAction::kEjected, now);

  last_error_ = result.detail;
  consecutive_successes_ = 0;
  ++consecutive_failures_;
  const bool at_threshold = consecutive_failures_ >= options_.failure_threshold;
  switch (phase_) {
    case WorkerPhase::kHealthy:
      enter(t, WorkerPhase::kUnhealthy);
      audit(t, AuditAction::kEjected, attempt_, result.detail,
            WorkerPhase::kHealthy, phase_);
      [[fallthrough]];
    case WorkerPhase::kUnhealthy:
      if (at_threshold) mark_failed(t, result.detail, now);
      break;
    case WorkerPhase::kStarting:
      if (options_.restartable) {
        // A booting local worker is judged by its boot deadline, not by
        // refused connections while it loads.
        if (boot_deadline_ && now >= *boot_deadline_) {
          mark_failed(
              t,
              fmt::format("not healthy within boot timeout: {}", result.detail),
              now);
        }
      } else if (at_threshold) {
        mark_failed(t, result.detail, now);  // remote: stays failed
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

Transition RestartPolicy::on_process_exit(const std::string& reason,
                                          TimePoint now) {
  if (phase_ == WorkerPhase::kRestarting) {
    Transition t{phase_, phase_, {}, false};
    count_failed_restart(t, reason, now);
    return t;
  }
  return fail_definitively(reason, AuditAction::kEjected, now);
}

Transition RestartPolicy::on_passive_failure(const std::string& reason,
                                             TimePoint now) {
  return fail_definitively(reason, AuditAction::kEjected, now);
}

Transition RestartPolicy::on_restart_failed(const std::string& reason,
                                            TimePoint now) {
  Transition t{phase_, phase_, {}, false};
  if (phase_ == WorkerPhase::kRestarting) count_failed_restart(t, reason, now);
  return t;
}

Transition RestartPolicy::on_tick(TimePoint now) {
  Transition t{phase_, phase_, {}, false};
  switch (phase_) {
    case WorkerPhase::kRestartScheduled:
      if (restart_at_ && now >= *restart_at_) {
        restart_at_.reset();
        boot_deadline_ = now + options_.boot_timeout;
        consecutive_successes_ = 0;
        enter(t, WorkerPhase::kRestarting);
        t.restart_now = true;
      }
      break;
    case WorkerPhase::kRestarting:
      if (boot_deadline_ && now >= *boot_deadline_) {
        count_failed_restart(
            t,
            fmt::format("not healthy within boot timeout of {}s",
                        seconds(options_.boot_timeout)),
            now);
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
        mark_failed(t, reason, now);
      }
      break;
    case WorkerPhase::kHealthy:
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
    default:
      return std::nullopt;
  }
}

std::optional<TimePoint> RestartPolicy::next_restart_at() const {
  return phase_ == WorkerPhase::kRestartScheduled ? restart_at_ : std::nullopt;
}

}  // namespace mineru_health
