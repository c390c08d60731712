// Bindings for resolver.h.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <string>

#include "mineru_health/resolver.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_resolver(py::module_& m) {
  py::native_enum<ResolveOutcome>(m, "ResolveOutcome", "enum.Enum",
                                  "What a DNS lookup answered.")
      .value("ADDRESSES", ResolveOutcome::kAddresses)
      .value("EMPTY", ResolveOutcome::kEmpty)
      .value("FAILED", ResolveOutcome::kFailed)
      .finalize();

  py::class_<Resolution>(m, "Resolution", "One DNS lookup's answer.")
      .def_readonly("outcome", &Resolution::outcome)
      .def_readonly("addresses", &Resolution::addresses)
      .def_readonly("truncated", &Resolution::truncated)
      .def_readonly("error", &Resolution::error);

  py::class_<Resolver>(
      m, "Resolver",
      "A name's addresses by c-ares, bounded in time and count; "
      "one resolve() at a time.")
      .def(py::init([](const std::string& servers, double timeout_s,
                       std::size_t max_addresses) {
             return new Resolver(
                 ResolverOptions{servers, timeout_s, max_addresses});
           }),
           py::arg("servers"), py::arg("timeout_s"), py::arg("max_addresses"))
      .def("resolve", &Resolver::resolve, py::arg("name"),
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace mineru_health::bindings
