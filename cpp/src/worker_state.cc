// WorkerState: one mutex guards the record; the loop tick is an atomic so
// that the event loop never waits for a reader; waiters sleep on a condition
// variable that a fatal record signals.
#include "mineru_health/worker_state.h"

#include <fmt/format.h>

#include <utility>

namespace mineru_health {

namespace {

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

std::int64_t ticks(SteadyTime t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             t.time_since_epoch())
      .count();
}

}  // namespace

const char* to_string(HealthPhase phase) {
  switch (phase) {
    case HealthPhase::kStarting:
      return "starting";
    case HealthPhase::kHealthy:
      return "healthy";
    case HealthPhase::kUnhealthy:
      return "unhealthy";
    case HealthPhase::kLoopHung:
      return "loop_hung";
    case HealthPhase::kFatal:
      return "fatal";
  }
  return "unknown";
}

WorkerState::WorkerState(WorkerStateOptions options, WorkerClock clock)
    : options_(options), clock_(std::move(clock)) {}

double WorkerState::unix_now() const {
  if (clock_.unix_seconds) return clock_.unix_seconds();
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool WorkerState::record_fatal_locked(FatalRecord record) {
  ++fatal_count_;
  const bool first = healthy_;
  healthy_ = false;
  if (!first_fatal_) first_fatal_ = record;
  last_fatal_ = std::move(record);
  return first;
}

bool WorkerState::record_fatal(FatalRecord record) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = record_fatal_locked(std::move(record));
  }
  // Notified outside the lock so woken waiters do not block on it at once.
  became_unhealthy_.notify_all();
  return first;
}

void WorkerState::record_task_local() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++task_local_count_;
}

bool WorkerState::record_ambiguous(const FatalRecord& record) {
  bool escalated = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++ambiguous_count_;
    if (options_.error_budget <= 0) return false;
    const SteadyTime now = clock_.steady();
    recent_ambiguous_.push_back(now);
    while (!recent_ambiguous_.empty() &&
           now - recent_ambiguous_.front() > options_.error_budget_window) {
      recent_ambiguous_.pop_front();
    }
    // Only the newest `error_budget` times matter.
    while (recent_ambiguous_.size() >
           static_cast<std::size_t>(options_.error_budget)) {
      recent_ambiguous_.pop_front();
    }
    if (healthy_ && recent_ambiguous_.size() >=
                        static_cast<std::size_t>(options_.error_budget)) {
      FatalRecord budget = record;
      budget.error = fmt::format(
          "{} ambiguous device errors within {:g} s; the last one: {}",
          recent_ambiguous_.size(), seconds(options_.error_budget_window),
          record.error);
      budget.rule_id = kBudgetRule;
      budget.category = kBudgetCategory;
      budget.unix_time = unix_now();
      escalated = record_fatal_locked(std::move(budget));
    }
  }
  if (escalated) became_unhealthy_.notify_all();
  return escalated;
}

void WorkerState::loop_tick() {
  last_tick_ns_.store(ticks(clock_.steady()), std::memory_order_release);
}

// Only engine calls count: a task that is still preparing its pages (a cold
// PDF-render pool, a huge document) is slow, not a stalled engine.
bool WorkerState::busy_locked() const { return engine_calls_in_flight_ > 0; }

void WorkerState::mark_busy_locked(SteadyTime now) {
  if (!busy_locked()) last_progress_ = now;
}

void WorkerState::engine_call_started() {
  std::lock_guard<std::mutex> lock(mutex_);
  mark_busy_locked(clock_.steady());
  ++engine_calls_in_flight_;
}

void WorkerState::engine_call_finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (engine_calls_in_flight_ > 0) --engine_calls_in_flight_;
  last_progress_ = clock_.steady();
}

void WorkerState::progress() {
  std::lock_guard<std::mutex> lock(mutex_);
  last_progress_ = clock_.steady();
}

void WorkerState::set_tasks(const TaskCounts& tasks,
                            const std::string& manager_error) {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_ = tasks;
  manager_error_ = manager_error;
}

void WorkerState::set_service(const ServiceInfo& service) {
  std::lock_guard<std::mutex> lock(mutex_);
  service_ = service;
}

bool WorkerState::healthy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return healthy_;
}

WorkerSnapshot WorkerState::snapshot() {
  // The tick is read before the clock, so a tick racing with this call can
  // never make the lag negative.
  const std::int64_t tick = last_tick_ns_.load(std::memory_order_acquire);
  const SteadyTime now = clock_.steady();
  WorkerSnapshot snap;
  snap.loop_hang_s = seconds(options_.loop_hang);
  snap.stall_s = seconds(options_.stall);
  if (tick != kNoTick) {
    const auto lag = std::chrono::nanoseconds(ticks(now) - tick);
    snap.loop_lag_s = seconds(lag);
    snap.loop_hung = lag > options_.loop_hang;
  }
  bool stalled_now = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (busy_locked()) {
      const auto quiet = now - last_progress_;
      snap.seconds_since_progress = seconds(quiet);
      if (healthy_ && options_.stall.count() > 0 && quiet > options_.stall) {
        stalled_now = record_fatal_locked(FatalRecord{
            fmt::format("no engine progress for {:.0f} s with {} task(s) "
                        "processing and {} engine call(s) in flight",
                        seconds(quiet), tasks_.processing,
                        engine_calls_in_flight_),
            kStallRule, kStallCategory, unix_now(), ""});
      }
    }
    snap.healthy = healthy_;
    snap.fatal_count = fatal_count_;
    snap.task_local_count = task_local_count_;
    snap.ambiguous_count = ambiguous_count_;
    snap.first_fatal = first_fatal_;
    snap.last_fatal = last_fatal_;
    snap.engine_calls_in_flight = engine_calls_in_flight_;
    snap.tasks = tasks_;
    snap.service = service_;
    snap.manager_error = manager_error_;
  }
  if (stalled_now) became_unhealthy_.notify_all();
  if (!snap.healthy) {
    snap.phase = HealthPhase::kFatal;
  } else if (snap.loop_hung) {
    snap.phase = HealthPhase::kLoopHung;
  } else if (!snap.service) {
    snap.phase = HealthPhase::kStarting;
  } else if (!snap.manager_error.empty()) {
    snap.phase = HealthPhase::kUnhealthy;
  } else {
    snap.phase = HealthPhase::kHealthy;
  }
  return snap;
}

void WorkerState::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  healthy_ = true;
  fatal_count_ = task_local_count_ = ambiguous_count_ = 0;
  first_fatal_.reset();
  last_fatal_.reset();
  recent_ambiguous_.clear();
  engine_calls_in_flight_ = 0;
  last_progress_ = SteadyTime{};
  tasks_ = TaskCounts{};
  service_.reset();
  manager_error_.clear();
  last_tick_ns_.store(kNoTick, std::memory_order_relaxed);
}

bool WorkerState::wait_until_unhealthy(
    std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() <= 0) return !healthy_;
  // now() + milliseconds::max() would overflow the clock's nanoseconds; a
  // century is forever for a worker.
  constexpr std::chrono::milliseconds kForever =
      std::chrono::hours(24 * 365 * 100);
  if (timeout > kForever) timeout = kForever;
  // The predicate form absorbs spurious wake-ups and a fatal recorded before
  // the wait began.
  return became_unhealthy_.wait_for(lock, timeout,
                                    [this] { return !healthy_; });
}

}  // namespace mineru_health
