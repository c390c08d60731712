// Bindings for config.h: HealthConfig, presets and the environment reader.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "mineru_health/config.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_config(py::module_& m) {
  py::class_<HealthConfig>(
      m, "HealthConfig",
      "Router health configuration (plain values; see validate()).")
      .def(py::init<>())
      .def_readwrite("interval_s", &HealthConfig::interval_s)
      .def_readwrite("probe_timeout_s", &HealthConfig::probe_timeout_s)
      .def_readwrite("connect_timeout_s", &HealthConfig::connect_timeout_s)
      .def_readwrite("failure_threshold", &HealthConfig::failure_threshold)
      .def_readwrite("healthy_threshold", &HealthConfig::healthy_threshold)
      .def_readwrite("backoff_base_s", &HealthConfig::backoff_base_s)
      .def_readwrite("backoff_max_s", &HealthConfig::backoff_max_s)
      .def_readwrite("max_attempts", &HealthConfig::max_attempts)
      .def_readwrite("boot_timeout_s", &HealthConfig::boot_timeout_s)
      .def_readwrite("concurrency", &HealthConfig::concurrency)
      .def_readwrite("jitter", &HealthConfig::jitter)
      .def_readwrite("expected_status", &HealthConfig::expected_status)
      .def_readwrite("max_body_bytes", &HealthConfig::max_body_bytes)
      .def_readwrite("audit_path", &HealthConfig::audit_path)
      .def_readwrite("ca_file", &HealthConfig::ca_file)
      .def_readwrite("main_port_timeout_s", &HealthConfig::main_port_timeout_s)
      .def_readwrite("stable_window_s", &HealthConfig::stable_window_s)
      .def_readwrite("max_ejection_percent",
                     &HealthConfig::max_ejection_percent);

  py::class_<ConfigVariable>(m, "ConfigVariable",
                             "One documented MINERU_ROUTER_HEALTH_* variable.")
      .def_readonly("name", &ConfigVariable::name)
      .def_readonly("default_value", &ConfigVariable::default_value)
      .def_readonly("meaning", &ConfigVariable::meaning);

  m.def("config_variables", &config_variables);
  m.def("preset_names", &preset_names);
  m.def("preset", &preset, py::arg("name"));
  m.def("health_config_from_env", &health_config_from_env, py::arg("env"));
  m.def("validate", &validate, py::arg("config"));
}

}  // namespace mineru_health::bindings
