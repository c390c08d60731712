// Binds worker_state.h: the worker's fatal record, loop lag, engine progress
// and task figures. Type conversion only.
#include <pybind11/chrono.h>
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "mineru_health/worker_state.h"
#include "registers.h"
#include "value_type.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_worker_state(py::module_& m) {
  py::native_enum<HealthPhase>(m, "HealthPhase", "enum.Enum",
                               "What a worker's /health says.")
      .value("STARTING", HealthPhase::kStarting)
      .value("HEALTHY", HealthPhase::kHealthy)
      .value("UNHEALTHY", HealthPhase::kUnhealthy)
      .value("LOOP_HUNG", HealthPhase::kLoopHung)
      .value("FATAL", HealthPhase::kFatal)
      .finalize();
  m.def("to_string", py::overload_cast<HealthPhase>(&to_string),
        py::arg("value"));

  py::class_<FatalRecord> fatal(
      m, "FatalRecord",
      "One fatal failure as recorded by the worker. `error` may quote a "
      "user's document; the rest is safe to publish.");
  fatal
      .def(
          py::init([](std::string error, std::string rule, std::string category,
                      double unix_time, std::string exception_type) {
            return FatalRecord{std::move(error), std::move(rule),
                               std::move(category), unix_time,
                               std::move(exception_type)};
          }),
          py::arg("error"), py::arg("rule"), py::arg("category"),
          py::arg("unix_time"), py::arg("exception_type") = "")
      .def_readonly("error", &FatalRecord::error)
      .def_readonly("rule", &FatalRecord::rule)
      .def_readonly("category", &FatalRecord::category)
      .def_readonly("unix_time", &FatalRecord::unix_time)
      .def_readonly("exception_type", &FatalRecord::exception_type)
      .def_property_readonly("since", &FatalRecord::since,
                             "ISO 8601 UTC time of the failure.")
      .def_property_readonly(
          "cause", &FatalRecord::cause,
          "'engine_dead, rule vllm.engine_dead': safe to show anyone.");
  def_value_type(fatal);

  py::class_<TaskCounts> counts(m, "TaskCounts", "MinerU's task figures.");
  counts
      .def(py::init([](std::int64_t queued, std::int64_t processing,
                       std::int64_t completed, std::int64_t failed) {
             return TaskCounts{queued, processing, completed, failed};
           }),
           py::arg("queued"), py::arg("processing"), py::arg("completed"),
           py::arg("failed"))
      .def_readonly("queued", &TaskCounts::queued)
      .def_readonly("processing", &TaskCounts::processing)
      .def_readonly("completed", &TaskCounts::completed)
      .def_readonly("failed", &TaskCounts::failed);
  def_value_type(counts);

  py::class_<ServiceInfo> service(m, "ServiceInfo",
                                  "The static part of MinerU's /health body.");
  service
      .def(py::init([](std::string version, std::int64_t protocol_version,
                       std::int64_t max_concurrent_requests,
                       std::int64_t processing_window_size,
                       std::int64_t task_retention_seconds,
                       std::int64_t task_cleanup_interval_seconds) {
             return ServiceInfo{
                 std::move(version),      protocol_version,
                 max_concurrent_requests, processing_window_size,
                 task_retention_seconds,  task_cleanup_interval_seconds};
           }),
           py::arg("version"), py::arg("protocol_version"),
           py::arg("max_concurrent_requests"),
           py::arg("processing_window_size"), py::arg("task_retention_seconds"),
           py::arg("task_cleanup_interval_seconds"))
      .def_readonly("version", &ServiceInfo::version)
      .def_readonly("protocol_version", &ServiceInfo::protocol_version)
      .def_readonly("max_concurrent_requests",
                    &ServiceInfo::max_concurrent_requests)
      .def_readonly("processing_window_size",
                    &ServiceInfo::processing_window_size)
      .def_readonly("task_retention_seconds",
                    &ServiceInfo::task_retention_seconds)
      .def_readonly("task_cleanup_interval_seconds",
                    &ServiceInfo::task_cleanup_interval_seconds);
  def_value_type(service);

  py::class_<WorkerStateOptions>(m, "WorkerStateOptions")
      .def(py::init<>())
      .def_readwrite("loop_hang", &WorkerStateOptions::loop_hang)
      .def_readwrite("stall", &WorkerStateOptions::stall)
      .def_readwrite("error_budget", &WorkerStateOptions::error_budget)
      .def_readwrite("error_budget_window",
                     &WorkerStateOptions::error_budget_window)
      .def_readwrite("task_hang", &WorkerStateOptions::task_hang)
      .def_readwrite("remote_wait", &WorkerStateOptions::remote_wait);

  py::class_<RemoteWaitStatus> remote(
      m, "RemoteWaitStatus",
      "One task's remote wait; `reason` is \"\" within its bounds, else "
      "\"silent\" or \"total\".");
  remote.def_readonly("task_id", &RemoteWaitStatus::task_id)
      .def_readonly("server", &RemoteWaitStatus::server)
      .def_readonly("reason", &RemoteWaitStatus::reason)
      .def_readonly("waited_s", &RemoteWaitStatus::waited_s)
      .def_readonly("silent_s", &RemoteWaitStatus::silent_s)
      .def_readonly("left_s", &RemoteWaitStatus::left_s);
  def_value_type(remote);

  py::class_<FatalCount> fatal_count(
      m, "FatalCount", "Fatal records with one rule and category.");
  fatal_count.def_readonly("rule", &FatalCount::rule)
      .def_readonly("category", &FatalCount::category)
      .def_readonly("count", &FatalCount::count);
  def_value_type(fatal_count);

  py::class_<WorkerSnapshot> snapshot(
      m, "WorkerSnapshot",
      "Everything /health reports, at one instant. `phase`: STARTING, "
      "HEALTHY (busy included), UNHEALTHY (MinerU's own task manager says "
      "so), LOOP_HUNG or FATAL.");
  snapshot.def_readonly("phase", &WorkerSnapshot::phase)
      .def_readonly("healthy", &WorkerSnapshot::healthy)
      .def_readonly("fatal_count", &WorkerSnapshot::fatal_count)
      .def_readonly("task_local_count", &WorkerSnapshot::task_local_count)
      .def_readonly("remote_engine_failure_count",
                    &WorkerSnapshot::remote_engine_failure_count)
      .def_readonly("fatal_counts", &WorkerSnapshot::fatal_counts)
      .def_readonly("storage_full_count", &WorkerSnapshot::storage_full_count)
      .def_readonly("remote_silent_count", &WorkerSnapshot::remote_silent_count)
      .def_readonly("remote_too_long_count",
                    &WorkerSnapshot::remote_too_long_count)
      .def_readonly("remote_waits", &WorkerSnapshot::remote_waits)
      .def_readonly("ambiguous_count", &WorkerSnapshot::ambiguous_count)
      .def_readonly("first_fatal", &WorkerSnapshot::first_fatal)
      .def_readonly("last_fatal", &WorkerSnapshot::last_fatal)
      .def_readonly("loop_lag_s", &WorkerSnapshot::loop_lag_s)
      .def_readonly("loop_hung", &WorkerSnapshot::loop_hung)
      .def_readonly("engine_calls_in_flight",
                    &WorkerSnapshot::engine_calls_in_flight)
      .def_readonly("seconds_since_progress",
                    &WorkerSnapshot::seconds_since_progress)
      .def_readonly("tasks", &WorkerSnapshot::tasks)
      .def_readonly("service", &WorkerSnapshot::service)
      .def_readonly("manager_error", &WorkerSnapshot::manager_error)
      .def_readonly("loop_hang_s", &WorkerSnapshot::loop_hang_s)
      .def_readonly("stall_s", &WorkerSnapshot::stall_s);
  def_value_type(snapshot);

  py::class_<WorkerState, std::shared_ptr<WorkerState>>(
      m, "WorkerState", "Thread-safe: every method may be called at once.")
      .def(py::init([](const WorkerStateOptions& options) {
             return std::make_shared<WorkerState>(options);
           }),
           py::arg_v("options", WorkerStateOptions{}, "WorkerStateOptions()"))
      .def("record_fatal", &WorkerState::record_fatal, py::arg("record"))
      .def("record_task_local", &WorkerState::record_task_local,
           py::arg("remote_engine") = false)
      .def("record_storage_full", &WorkerState::record_storage_full)
      .def("record_ambiguous", &WorkerState::record_ambiguous,
           py::arg("record"))
      .def("loop_tick", &WorkerState::loop_tick)
      .def("engine_call_started", &WorkerState::engine_call_started)
      .def("engine_call_finished", &WorkerState::engine_call_finished)
      .def("progress", &WorkerState::progress)
      .def("set_tasks", &WorkerState::set_tasks, py::arg("tasks"),
           py::arg("manager_error"))
      .def("set_service", &WorkerState::set_service, py::arg("service"))
      .def("task_started", &WorkerState::task_started, py::arg("task_id"))
      .def("task_progress", &WorkerState::task_progress, py::arg("task_id"))
      .def("remote_wait_started", &WorkerState::remote_wait_started,
           py::arg("task_id"), py::arg("server") = "")
      .def("remote_asked", &WorkerState::remote_asked, py::arg("task_id"),
           py::arg("server") = "")
      .def("remote_heard", &WorkerState::remote_heard, py::arg("task_id"),
           py::arg("server") = "")
      .def("remote_wait_status", &WorkerState::remote_wait_status,
           py::arg("task_id"))
      .def("take_expired_remote_waits", &WorkerState::take_expired_remote_waits)
      .def("remote_wait_finished", &WorkerState::remote_wait_finished,
           py::arg("task_id"))
      .def("task_finished", &WorkerState::task_finished, py::arg("task_id"))
      .def("take_hung_tasks", &WorkerState::take_hung_tasks)
      .def("healthy", &WorkerState::healthy)
      .def("snapshot", &WorkerState::snapshot)
      .def("reset", &WorkerState::reset)
      // The timeout is converted before the guard releases the GIL, so the
      // wait blocks no other Python thread.
      .def("wait_until_unhealthy", &WorkerState::wait_until_unhealthy,
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace mineru_health::bindings
