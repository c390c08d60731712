// Binds cgroups.h. Type conversion only; remove_cgroup_tree releases the GIL.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>

#include "mineru_health/cgroups.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_cgroups(py::module_& m) {
  py::class_<CgroupHome>(m, "CgroupHome",
                         "This process's cgroup v2 directory, and why no "
                         "child cgroup can be made there (\"\": it can).")
      .def_readonly("path", &CgroupHome::path)
      .def_readonly("error", &CgroupHome::error);
  py::class_<CgroupRemoval>(m, "CgroupRemoval", "What remove_cgroup_tree did.")
      .def_readonly("killed", &CgroupRemoval::killed)
      .def_readonly("error", &CgroupRemoval::error);

  m.def("cgroup_home_from", &cgroup_home_from, py::arg("mountinfo"),
        py::arg("self_cgroup"));
  m.def("find_cgroup_home", &find_cgroup_home);
  m.def("make_cgroup", &make_cgroup, py::arg("dir"));
  m.def("move_to_cgroup", &move_to_cgroup, py::arg("dir"), py::arg("pid"));
  m.def("remove_cgroup_tree", &remove_cgroup_tree, py::arg("dir"),
        py::arg("wait"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace mineru_health::bindings
