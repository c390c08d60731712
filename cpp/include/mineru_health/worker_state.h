// Worker state: the process-wide record of whether this worker can still
// serve — its fatal record, event-loop lag, engine progress and the task
// figures MinerU's /health reports — kept natively so that the health
// endpoint thread can answer without the GIL or the event loop.
//
//   mineru_health::WorkerState state(options);
//   state.loop_tick();                       // event loop, every 100 ms
//   state.engine_call_started(); ... state.engine_call_finished();
//   mineru_health::WorkerSnapshot now = state.snapshot();
//   if (now.phase == mineru_health::HealthPhase::kLoopHung) { /* 503 */ }
//
// Busy is not broken: a loop blocked for less than `loop_hang` only shows as
// lag; an engine counts as stalled only when engine calls are in flight and
// none of them (nor any single engine request) completed for `stall`. A fatal
// record is sticky until reset().
//
// Thread-safety: every method may be called from any thread at once.
#ifndef MINERU_HEALTH_WORKER_STATE_H_
#define MINERU_HEALTH_WORKER_STATE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mineru_health {

// One fatal failure. `exception_type` and the rule are safe to publish;
// `error` may quote a user's document and is shown only where the operator
// opted in (see health_server.h).
struct FatalRecord {
  std::string error;           // "Type: message", or why (stall, budget)
  std::string rule;            // e.g. "vllm.engine_dead", "watchdog.stall"
  std::string category;        // e.g. "engine_dead", "engine_stalled"
  double unix_time = 0;        // seconds since the epoch
  std::string exception_type;  // "module.Type", "" when not an exception

  // unix_time in ISO 8601, UTC, to the microsecond:
  // "2023-11-14T22:13:20.250000+00:00".
  std::string since() const;
  // "engine_dead, rule vllm.engine_dead": the cause, safe to show anyone.
  std::string cause() const;
};

// MinerU's task figures, pushed from the event loop.
struct TaskCounts {
  std::int64_t queued = 0;
  std::int64_t processing = 0;
  std::int64_t completed = 0;
  std::int64_t failed = 0;
};

// The static part of MinerU's /health body, reported once the task manager
// has started.
struct ServiceInfo {
  std::string version;
  std::int64_t protocol_version = 0;
  std::int64_t max_concurrent_requests = 0;
  std::int64_t processing_window_size = 1;
  std::int64_t task_retention_seconds = 0;
  std::int64_t task_cleanup_interval_seconds = 0;
};

enum class HealthPhase {
  kStarting,   // the task manager has not reported in yet
  kHealthy,    // serving (possibly busy: see loop_lag_s)
  kUnhealthy,  // MinerU's own task manager says so (dispatcher died...)
  kLoopHung,   // the event loop has been blocked longer than loop_hang
  kFatal,      // the engine is dead, stalled or over its error budget
};

const char* to_string(HealthPhase phase);

using SteadyTime = std::chrono::steady_clock::time_point;

struct WorkerClock {
  std::function<SteadyTime()> steady = std::chrono::steady_clock::now;
  std::function<double()> unix_seconds;  // null: the system clock
};

struct WorkerStateOptions {
  std::chrono::nanoseconds loop_hang = std::chrono::seconds(60);
  // Zero disables the stall watchdog.
  std::chrono::nanoseconds stall = std::chrono::seconds(300);
  // `error_budget` ambiguous errors within `error_budget_window` make the
  // worker fatal (category "error_budget"); zero disables escalation.
  int error_budget = 3;
  std::chrono::nanoseconds error_budget_window = std::chrono::seconds(60);
  // A task with no progress of its own for `task_hang` is hung (its parse
  // waits on something that never ends, in or out of engine calls); zero
  // disables the task watchdog.
  std::chrono::nanoseconds task_hang = std::chrono::seconds(900);
  // A remote wait (see remote_wait_started) lasting longer than
  // `remote_wait` has failed its task, whatever the server sends meanwhile;
  // zero disables this bound. A remote wait whose server sent nothing for
  // `task_hang` (when set) has failed its task too.
  std::chrono::nanoseconds remote_wait = std::chrono::seconds(2400);
};

// Categories and rule ids recorded by the state itself.
inline constexpr const char* kStallRule = "watchdog.engine_stalled";
inline constexpr const char* kStallCategory = "engine_stalled";
inline constexpr const char* kBudgetRule = "watchdog.error_budget";
inline constexpr const char* kBudgetCategory = "error_budget";
// Every task being processed is hung: the worker is as good as stalled.
inline constexpr const char* kTasksHungRule = "watchdog.tasks_hung";

// Why a remote wait failed its task (RemoteWaitStatus::reason).
inline constexpr const char* kRemoteSilent = "silent";  // nothing for task_hang
inline constexpr const char* kRemoteTooLong = "total";  // past remote_wait

// One task's remote wait at one instant.
struct RemoteWaitStatus {
  std::string task_id;
  std::string server;  // host:port the task waits on, "" until named
  // "" while within both bounds, else kRemoteSilent or kRemoteTooLong.
  std::string reason;
  double waited_s = 0;  // since the outermost remote wait began
  double silent_s = 0;  // since the server's last byte or the last request sent
  // Seconds until the nearer bound; null when neither bound is set.
  std::optional<double> left_s;
};

// How many fatal records carried one rule and category (the worker's
// fatal-errors metric, read at scrape time).
struct FatalCount {
  std::string rule;
  std::string category;
  std::uint64_t count = 0;
};

// Everything /health reports, taken at one instant.
struct WorkerSnapshot {
  HealthPhase phase = HealthPhase::kStarting;
  bool healthy = true;  // no fatal record (busy and hung loops are healthy)
  std::uint64_t fatal_count = 0;
  std::uint64_t task_local_count = 0;
  std::uint64_t remote_engine_failure_count = 0;  // of task_local_count
  std::uint64_t storage_full_count = 0;  // submissions refused: disk full
  // Tasks failed by a remote wait's bounds (of task_local_count and
  // remote_engine_failure_count), by reason; and remote waits in progress.
  std::uint64_t remote_silent_count = 0;
  std::uint64_t remote_too_long_count = 0;
  std::int64_t remote_waits = 0;
  std::uint64_t ambiguous_count = 0;
  std::vector<FatalCount> fatal_counts;  // by rule and category, in that order
  std::optional<FatalRecord> first_fatal;
  std::optional<FatalRecord> last_fatal;
  std::optional<double> loop_lag_s;  // null before the loop's first tick
  bool loop_hung = false;
  std::int64_t engine_calls_in_flight = 0;
  // Seconds since the last completed engine call or request while engine
  // calls are in flight; null while none is.
  std::optional<double> seconds_since_progress;
  TaskCounts tasks;
  std::optional<ServiceInfo> service;
  std::string manager_error;  // MinerU's own reason, "" when it is fine
  double loop_hang_s = 0;
  double stall_s = 0;
};

class WorkerState {
 public:
  explicit WorkerState(WorkerStateOptions options = {}, WorkerClock clock = {});
  ~WorkerState();
  WorkerState(const WorkerState&) = delete;
  WorkerState& operator=(const WorkerState&) = delete;

  // Records a fatal failure; the first one is kept until reset(). Returns
  // true when this record made the worker unhealthy.
  bool record_fatal(FatalRecord record);
  // A task-local failure; `remote_engine`: a remote engine's (counted apart).
  void record_task_local(bool remote_engine = false);
  // A submission refused because the disk or quota where it is stored is full
  // (a resource, not the engine: the worker stays healthy).
  void record_storage_full();
  // An ambiguous device error (a standalone out-of-memory...): task-local
  // unless it is the error_budget-th within the window, which records a
  // fatal failure. Returns true when it did.
  bool record_ambiguous(const FatalRecord& record);

  // The event loop is alive: called from a callback it runs every 100 ms.
  // Lock-free, so the loop never waits on a reader.
  void loop_tick();
  // Engine calls (a batch or window of pages) and finer progress (one
  // request answered, a task finished).
  void engine_call_started();
  void engine_call_finished();
  void progress();
  // From the event loop: MinerU's figures and its own health verdict.
  void set_tasks(const TaskCounts& tasks, const std::string& manager_error);
  void set_service(const ServiceInfo& service);

  // The task watchdog. A task is tracked from task_started() to
  // task_finished(); its own progress (an engine call or request made for it,
  // a page window) is task_progress(id). take_hung_tasks() returns the tasks
  // with no progress for `task_hang`, each once; when every tracked task is
  // hung it also records a fatal failure (kTasksHungRule, engine_stalled).
  //
  // A task waiting on a remote engine (an http client, a user's server_url)
  // is between remote_wait_started(id) and remote_wait_finished(id): it is
  // never hung meanwhile, since no restart of this worker would make a remote
  // server answer (the client's own timeout bounds the wait), nor is every
  // task hung while it waits (the stall watchdog still sees a stalled engine
  // call). The wait's end is the task's progress.
  //
  // A remote wait has bounds of its own (issue 32): its server sending
  // nothing (no byte heard, see remote_heard) for `task_hang` after a request
  // (remote_asked) when that is set, and the outermost wait lasting
  // `remote_wait`. Past either, the
  // wait has failed its task alone: take_expired_remote_waits() returns it
  // once (counted task-local, remote engine), never a fatal record.
  // `server` ("host:port") names the server for the task's error; a later
  // non-empty name replaces it.
  void task_started(const std::string& task_id);
  void task_progress(const std::string& task_id);
  void remote_wait_started(const std::string& task_id,
                           const std::string& server = "");
  void remote_wait_finished(const std::string& task_id);
  // A request was sent to the task's server (each try): the server owes an
  // answer, and its silence counts from now. Before a wait's first request
  // (the task waits on a lock, or works locally) only `remote_wait` bounds it.
  void remote_asked(const std::string& task_id, const std::string& server = "");
  // Bytes (a response's head or a chunk of its body) came from the task's
  // server: its silence starts again.
  void remote_heard(const std::string& task_id, const std::string& server = "");
  void task_finished(const std::string& task_id);
  std::vector<std::string> take_hung_tasks();
  // The task's remote wait now; null when the task is not in one. A wait
  // found past a bound is reported here (counted, and never returned by
  // take_expired_remote_waits): its caller ends the wait.
  std::optional<RemoteWaitStatus> remote_wait_status(
      const std::string& task_id);
  // The remote waits past a bound not yet reported, each reported once.
  std::vector<RemoteWaitStatus> take_expired_remote_waits();

  // healthy(), snapshot() and wait_until_unhealthy() evaluate the stall
  // watchdog at this instant: a stall records a fatal failure whichever of
  // them notices it first, so no caller depends on another one probing.
  bool healthy();
  // A consistent copy of everything, the loop lag included.
  WorkerSnapshot snapshot();
  // Back to starting with zero counters (a test, or an engine rebuilt).
  void reset();
  // Blocks until the worker is unhealthy or `timeout` passes; true if
  // unhealthy. Notices a stall within a second even if nothing else calls
  // in. Callers from Python must release the GIL around it.
  bool wait_until_unhealthy(std::chrono::milliseconds timeout);

 private:
  struct Impl;  // the guarded state (worker_state.cc), lock-checked by clang
  std::unique_ptr<Impl> impl_;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_WORKER_STATE_H_
