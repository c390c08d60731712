// Bindings for probe.h: probe statuses, load figures and the body classifier.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "mineru_health/probe.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_probe(py::module_& m) {
  py::native_enum<ProbeStatus>(m, "ProbeStatus", "enum.Enum",
                               "What one GET /health answer means for routing.")
      .value("HEALTHY", ProbeStatus::kHealthy)
      .value("CONNECT_ERROR", ProbeStatus::kConnectError)
      .value("TIMEOUT", ProbeStatus::kTimeout)
      .value("HTTP_STATUS", ProbeStatus::kHttpStatus)
      .value("ENGINE_DEAD", ProbeStatus::kEngineDead)
      .value("BODY_TOO_LARGE", ProbeStatus::kBodyTooLarge)
      .value("NOT_JSON_OBJECT", ProbeStatus::kNotJsonObject)
      .value("UNEXPECTED_STATUS", ProbeStatus::kUnexpectedStatus)
      .value("BAD_PROTOCOL", ProbeStatus::kBadProtocol)
      .value("BAD_FIELDS", ProbeStatus::kBadFields)
      .value("TRANSPORT_ERROR", ProbeStatus::kTransportError)
      .value("LOOP_HUNG", ProbeStatus::kLoopHung)
      .finalize();
  m.def("to_string", py::overload_cast<ProbeStatus>(&to_string),
        py::arg("value"));

  py::native_enum<ProbeEndpoint>(m, "ProbeEndpoint", "enum.Enum",
                                 "Which of a worker's endpoints was probed.")
      .value("MAIN", ProbeEndpoint::kMain)
      .value("NATIVE", ProbeEndpoint::kNative)
      .finalize();
  m.def("to_string", py::overload_cast<ProbeEndpoint>(&to_string),
        py::arg("value"));

  py::class_<WorkerLoad>(m, "WorkerLoad",
                         "The load figures the router scores workers by.")
      .def(py::init<>())
      .def_readwrite("queued_tasks", &WorkerLoad::queued_tasks)
      .def_readwrite("processing_tasks", &WorkerLoad::processing_tasks)
      .def_readwrite("completed_tasks", &WorkerLoad::completed_tasks)
      .def_readwrite("failed_tasks", &WorkerLoad::failed_tasks)
      .def_readwrite("max_concurrent_requests",
                     &WorkerLoad::max_concurrent_requests)
      .def_readwrite("processing_window_size",
                     &WorkerLoad::processing_window_size);

  py::class_<ProbeExpectations>(m, "ProbeExpectations",
                                "What a healthy /health body must hold.")
      .def(py::init<>())
      .def_readwrite("expected_status", &ProbeExpectations::expected_status)
      .def_readwrite("protocol_version", &ProbeExpectations::protocol_version)
      .def_readwrite("max_body_bytes", &ProbeExpectations::max_body_bytes)
      .def_readwrite("require_load_fields",
                     &ProbeExpectations::require_load_fields)
      .def_readwrite("main_port_status", &ProbeExpectations::main_port_status);

  py::class_<ProbeResult>(m, "ProbeResult", "The outcome of one probe.")
      .def(py::init<>())
      .def_readwrite("worker_id", &ProbeResult::worker_id)
      .def_readwrite("status", &ProbeResult::status)
      .def_readwrite("http_status", &ProbeResult::http_status)
      .def_readwrite("latency_s", &ProbeResult::latency_s)
      .def_readwrite("detail", &ProbeResult::detail)
      .def_readwrite("load", &ProbeResult::load)
      .def_readwrite("endpoint", &ProbeResult::endpoint)
      .def_readwrite("url", &ProbeResult::url)
      .def_readwrite("loop_lag_s", &ProbeResult::loop_lag_s)
      .def_readwrite("engine_calls_in_flight",
                     &ProbeResult::engine_calls_in_flight)
      .def_readwrite("seconds_since_progress",
                     &ProbeResult::seconds_since_progress)
      .def_readwrite("native_health_port", &ProbeResult::native_health_port)
      .def_readwrite("rule", &ProbeResult::rule)
      .def_readwrite("category", &ProbeResult::category)
      .def_property_readonly("healthy", &ProbeResult::healthy)
      .def_property_readonly("definitive", &ProbeResult::definitive);

  // Accepts str or bytes; bytes reach the classifier unchanged (non-UTF-8 too).
  m.def("classify_health_response", &classify_health_response,
        py::arg("http_status"), py::arg("body"), py::arg("truncated"),
        py::arg("expect"));
}

}  // namespace mineru_health::bindings
