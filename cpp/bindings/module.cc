// The private extension module mineru_health._native. Type conversion only.
#include <pybind11/pybind11.h>

#include "mineru_health/config.h"
#include "registers.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  m.doc() =
      "Native core of mineru-health (private; use the mineru_health package).";

  // C++ ConfigError becomes mineru_health.errors.ConfigError, carrying the
  // variable it names, so Python callers catch one precise type.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mineru_health::ConfigError& e) {
      py::object errors = py::module_::import("mineru_health.errors");
      py::object error = errors.attr("ConfigError")(
          e.what(), py::arg("variable") = e.variable());
      PyErr_SetObject(py::type::handle_of(error).ptr(), error.ptr());
    }
  });

  mineru_health::bindings::register_classifier(m);
  mineru_health::bindings::register_worker_state(m);
  mineru_health::bindings::register_health_server(m);
  mineru_health::bindings::register_parent_watch(m);
  mineru_health::bindings::register_config(m);
  mineru_health::bindings::register_probe(m);
  mineru_health::bindings::register_poller(m);
  mineru_health::bindings::register_process_scope(m);
  mineru_health::bindings::register_cgroups(m);
  mineru_health::bindings::register_resolver(m);
}
