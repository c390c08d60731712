// Worker state: the process-wide record of whether this worker's inference
// engine is still usable.
//
//   mineru_health::WorkerState state;
//   state.record_fatal({"EngineDeadError: ...", "vllm-engine-dead",
//   "engine_dead", now}); if (!state.healthy()) { /* answer 503 */ }
//
// Thread-safety: every method may be called from any thread at once.
#ifndef MINERU_HEALTH_WORKER_STATE_H_
#define MINERU_HEALTH_WORKER_STATE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace mineru_health {

struct FatalRecord {
  std::string error;  // short description, e.g. "EngineDeadError: ..."
  std::string rule_id;
  std::string category;
  double unix_time = 0;  // seconds since the epoch, as given by the caller
};

struct WorkerSnapshot {
  bool healthy = true;
  std::uint64_t fatal_count = 0;
  std::uint64_t task_local_count = 0;
  std::optional<FatalRecord> first_fatal;
  std::optional<FatalRecord> last_fatal;
};

class WorkerState {
 public:
  // Records a fatal failure; the first one is kept until reset().
  void record_fatal(FatalRecord record);
  void record_task_local();
  bool healthy() const;
  WorkerSnapshot snapshot() const;
  // Back to healthy with zero counters (a test, or an engine rebuilt in place).
  void reset();
  // Blocks until the worker is unhealthy or `timeout` passes; true if
  // unhealthy. Callers from Python must release the GIL around it.
  bool wait_until_unhealthy(std::chrono::milliseconds timeout) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable became_unhealthy_;
  WorkerSnapshot state_;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_WORKER_STATE_H_
