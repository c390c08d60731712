// Bindings for restart_policy.h (phases, audit records) and poller.h.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mineru_health/poller.h"
#include "mineru_health/restart_policy.h"
#include "mineru_health/worker_counters.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_poller(py::module_& m) {
  py::native_enum<WorkerPhase>(m, "WorkerPhase", "enum.Enum",
                               "Where a worker is in the policy.")
      .value("STARTING", WorkerPhase::kStarting)
      .value("HEALTHY", WorkerPhase::kHealthy)
      .value("UNHEALTHY", WorkerPhase::kUnhealthy)
      .value("FAILED", WorkerPhase::kFailed)
      .value("RESTART_SCHEDULED", WorkerPhase::kRestartScheduled)
      .value("RESTARTING", WorkerPhase::kRestarting)
      .value("GAVE_UP", WorkerPhase::kGaveUp)
      .finalize();
  m.def("to_string", py::overload_cast<WorkerPhase>(&to_string),
        py::arg("value"));

  py::native_enum<AuditAction>(m, "AuditAction", "enum.Enum",
                               "What an audit record reports.")
      .value("HEALTH_FAILED", AuditAction::kHealthFailed)
      .value("RESTART_SCHEDULED", AuditAction::kRestartScheduled)
      .value("RESTART_SUCCEEDED", AuditAction::kRestartSucceeded)
      .value("RESTART_FAILED", AuditAction::kRestartFailed)
      .value("GAVE_UP", AuditAction::kGaveUp)
      .value("RECOVERED", AuditAction::kRecovered)
      .value("EJECTED", AuditAction::kEjected)
      .value("ADMITTED", AuditAction::kAdmitted)
      .value("EJECTION_SUPPRESSED", AuditAction::kEjectionSuppressed)
      .value("RESTART_REQUESTED", AuditAction::kRestartRequested)
      .finalize();
  m.def("to_string", py::overload_cast<AuditAction>(&to_string),
        py::arg("value"));

  // `from` is a Python keyword, hence from_phase / to_phase.
  py::class_<AuditEvent>(m, "AuditEvent",
                         "One policy transition worth recording.")
      .def_readonly("action", &AuditEvent::action)
      .def_readonly("attempt", &AuditEvent::attempt)
      .def_readonly("reason", &AuditEvent::reason)
      .def_readonly("from_phase", &AuditEvent::from)
      .def_readonly("to_phase", &AuditEvent::to)
      .def_readonly("cause", &AuditEvent::cause);
  m.def("failure_cause_names", &failure_cause_names);

  py::class_<Target>(m, "Target",
                     "A worker to probe: id, base URL, whether we may restart "
                     "it, and its native health URL if known.")
      .def(py::init<std::string, std::string, bool, std::string>(),
           py::arg("id"), py::arg("url") = "", py::arg("restartable") = false,
           py::arg("health_url") = "")
      .def_readwrite("id", &Target::id)
      .def_readwrite("url", &Target::url)
      .def_readwrite("restartable", &Target::restartable)
      .def_readwrite("health_url", &Target::health_url);

  py::native_enum<PollerEventKind>(m, "PollerEventKind", "enum.Enum",
                                   "What a PollerEvent carries.")
      .value("PROBE", PollerEventKind::kProbe)
      .value("AUDIT", PollerEventKind::kAudit)
      .value("RESTART_REQUESTED", PollerEventKind::kRestartRequested)
      .value("ERROR", PollerEventKind::kError)
      .finalize();
  m.def("to_string", py::overload_cast<PollerEventKind>(&to_string),
        py::arg("value"));

  py::class_<WorkerCounters>(
      m, "WorkerCounters",
      "A worker's probes and policy events, counted by the poller.")
      .def_static("latency_bounds", &WorkerCounters::latency_bounds,
                  "Upper bounds (seconds) of latency_counts, the last one "
                  "excepted (longer).")
      .def_readonly("probes", &WorkerCounters::probes)
      .def_readonly("audits", &WorkerCounters::audits)
      .def_readonly("ejections", &WorkerCounters::ejections)
      .def_readonly("latency_counts", &WorkerCounters::latency_counts)
      .def_readonly("latency_sum_s", &WorkerCounters::latency_sum_s)
      .def_readonly("last_probe_unix_time",
                    &WorkerCounters::last_probe_unix_time);

  py::class_<WorkerStatus>(m, "WorkerStatus",
                           "A worker's state as the poller sees it now.")
      .def_readonly("id", &WorkerStatus::id)
      .def_readonly("url", &WorkerStatus::url)
      .def_readonly("health_url", &WorkerStatus::health_url)
      .def_readonly("probe_url", &WorkerStatus::probe_url)
      .def_readonly("endpoint", &WorkerStatus::endpoint)
      .def_readonly("restartable", &WorkerStatus::restartable)
      .def_readonly("phase", &WorkerStatus::phase)
      .def_readonly("in_rotation", &WorkerStatus::in_rotation)
      .def_readonly("consecutive_failures", &WorkerStatus::consecutive_failures)
      .def_readonly("consecutive_successes",
                    &WorkerStatus::consecutive_successes)
      .def_readonly("attempt", &WorkerStatus::attempt)
      .def_readonly("next_restart_in_s", &WorkerStatus::next_restart_in_s)
      .def_readonly("boot_deadline_in_s", &WorkerStatus::boot_deadline_in_s)
      .def_readonly("stable_in_s", &WorkerStatus::stable_in_s)
      .def_readonly("awaiting_process", &WorkerStatus::awaiting_process)
      .def_readonly("ejection_suppressed", &WorkerStatus::ejection_suppressed)
      .def_readonly("last_error", &WorkerStatus::last_error)
      .def_readonly("last_cause", &WorkerStatus::last_cause)
      .def_readonly("last_exit_code", &WorkerStatus::last_exit_code)
      .def_readonly("last_latency_s", &WorkerStatus::last_latency_s)
      .def_readonly("last_probe", &WorkerStatus::last_probe)
      .def_readonly("probes", &WorkerStatus::probes)
      .def_readonly("counters", &WorkerStatus::counters);

  py::class_<PollerEvent>(m, "PollerEvent",
                          "One thing the poller thread tells its owner.")
      .def_readonly("kind", &PollerEvent::kind)
      .def_readonly("worker_id", &PollerEvent::worker_id)
      .def_readonly("unix_time", &PollerEvent::unix_time)
      .def_readonly("probe", &PollerEvent::probe)
      .def_readonly("audit", &PollerEvent::audit)
      .def_readonly("in_rotation", &PollerEvent::in_rotation)
      .def_readonly("error", &PollerEvent::error);

  py::class_<PollerStats>(m, "PollerStats",
                          "Counters of the poller itself (not of a worker).")
      .def_readonly("loop_iterations", &PollerStats::loop_iterations)
      .def_readonly("probes_started", &PollerStats::probes_started)
      .def_readonly("probes_finished", &PollerStats::probes_finished)
      .def_readonly("probes_discarded", &PollerStats::probes_discarded)
      .def_readonly("dropped_events", &PollerStats::dropped_events)
      .def_readonly("queued_events", &PollerStats::queued_events)
      .def_readonly("event_notify_errors", &PollerStats::event_notify_errors)
      .def_readonly("io_errors", &PollerStats::io_errors)
      .def_readonly("consecutive_io_errors",
                    &PollerStats::consecutive_io_errors)
      .def_readonly("io_failing", &PollerStats::io_failing)
      .def_readonly("last_io_error", &PollerStats::last_io_error)
      .def_readonly("driver_rebuilds", &PollerStats::driver_rebuilds)
      .def_readonly("ejections_suppressed", &PollerStats::ejections_suppressed)
      .def_readonly("workers", &PollerStats::workers)
      .def_readonly("in_rotation", &PollerStats::in_rotation)
      .def_readonly("in_flight", &PollerStats::in_flight)
      .def_readonly("concurrency_cap", &PollerStats::concurrency_cap);

  py::class_<FdLimit>(m, "FdLimit", "What raise_fd_limit found and did.")
      .def_readonly("soft_before", &FdLimit::soft_before)
      .def_readonly("soft", &FdLimit::soft)
      .def_readonly("hard", &FdLimit::hard)
      .def_readonly("raised", &FdLimit::raised)
      .def_readonly("error", &FdLimit::error);
  m.def("raise_fd_limit", &raise_fd_limit, py::arg("probe_fds"));

  py::class_<SweepStats>(m, "SweepStats", "Totals of one synchronous sweep.")
      .def(py::init<>())
      .def_readonly("probes", &SweepStats::probes)
      .def_readonly("healthy", &SweepStats::healthy)
      .def_readonly("wall_s", &SweepStats::wall_s);

  // Every method releases the GIL while it runs: the poller thread never
  // needs it, and stop() joins that thread.
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<Poller>(m, "Poller",
                     "Background /health prober; every method is thread-safe.")
      .def(py::init([](HealthConfig config, ProbeExpectations expect,
                       std::uint64_t seed) {
             return std::make_unique<Poller>(
                 std::move(config), std::move(expect), SteadyClock::now, seed);
           }),
           py::arg("config"), py::arg("expect"), py::arg("seed") = 0)
      .def("add_worker", &Poller::add_worker, py::arg("target"), release())
      .def("remove_worker", &Poller::remove_worker, py::arg("id"), release())
      .def("set_url", &Poller::set_url, py::arg("id"), py::arg("url"),
           py::arg("health_url") = "", release())
      .def("start", &Poller::start, release())
      .def("stop", &Poller::stop, release())
      .def("running", &Poller::running, release())
      .def("report_process_exit", &Poller::report_process_exit, py::arg("id"),
           py::arg("reason"), py::arg("exit_code") = py::none(), release())
      .def("report_passive_failure", &Poller::report_passive_failure,
           py::arg("id"), py::arg("reason"), release())
      .def("report_restart_failed", &Poller::report_restart_failed,
           py::arg("id"), py::arg("reason"), release())
      .def("notify_fd", &Poller::notify_fd)
      .def("drain_events", &Poller::drain_events, release())
      .def("statuses", &Poller::statuses, release())
      .def("status", &Poller::status, py::arg("id"), release())
      .def("stats", &Poller::stats, release())
      .def_static(
          "sweep",
          [](const std::vector<Target>& targets, const HealthConfig& config,
             const ProbeExpectations& expect) {
            SweepStats stats;
            std::vector<ProbeResult> results;
            {
              py::gil_scoped_release unlocked;
              results = Poller::sweep(targets, config, expect, &stats);
            }
            return std::make_pair(std::move(results), stats);
          },
          py::arg("targets"), py::arg("config"), py::arg("expect"));
}

}  // namespace mineru_health::bindings
