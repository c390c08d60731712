// Binds process_scope.h. Type conversion only; end_scope releases the GIL.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "mineru_health/process_scope.h"
#include "registers.h"
#include "value_type.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_process_scope(py::module_& m) {
  py::class_<ProcessId> process(
      m, "ProcessId",
      "A process: its pid and start time (clock ticks "
      "after boot), which together never name another.");
  process.def(py::init<>())
      .def(py::init([](int pid, std::uint64_t start_ticks) {
             return ProcessId{pid, start_ticks};
           }),
           py::arg("pid"), py::arg("start_ticks"))
      .def_readwrite("pid", &ProcessId::pid)
      .def_readwrite("start_ticks", &ProcessId::start_ticks);
  def_value_type(process);
  process.def("__hash__", [](const ProcessId& p) {
    return py::hash(py::make_tuple(p.pid, p.start_ticks));
  });

  py::class_<ProcessScope>(m, "ProcessScope",
                           "Where one worker's processes are: its leader "
                           "(and process group), cgroup and tag.")
      .def(py::init<>())
      .def_readwrite("leader", &ProcessScope::leader)
      .def_readwrite("cgroup", &ProcessScope::cgroup)
      .def_readwrite("tag", &ProcessScope::tag);

  py::class_<EndReport> report(m, "EndReport", "What end_scope did.");
  report.def_readonly("terminated", &EndReport::terminated)
      .def_readonly("killed", &EndReport::killed)
      .def_readonly("survivors", &EndReport::survivors);
  def_value_type(report);

  m.def("process_id", &process_id, py::arg("pid"));
  m.def("scope_members", &scope_members, py::arg("scope"),
        py::call_guard<py::gil_scoped_release>());
  m.def("tagged_processes", &tagged_processes, py::arg("prefix"),
        py::call_guard<py::gil_scoped_release>());
  m.def("end_scope", &end_scope, py::arg("scope"), py::arg("grace"),
        py::call_guard<py::gil_scoped_release>());
  m.def("kill_scope", &kill_scope, py::arg("scope"), py::arg("wait"),
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace mineru_health::bindings
