// Python value behaviour for the bound structs that Python reads (verdicts,
// rules, fatal records, snapshots, configuration variables): a __repr__ that
// lists every property in the order bound, and __eq__ over the same
// properties. Generic over the class's own properties, so that no field list
// is written a second time.
#ifndef MINERU_HEALTH_BINDINGS_VALUE_TYPE_H_
#define MINERU_HEALTH_BINDINGS_VALUE_TYPE_H_

#include <pybind11/pybind11.h>

#include <string>

namespace mineru_health::bindings {

// The names of the properties `type` defines, in definition order.
inline pybind11::list property_names(pybind11::handle type) {
  namespace py = pybind11;
  const py::handle property = py::module_::import("builtins").attr("property");
  py::list names;
  for (auto item : py::reinterpret_borrow<py::dict>(
           py::module_::import("builtins")
               .attr("dict")(type.attr("__dict__")))) {
    if (py::isinstance(item.second, property)) names.append(item.first);
  }
  return names;
}

// "Name(a=1, b='x', kind=RuleKind.FATAL)": enum members by name, the rest by
// repr().
inline pybind11::str value_repr(pybind11::handle self) {
  namespace py = pybind11;
  const py::handle type = py::type::handle_of(self);
  const py::handle enum_type = py::module_::import("enum").attr("Enum");
  std::string out = type.attr("__name__").cast<std::string>() + "(";
  bool first = true;
  for (py::handle name : property_names(type)) {
    const py::object value = self.attr(name);
    out += (first ? "" : ", ") + name.cast<std::string>() + "=" +
           (py::isinstance(value, enum_type) ? py::str(value) : py::repr(value))
               .cast<std::string>();
    first = false;
  }
  return out + ")";
}

template <typename T>
void def_value_type(pybind11::class_<T>& cls) {
  namespace py = pybind11;
  cls.def("__repr__", &value_repr);
  cls.def("__eq__", [](py::handle self, py::handle other) -> py::object {
    const py::handle type = py::type::handle_of(self);
    if (!py::type::handle_of(other).is(type)) {
      return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    }
    for (py::handle name : property_names(type)) {
      if (!self.attr(name).equal(other.attr(name))) return py::bool_(false);
    }
    return py::bool_(true);
  });
}

}  // namespace mineru_health::bindings

#endif  // MINERU_HEALTH_BINDINGS_VALUE_TYPE_H_
