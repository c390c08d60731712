// Binds health_server.h: the native health endpoint. Type conversion only.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>

#include "mineru_health/health_server.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_health_server(py::module_& m) {
  py::class_<HealthServerOptions>(m, "HealthServerOptions")
      .def(py::init<>())
      .def_readwrite("bind_address", &HealthServerOptions::bind_address)
      .def_readwrite("port", &HealthServerOptions::port)
      .def_readwrite("connection_limit", &HealthServerOptions::connection_limit)
      .def_readwrite("per_ip_connection_limit",
                     &HealthServerOptions::per_ip_connection_limit)
      .def_readwrite("connection_deadline_ms",
                     &HealthServerOptions::connection_deadline_ms)
      .def_readwrite("connection_grace_ms",
                     &HealthServerOptions::connection_grace_ms)
      .def_readwrite("idle_timeout_s", &HealthServerOptions::idle_timeout_s)
      .def_readwrite("connection_memory_bytes",
                     &HealthServerOptions::connection_memory_bytes)
      .def_readwrite("expose_errors", &HealthServerOptions::expose_errors);

  py::class_<HealthAnswer>(m, "HealthAnswer")
      .def_readonly("status", &HealthAnswer::status)
      .def_readonly("body", &HealthAnswer::body);

  m.def("health_answer", &health_answer, py::arg("path"), py::arg("snapshot"),
        py::arg("expose_errors"));

  py::class_<HealthServer>(m, "HealthServer",
                           "Serves /health, /livez, /readyz natively.")
      // (server, "") on success, (None, why) on an expected failure; the
      // Python wrapper raises. Binding the socket may take a moment.
      .def_static(
          "start",
          [](std::shared_ptr<WorkerState> state, HealthServerOptions options) {
            HealthServerStart started;
            {
              py::gil_scoped_release release;
              started =
                  HealthServer::start(std::move(state), std::move(options));
            }
            return py::make_tuple(started.server
                                      ? py::cast(std::move(started.server))
                                      : py::none(),
                                  started.error);
          },
          py::arg("state"), py::arg("options"))
      .def_property_readonly("port", &HealthServer::port)
      .def_property_readonly("bind_address", &HealthServer::bind_address)
      .def("stop", &HealthServer::stop,
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace mineru_health::bindings
