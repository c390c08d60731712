// WorkerState: one mutex guards the snapshot; waiters sleep on a condition
// variable that record_fatal() signals.
#include "mineru_health/worker_state.h"

#include <utility>

namespace mineru_health {

void WorkerState::record_fatal(FatalRecord record) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++state_.fatal_count;
    state_.healthy = false;
    if (!state_.first_fatal) state_.first_fatal = record;
    state_.last_fatal = std::move(record);
  }
  // Notified outside the lock so woken waiters do not block on it at once.
  became_unhealthy_.notify_all();
}

void WorkerState::record_task_local() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++state_.task_local_count;
}

bool WorkerState::healthy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_.healthy;
}

WorkerSnapshot WorkerState::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

void WorkerState::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = WorkerSnapshot{};
}

bool WorkerState::wait_until_unhealthy(
    std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() <= 0) return !state_.healthy;
  // now() + milliseconds::max() would overflow the clock's nanoseconds; a
  // century is forever for a worker.
  constexpr std::chrono::milliseconds kForever =
      std::chrono::hours(24 * 365 * 100);
  if (timeout > kForever) timeout = kForever;
  // The predicate form absorbs spurious wake-ups and a fatal recorded before
  // the wait began.
  return became_unhealthy_.wait_for(lock, timeout,
                                    [this] { return !state_.healthy; });
}

}  // namespace mineru_health
