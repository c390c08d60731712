// Binds parent_watch.h. Type conversion only.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>

#include "mineru_health/parent_watch.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_parent_watch(py::module_& m) {
  py::native_enum<ParentWatch>(m, "ParentWatch", "enum.Enum",
                               "What exit_with_parent() arranged.")
      .value("ARMED", ParentWatch::kArmed)
      .value("PARENT_GONE", ParentWatch::kParentGone)
      .value("UNSUPPORTED", ParentWatch::kUnsupported)
      .finalize();
  m.def("to_string", py::overload_cast<ParentWatch>(&to_string),
        py::arg("value"));
  m.def("exit_with_parent", &exit_with_parent, py::arg("signal"),
        py::arg("expected_parent"));
}

}  // namespace mineru_health::bindings
