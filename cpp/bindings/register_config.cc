// Bindings for config.h: the configuration structs, the variable table,
// presets and the environment readers.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "mineru_health/config.h"
#include "registers.h"
#include "value_type.h"

namespace py = pybind11;

namespace mineru_health::bindings {

void register_config(py::module_& m) {
  py::native_enum<ConfigComponent>(m, "ConfigComponent", "enum.Enum",
                                   "Who reads a configuration variable.")
      .value("ROUTER", ConfigComponent::kRouter)
      .value("WORKER", ConfigComponent::kWorker)
      .value("TOOLING", ConfigComponent::kTooling)
      .finalize();
  m.def("to_string", py::overload_cast<ConfigComponent>(&to_string),
        py::arg("value"));

  py::native_enum<ConfigType>(m, "ConfigType", "enum.Enum",
                              "How a configuration variable is parsed.")
      .value("SECONDS", ConfigType::kSeconds)
      .value("NUMBER", ConfigType::kNumber)
      .value("INTEGER", ConfigType::kInteger)
      .value("FLAG", ConfigType::kFlag)
      .value("TEXT", ConfigType::kText)
      .value("PATH", ConfigType::kPath)
      .value("PORT", ConfigType::kPort)
      .value("ADDRESS", ConfigType::kAddress)
      .value("CHOICE", ConfigType::kChoice)
      .value("LABEL", ConfigType::kLabel)
      .finalize();
  m.def("to_string", py::overload_cast<ConfigType>(&to_string),
        py::arg("value"));

  // One property per row of config_variables.def, never a list of its own.
  py::class_<HealthConfig> health(
      m, "HealthConfig",
      "Router health configuration (plain values; see validate()).");
  health.def(py::init<>())
      .def(py::init<const HealthConfig&>(), py::arg("other"));
#define MINERU_HEALTH_ROUTER_FIELD(suffix, field, ...) \
  health.def_readwrite(#field, &HealthConfig::field);
#include "mineru_health/config_variables.def"

  py::class_<WorkerConfig> worker(
      m, "WorkerConfig",
      "Worker health configuration (plain values; see validate()).");
  worker.def(py::init<>())
      .def(py::init<const WorkerConfig&>(), py::arg("other"));
#define MINERU_HEALTH_WORKER_FIELD(suffix, field, ...) \
  worker.def_readwrite(#field, &WorkerConfig::field);
#include "mineru_health/config_variables.def"

  py::class_<ConfigVariable> variable(m, "ConfigVariable",
                                      "One documented environment variable.");
  variable.def_readonly("name", &ConfigVariable::name)
      .def_readonly("field", &ConfigVariable::field)
      .def_readonly("component", &ConfigVariable::component)
      .def_readonly("type", &ConfigVariable::type)
      .def_readonly("default_value", &ConfigVariable::default_value)
      .def_readonly("min_value", &ConfigVariable::min_value)
      .def_readonly("max_value", &ConfigVariable::max_value)
      .def_readonly("max_exclusive", &ConfigVariable::max_exclusive)
      .def_readonly("zero_disables", &ConfigVariable::zero_disables)
      .def_readonly("choices", &ConfigVariable::choices)
      .def_readonly("allowed", &ConfigVariable::allowed)
      .def_readonly("meaning", &ConfigVariable::meaning)
      .def_readonly("test_only", &ConfigVariable::test_only)
      .def_readonly("preset_values", &ConfigVariable::preset_values);
  def_value_type(variable);

  m.def("env_prefix", &env_prefix, py::arg("component"));
  m.def("config_variables", &config_variables);
  m.def("config_variable_for", &config_variable_for, py::arg("component"),
        py::arg("field"), py::return_value_policy::copy);
  m.def("preset_names", &preset_names);
  m.def("preset", &preset, py::arg("name"));
  m.def("health_config_from_env", &health_config_from_env, py::arg("env"));
  m.def("worker_config_from_env", &worker_config_from_env, py::arg("env"));
  m.def("validate", py::overload_cast<const HealthConfig&>(&validate),
        py::arg("config"));
  m.def("validate", py::overload_cast<const WorkerConfig&>(&validate),
        py::arg("config"));
  m.def("check_path", &check_path, py::arg("variable"), py::arg("path"));
}

}  // namespace mineru_health::bindings
