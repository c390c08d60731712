// Binds worker_state.h: the process-wide fatal record. Type conversion only.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>
#include <utility>

#include "mineru_health/worker_state.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_worker_state(py::module_& m) {
  py::class_<FatalRecord>(m, "FatalRecord",
                          "One fatal failure as recorded by the worker.")
      .def(py::init([](std::string error, std::string rule_id,
                       std::string category, double unix_time) {
             return FatalRecord{std::move(error), std::move(rule_id),
                                std::move(category), unix_time};
           }),
           py::arg("error"), py::arg("rule_id"), py::arg("category"),
           py::arg("unix_time"))
      .def_readonly("error", &FatalRecord::error)
      .def_readonly("rule_id", &FatalRecord::rule_id)
      .def_readonly("category", &FatalRecord::category)
      .def_readonly("unix_time", &FatalRecord::unix_time);

  py::class_<WorkerSnapshot>(m, "WorkerSnapshot",
                             "A consistent copy of the worker state.")
      .def_readonly("healthy", &WorkerSnapshot::healthy)
      .def_readonly("fatal_count", &WorkerSnapshot::fatal_count)
      .def_readonly("task_local_count", &WorkerSnapshot::task_local_count)
      .def_readonly("first_fatal", &WorkerSnapshot::first_fatal)
      .def_readonly("last_fatal", &WorkerSnapshot::last_fatal);

  py::class_<WorkerState>(m, "WorkerState",
                          "Thread-safe: every method may be called at once.")
      .def(py::init<>())
      .def("record_fatal", &WorkerState::record_fatal, py::arg("record"))
      .def("record_task_local", &WorkerState::record_task_local)
      .def("healthy", &WorkerState::healthy)
      .def("snapshot", &WorkerState::snapshot)
      .def("reset", &WorkerState::reset)
      // The timeout is converted before the guard releases the GIL, so the
      // wait blocks no other Python thread.
      .def("wait_until_unhealthy", &WorkerState::wait_until_unhealthy,
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace mineru_health::bindings
