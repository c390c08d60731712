// Bindings for config.h: the configuration structs, the variable table,
// presets and the environment readers.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "mineru_health/config.h"
#include "registers.h"

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
      .finalize();
  m.def("to_string", py::overload_cast<ConfigType>(&to_string),
        py::arg("value"));

  py::class_<HealthConfig>(
      m, "HealthConfig",
      "Router health configuration (plain values; see validate()).")
      .def(py::init<>())
      .def(py::init<const HealthConfig&>(), py::arg("other"))
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
                     &HealthConfig::max_ejection_percent)
      .def_readwrite("task_retries", &HealthConfig::task_retries)
      .def_readwrite("retry_budget_percent",
                     &HealthConfig::retry_budget_percent)
      .def_readwrite("retry_budget_min", &HealthConfig::retry_budget_min)
      .def_readwrite("max_kept_tasks", &HealthConfig::max_kept_tasks)
      .def_readwrite("max_kept_mb", &HealthConfig::max_kept_mb)
      .def_readwrite("native_probes", &HealthConfig::native_probes);

  py::class_<WorkerConfig>(
      m, "WorkerConfig",
      "Worker health configuration (plain values; see validate()).")
      .def(py::init<>())
      .def(py::init<const WorkerConfig&>(), py::arg("other"))
      .def_readwrite("port", &WorkerConfig::port)
      .def_readwrite("bind", &WorkerConfig::bind)
      .def_readwrite("loop_hang_s", &WorkerConfig::loop_hang_s)
      .def_readwrite("stall_s", &WorkerConfig::stall_s)
      .def_readwrite("task_hang_s", &WorkerConfig::task_hang_s)
      .def_readwrite("verify_s", &WorkerConfig::verify_s)
      .def_readwrite("exit_on_fatal", &WorkerConfig::exit_on_fatal)
      .def_readwrite("exit_grace_s", &WorkerConfig::exit_grace_s)
      .def_readwrite("retry_after_s", &WorkerConfig::retry_after_s)
      .def_readwrite("expose_errors", &WorkerConfig::expose_errors)
      .def_readwrite("error_budget", &WorkerConfig::error_budget)
      .def_readwrite("error_budget_window_s",
                     &WorkerConfig::error_budget_window_s)
      .def_readwrite("parent_pid", &WorkerConfig::parent_pid)
      .def_readwrite("rules_path", &WorkerConfig::rules_path)
      .def_readwrite("task_store", &WorkerConfig::task_store)
      .def_readwrite("state_dir", &WorkerConfig::state_dir);

  py::class_<ConfigVariable>(m, "ConfigVariable",
                             "One documented environment variable.")
      .def_readonly("name", &ConfigVariable::name)
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
  m.def("check_files", py::overload_cast<const HealthConfig&>(&check_files),
        py::arg("config"));
  m.def("check_files", py::overload_cast<const WorkerConfig&>(&check_files),
        py::arg("config"));
  m.def("check_path", &check_path, py::arg("variable"), py::arg("path"));
}

}  // namespace mineru_health::bindings
