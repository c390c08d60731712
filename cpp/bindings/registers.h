// One register_<concept> function per public header; module.cc calls them.
#ifndef MINERU_HEALTH_BINDINGS_REGISTERS_H_
#define MINERU_HEALTH_BINDINGS_REGISTERS_H_

#include <pybind11/pybind11.h>

namespace mineru_health::bindings {

void register_classifier(pybind11::module_& m);
void register_worker_state(pybind11::module_& m);
void register_health_server(pybind11::module_& m);
void register_parent_watch(pybind11::module_& m);
void register_config(pybind11::module_& m);
void register_probe(pybind11::module_& m);
void register_poller(pybind11::module_& m);
void register_process_scope(pybind11::module_& m);
void register_cgroups(pybind11::module_& m);
void register_resolver(pybind11::module_& m);

}  // namespace mineru_health::bindings

#endif  // MINERU_HEALTH_BINDINGS_REGISTERS_H_
