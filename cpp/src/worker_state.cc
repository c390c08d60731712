// WorkerState: one annotated mutex guards the record (clang's
// -Wthread-safety proves every access holds it); the loop tick is an atomic
// so that the event loop never waits for a reader; waiters sleep on a
// condition variable that a fatal record signals.
#include "mineru_health/worker_state.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <limits>
#include <map>
#include <utility>

#include "thread_annotations.h"

namespace mineru_health {

namespace {

using internal::Mutex;
using internal::MutexLock;

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

std::int64_t ticks(SteadyTime t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             t.time_since_epoch())
      .count();
}

constexpr std::int64_t kNoTick = std::numeric_limits<std::int64_t>::min();

// How late wait_until_unhealthy() may notice a stall that nobody else
// probes: small next to the stall limit (300 s by default).
constexpr std::chrono::seconds kStallCheckPeriod(1);

}  // namespace

std::string FatalRecord::since() const {
  const double whole = std::floor(unix_time);
  const auto micros = static_cast<long>(std::lround((unix_time - whole) * 1e6));
  const std::time_t t = static_cast<std::time_t>(whole);
  std::tm tm{};
  gmtime_r(&t, &tm);
  // The shape of Python's datetime.isoformat() for an aware UTC time, with
  // the microseconds always written.
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06d}+00:00", tm,
                     std::min(micros, 999999L));
}

std::string FatalRecord::cause() const {
  return fmt::format("{}, rule {}", category, rule);
}

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

struct WorkerState::Impl {
  Impl(const WorkerStateOptions& o, WorkerClock c)
      : options(o), clock(std::move(c)) {}

  double unix_now() const {
    if (clock.unix_seconds) return clock.unix_seconds();
    return std::chrono::duration<double>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // Only engine calls count: a task that is still preparing its pages (a
  // cold PDF-render pool, a huge document) is slow, not a stalled engine.
  bool busy() const REQUIRES(mu) { return engine_calls_in_flight > 0; }

  // Work begins after idling: an idle worker's old progress must not count
  // against the next engine call.
  void mark_busy(SteadyTime now) REQUIRES(mu) {
    if (!busy()) last_progress = now;
  }

  bool record_fatal(FatalRecord record) REQUIRES(mu) {
    ++fatal_count;
    ++fatal_by_rule[{record.rule, record.category}];
    const bool first = healthy;
    healthy = false;
    if (!first_fatal) first_fatal = record;
    last_fatal = std::move(record);
    return first;
  }

  // The stall watchdog, evaluated by every reader of the verdict (healthy(),
  // wait_until_unhealthy(), snapshot()) so that a stall is recorded even when
  // nobody asks for a snapshot. Returns true when it made the worker
  // unhealthy, so the caller wakes the waiters.
  bool check_stall(SteadyTime now) REQUIRES(mu) {
    if (!healthy || !busy() || options.stall.count() <= 0) return false;
    const auto quiet = now - last_progress;
    if (quiet <= options.stall) return false;
    return record_fatal(FatalRecord{
        fmt::format("no engine progress for {:.0f} s with {} task(s) "
                    "processing and {} engine call(s) in flight",
                    seconds(quiet), tasks.processing, engine_calls_in_flight),
        kStallRule, kStallCategory, unix_now(), ""});
  }

  void clear() REQUIRES(mu) {
    healthy = true;
    fatal_count = task_local_count = remote_failure_count = ambiguous_count = 0;
    storage_full_count = remote_silent_count = remote_too_long_count = 0;
    fatal_by_rule.clear();
    first_fatal.reset();
    last_fatal.reset();
    recent_ambiguous.clear();
    engine_calls_in_flight = 0;
    last_progress = SteadyTime{};
    tasks = TaskCounts{};
    service.reset();
    manager_error.clear();
    running.clear();
    last_tick_ns.store(kNoTick, std::memory_order_release);
  }

  const WorkerStateOptions options;  // never changes: read without the lock
  const WorkerClock clock;

  // Nanoseconds since the steady clock's epoch of the loop's last tick.
  std::atomic<std::int64_t> last_tick_ns{kNoTick};

  mutable Mutex mu;
  mutable std::condition_variable_any became_unhealthy;
  bool healthy GUARDED_BY(mu) = true;
  std::uint64_t fatal_count GUARDED_BY(mu) = 0;
  std::map<std::pair<std::string, std::string>, std::uint64_t> fatal_by_rule
      GUARDED_BY(mu);
  std::uint64_t remote_failure_count GUARDED_BY(mu) = 0;
  std::uint64_t storage_full_count GUARDED_BY(mu) = 0;
  std::uint64_t remote_silent_count GUARDED_BY(mu) = 0;
  std::uint64_t remote_too_long_count GUARDED_BY(mu) = 0;
  std::uint64_t task_local_count GUARDED_BY(mu) = 0;
  std::uint64_t ambiguous_count GUARDED_BY(mu) = 0;
  std::optional<FatalRecord> first_fatal GUARDED_BY(mu);
  std::optional<FatalRecord> last_fatal GUARDED_BY(mu);
  std::deque<SteadyTime> recent_ambiguous GUARDED_BY(mu);
  std::int64_t engine_calls_in_flight GUARDED_BY(mu) = 0;
  // Last completed engine call or request, or when work began after idling.
  SteadyTime last_progress GUARDED_BY(mu){};
  TaskCounts tasks GUARDED_BY(mu);
  std::optional<ServiceInfo> service GUARDED_BY(mu);
  std::string manager_error GUARDED_BY(mu);
  struct TrackedTask {
    SteadyTime last_progress;
    bool hung = false;             // reported by take_hung_tasks()
    int remote_waits = 0;          // nested remote waits in progress
    SteadyTime remote_since{};     // the outermost remote wait's start
    SteadyTime remote_heard{};     // the server's last byte, or remote_since
    std::string server{};          // host:port, "" until named
    bool remote_reported = false;  // by take_expired_remote_waits()
    bool remote_asked = false;     // a request was sent in this wait
  };

  // Counts a remote wait that failed its task, once: the remote server's
  // failure, never this worker's.
  void report(TrackedTask& task, const RemoteWaitStatus& status) REQUIRES(mu) {
    if (task.remote_reported) return;
    task.remote_reported = true;
    ++task_local_count;
    ++remote_failure_count;
    ++(status.reason == kRemoteSilent ? remote_silent_count
                                      : remote_too_long_count);
  }

  // The task's remote wait at `now` (the task is in one).
  RemoteWaitStatus remote_status(const std::string& id, const TrackedTask& task,
                                 SteadyTime now) const REQUIRES(mu) {
    RemoteWaitStatus status{
        id,
        task.server,
        "",
        seconds(now - task.remote_since),
        task.remote_asked ? seconds(now - task.remote_heard) : 0.0,
        std::nullopt};
    const auto left = [&status](double bound, double used) {
      const double rest = bound - used;
      status.left_s = status.left_s ? std::min(*status.left_s, rest) : rest;
    };
    if (options.task_hang.count() > 0 && task.remote_asked) {
      left(seconds(options.task_hang), status.silent_s);
      if (now - task.remote_heard > options.task_hang)
        status.reason = kRemoteSilent;
    }
    if (options.remote_wait.count() > 0) {
      left(seconds(options.remote_wait), status.waited_s);
      if (now - task.remote_since > options.remote_wait)
        status.reason = kRemoteTooLong;
    }
    return status;
  }
  std::map<std::string, TrackedTask> running GUARDED_BY(mu);
};

WorkerState::WorkerState(WorkerStateOptions options, WorkerClock clock)
    : impl_(std::make_unique<Impl>(options, std::move(clock))) {}

WorkerState::~WorkerState() = default;

bool WorkerState::record_fatal(FatalRecord record) {
  bool first = false;
  {
    MutexLock lock(impl_->mu);
    first = impl_->record_fatal(std::move(record));
  }
  // Notified outside the lock so woken waiters do not block on it at once.
  impl_->became_unhealthy.notify_all();
  return first;
}

void WorkerState::record_task_local(bool remote_engine) {
  MutexLock lock(impl_->mu);
  ++impl_->task_local_count;
  if (remote_engine) ++impl_->remote_failure_count;
}

void WorkerState::record_storage_full() {
  MutexLock lock(impl_->mu);
  ++impl_->storage_full_count;
}

bool WorkerState::record_ambiguous(const FatalRecord& record) {
  Impl& s = *impl_;
  bool escalated = false;
  {
    MutexLock lock(s.mu);
    ++s.ambiguous_count;
    if (s.options.error_budget <= 0) return false;
    const SteadyTime now = s.clock.steady();
    s.recent_ambiguous.push_back(now);
    while (!s.recent_ambiguous.empty() &&
           now - s.recent_ambiguous.front() > s.options.error_budget_window) {
      s.recent_ambiguous.pop_front();
    }
    // Only the newest `error_budget` times matter.
    const auto budget = static_cast<std::size_t>(s.options.error_budget);
    while (s.recent_ambiguous.size() > budget) s.recent_ambiguous.pop_front();
    if (s.healthy && s.recent_ambiguous.size() >= budget) {
      FatalRecord over = record;
      over.error = fmt::format(
          "{} ambiguous device errors within {:g} s; the last one: {}",
          s.recent_ambiguous.size(), seconds(s.options.error_budget_window),
          record.error);
      over.rule = kBudgetRule;
      over.category = kBudgetCategory;
      over.unix_time = s.unix_now();
      escalated = s.record_fatal(std::move(over));
    }
  }
  if (escalated) s.became_unhealthy.notify_all();
  return escalated;
}

void WorkerState::loop_tick() {
  impl_->last_tick_ns.store(ticks(impl_->clock.steady()),
                            std::memory_order_release);
}

void WorkerState::engine_call_started() {
  MutexLock lock(impl_->mu);
  impl_->mark_busy(impl_->clock.steady());
  ++impl_->engine_calls_in_flight;
}

void WorkerState::engine_call_finished() {
  MutexLock lock(impl_->mu);
  if (impl_->engine_calls_in_flight > 0) --impl_->engine_calls_in_flight;
  impl_->last_progress = impl_->clock.steady();
}

void WorkerState::progress() {
  MutexLock lock(impl_->mu);
  impl_->last_progress = impl_->clock.steady();
}

void WorkerState::set_tasks(const TaskCounts& tasks,
                            const std::string& manager_error) {
  MutexLock lock(impl_->mu);
  impl_->tasks = tasks;
  impl_->manager_error = manager_error;
}

void WorkerState::set_service(const ServiceInfo& service) {
  MutexLock lock(impl_->mu);
  impl_->service = service;
}

void WorkerState::task_started(const std::string& task_id) {
  MutexLock lock(impl_->mu);
  impl_->running[task_id] = Impl::TrackedTask{impl_->clock.steady()};
}

void WorkerState::task_progress(const std::string& task_id) {
  MutexLock lock(impl_->mu);
  const auto found = impl_->running.find(task_id);
  if (found != impl_->running.end()) {
    found->second.last_progress = impl_->clock.steady();
  }
}

void WorkerState::remote_wait_started(const std::string& task_id,
                                      const std::string& server) {
  MutexLock lock(impl_->mu);
  const auto found = impl_->running.find(task_id);
  if (found == impl_->running.end()) return;
  Impl::TrackedTask& task = found->second;
  if (task.remote_waits++ == 0) {
    task.remote_since = task.remote_heard = impl_->clock.steady();
    task.remote_reported = false;
    task.remote_asked = false;
  }
  if (!server.empty()) task.server = server;
}

void WorkerState::remote_heard(const std::string& task_id,
                               const std::string& server) {
  MutexLock lock(impl_->mu);
  const auto found = impl_->running.find(task_id);
  if (found == impl_->running.end() || found->second.remote_waits == 0) return;
  found->second.remote_asked = true;  // what it sent answers a request
  found->second.remote_heard = impl_->clock.steady();
  if (!server.empty()) found->second.server = server;
}

void WorkerState::remote_asked(const std::string& task_id,
                               const std::string& server) {
  MutexLock lock(impl_->mu);
  const auto found = impl_->running.find(task_id);
  if (found == impl_->running.end() || found->second.remote_waits == 0) return;
  found->second.remote_asked = true;
  found->second.remote_heard = impl_->clock.steady();
  if (!server.empty()) found->second.server = server;
}

std::optional<RemoteWaitStatus> WorkerState::remote_wait_status(
    const std::string& task_id) {
  MutexLock lock(impl_->mu);
  const auto found = impl_->running.find(task_id);
  if (found == impl_->running.end() || found->second.remote_waits == 0) {
    return std::nullopt;
  }
  RemoteWaitStatus status =
      impl_->remote_status(task_id, found->second, impl_->clock.steady());
  if (!status.reason.empty()) impl_->report(found->second, status);
  return status;
}

std::vector<RemoteWaitStatus> WorkerState::take_expired_remote_waits() {
  Impl& s = *impl_;
  std::vector<RemoteWaitStatus> expired;
  MutexLock lock(s.mu);
  const SteadyTime now = s.clock.steady();
  for (auto& [id, task] : s.running) {
    if (task.remote_waits == 0 || task.remote_reported) continue;
    RemoteWaitStatus status = s.remote_status(id, task, now);
    if (status.reason.empty()) continue;
    s.report(task, status);
    expired.push_back(std::move(status));
  }
  return expired;
}

void WorkerState::remote_wait_finished(const std::string& task_id) {
  MutexLock lock(impl_->mu);
  const auto found = impl_->running.find(task_id);
  if (found == impl_->running.end()) return;
  Impl::TrackedTask& task = found->second;
  if (task.remote_waits > 0) --task.remote_waits;
  task.last_progress = impl_->clock.steady();
}

void WorkerState::task_finished(const std::string& task_id) {
  MutexLock lock(impl_->mu);
  impl_->running.erase(task_id);
}

std::vector<std::string> WorkerState::take_hung_tasks() {
  Impl& s = *impl_;
  std::vector<std::string> hung;
  bool all_hung_now = false;
  {
    MutexLock lock(s.mu);
    if (s.options.task_hang.count() <= 0 || s.running.empty()) return hung;
    const SteadyTime now = s.clock.steady();
    bool all_hung = true;
    for (auto& [id, task] : s.running) {
      if (task.remote_waits > 0) {  // a remote server's wait, not ours
        all_hung = false;  // and a task that may yet end: not "every task hung"
        continue;
      }
      if (!task.hung && now - task.last_progress > s.options.task_hang) {
        task.hung = true;
        hung.push_back(id);
      }
      all_hung = all_hung && task.hung;
    }
    if (all_hung && !hung.empty() && s.healthy) {
      all_hung_now = s.record_fatal(FatalRecord{
          fmt::format("all {} task(s) being processed made no progress for "
                      "{:.0f} s",
                      s.running.size(), seconds(s.options.task_hang)),
          kTasksHungRule, kStallCategory, s.unix_now(), ""});
    }
  }
  if (all_hung_now) s.became_unhealthy.notify_all();
  return hung;
}

bool WorkerState::healthy() {
  Impl& s = *impl_;
  bool stalled_now = false;
  bool healthy = false;
  {
    MutexLock lock(s.mu);
    stalled_now = s.check_stall(s.clock.steady());
    healthy = s.healthy;
  }
  if (stalled_now) s.became_unhealthy.notify_all();
  return healthy;
}

WorkerSnapshot WorkerState::snapshot() {
  Impl& s = *impl_;
  // The tick is read before the clock, so a tick racing with this call can
  // never make the lag negative.
  const std::int64_t tick = s.last_tick_ns.load(std::memory_order_acquire);
  const SteadyTime now = s.clock.steady();
  WorkerSnapshot snap;
  snap.loop_hang_s = seconds(s.options.loop_hang);
  snap.stall_s = seconds(s.options.stall);
  if (tick != kNoTick) {
    const auto lag = std::chrono::nanoseconds(ticks(now) - tick);
    snap.loop_lag_s = seconds(lag);
    snap.loop_hung = lag > s.options.loop_hang;
  }
  bool stalled_now = false;
  {
    MutexLock lock(s.mu);
    stalled_now = s.check_stall(now);
    if (s.busy()) snap.seconds_since_progress = seconds(now - s.last_progress);
    snap.healthy = s.healthy;
    snap.fatal_count = s.fatal_count;
    snap.task_local_count = s.task_local_count;
    snap.remote_engine_failure_count = s.remote_failure_count;
    snap.storage_full_count = s.storage_full_count;
    snap.remote_silent_count = s.remote_silent_count;
    snap.remote_too_long_count = s.remote_too_long_count;
    for (const auto& [id, task] : s.running) {
      if (task.remote_waits > 0) ++snap.remote_waits;
    }
    snap.fatal_counts.reserve(s.fatal_by_rule.size());
    for (const auto& [key, count] : s.fatal_by_rule) {
      snap.fatal_counts.push_back(FatalCount{key.first, key.second, count});
    }
    snap.ambiguous_count = s.ambiguous_count;
    snap.first_fatal = s.first_fatal;
    snap.last_fatal = s.last_fatal;
    snap.engine_calls_in_flight = s.engine_calls_in_flight;
    snap.tasks = s.tasks;
    snap.service = s.service;
    snap.manager_error = s.manager_error;
  }
  if (stalled_now) s.became_unhealthy.notify_all();
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
  MutexLock lock(impl_->mu);
  impl_->clear();
}

bool WorkerState::wait_until_unhealthy(std::chrono::milliseconds timeout) {
  Impl& s = *impl_;
  MutexLock lock(s.mu);
  // Other waiters are woken under the lock: they wait for `mu` a moment.
  if (s.check_stall(s.clock.steady())) s.became_unhealthy.notify_all();
  if (timeout.count() <= 0) return !s.healthy;
  // now() + milliseconds::max() would overflow the clock's nanoseconds; a
  // century is forever for a worker.
  constexpr std::chrono::milliseconds kForever =
      std::chrono::hours(24 * 365 * 100);
  if (timeout > kForever) timeout = kForever;
  const auto until = std::chrono::steady_clock::now() + timeout;
  // The loop form absorbs spurious wake-ups and a fatal recorded before the
  // wait began; the wait releases and retakes `mu`, as the analysis assumes.
  // Nothing signals a stall (it is the absence of progress), so the wait
  // wakes every kStallCheckPeriod to look for one itself.
  while (s.healthy) {
    const auto wake =
        std::min(until, std::chrono::steady_clock::now() + kStallCheckPeriod);
    s.became_unhealthy.wait_until(s.mu, wake);
    if (s.check_stall(s.clock.steady())) s.became_unhealthy.notify_all();
    if (std::chrono::steady_clock::now() >= until) return !s.healthy;
  }
  return true;
}

}  // namespace mineru_health
