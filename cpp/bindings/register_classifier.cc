// Binds classifier.h: frames, rules, compiled rule sets and the classifier.
// Type conversion only; the Python package wraps these in its public API.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mineru_health/classifier.h"
#include "registers.h"

namespace py = pybind11;

namespace mineru_health::bindings {
namespace {

// Texts coming from exceptions may hold any bytes (the caller passes bytes so
// that invalid UTF-8 and lone surrogates cross unchanged). Decoding them back
// with surrogateescape keeps every byte and never raises.
py::str to_py_str(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(
      text.data(), static_cast<Py_ssize_t>(text.size()), "surrogateescape");
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

std::vector<py::str> to_py_strs(const std::vector<std::string>& texts) {
  std::vector<py::str> out;
  out.reserve(texts.size());
  for (const auto& text : texts) out.push_back(to_py_str(text));
  return out;
}

// pybind11 holders cannot be shared_ptr<const T>; the object stays immutable
// because no mutating method is bound.
std::shared_ptr<RuleSet> mutable_holder(
    const std::shared_ptr<const RuleSet>& rule_set) {
  return std::const_pointer_cast<RuleSet>(rule_set);
}

}  // namespace

void register_classifier(py::module_& m) {
  py::class_<Frame>(m, "Frame",
                    "One exception of a failure chain, outermost first.")
      .def(py::init([](std::string module, std::string type_name,
                       std::vector<std::string> bases, std::string message) {
             return Frame{std::move(module), std::move(type_name),
                          std::move(bases), std::move(message)};
           }),
           py::arg("module"), py::arg("type_name"), py::arg("bases"),
           py::arg("message"))
      .def_property(
          "module", [](const Frame& f) { return to_py_str(f.module); },
          [](Frame& f, std::string v) { f.module = std::move(v); })
      .def_property(
          "type_name", [](const Frame& f) { return to_py_str(f.type_name); },
          [](Frame& f, std::string v) { f.type_name = std::move(v); })
      .def_property(
          "bases", [](const Frame& f) { return to_py_strs(f.bases); },
          [](Frame& f, std::vector<std::string> v) { f.bases = std::move(v); })
      .def_property(
          "message", [](const Frame& f) { return to_py_str(f.message); },
          [](Frame& f, std::string v) { f.message = std::move(v); });

  py::native_enum<RuleKind>(m, "RuleKind", "enum.Enum")
      .value("FATAL", RuleKind::kFatal)
      .value("TASK_LOCAL", RuleKind::kTaskLocal)
      .finalize();
  m.def(
      "rule_kind_name",
      [](RuleKind kind) { return std::string(to_string(kind)); },
      py::arg("kind"));

  py::class_<Rule>(m, "Rule", "One classification rule.")
      .def(py::init([](std::string id, RuleKind kind, std::string category,
                       std::string pattern) {
             return Rule{std::move(id), kind, std::move(category),
                         std::move(pattern)};
           }),
           py::arg("id"), py::arg("kind"), py::arg("category"),
           py::arg("pattern"))
      .def_property(
          "id", [](const Rule& r) { return to_py_str(r.id); },
          [](Rule& r, std::string v) { r.id = std::move(v); })
      .def_readwrite("kind", &Rule::kind)
      .def_property(
          "category", [](const Rule& r) { return to_py_str(r.category); },
          [](Rule& r, std::string v) { r.category = std::move(v); })
      .def_property(
          "pattern", [](const Rule& r) { return to_py_str(r.pattern); },
          [](Rule& r, std::string v) { r.pattern = std::move(v); });

  py::class_<RuleError>(m, "RuleError",
                        "Why a rule could not be compiled or parsed.")
      .def_property_readonly(
          "source", [](const RuleError& e) { return to_py_str(e.source); })
      .def_readonly("line", &RuleError::line)
      .def_property_readonly(
          "rule_id", [](const RuleError& e) { return to_py_str(e.rule_id); })
      .def_property_readonly(
          "message", [](const RuleError& e) { return to_py_str(e.message); })
      .def("to_string",
           [](const RuleError& e) { return to_py_str(e.to_string()); });

  py::class_<ClassifierLimits>(m, "ClassifierLimits",
                               "Bounds on one classification.")
      .def(py::init<>())
      .def_readwrite("max_frames", &ClassifierLimits::max_frames)
      .def_readwrite("max_message_bytes", &ClassifierLimits::max_message_bytes)
      .def_readwrite("excerpt_bytes", &ClassifierLimits::excerpt_bytes);

  py::class_<RuleSet, std::shared_ptr<RuleSet>>(
      m, "RuleSet", "An immutable, compiled rule set.")
      .def_static(
          "compile",
          [](std::vector<Rule> rules, const std::string& source) {
            CompileResult result = RuleSet::compile(std::move(rules), source);
            return py::make_tuple(
                result.rule_set ? py::cast(mutable_holder(result.rule_set))
                                : py::none(),
                py::cast(result.errors));
          },
          py::arg("rules"), py::arg("source") = "<builtin>",
          "Returns (rule_set or None, errors).")
      .def_property_readonly("rules", [](const RuleSet& rule_set) {
        return std::vector<Rule>(rule_set.rules());
      });

  py::class_<Verdict>(m, "Verdict", "The classifier's decision on one failure.")
      .def_readonly("fatal", &Verdict::fatal)
      .def_readonly("matched", &Verdict::matched)
      .def_property_readonly(
          "rule_id", [](const Verdict& v) { return to_py_str(v.rule_id); })
      .def_property_readonly(
          "category", [](const Verdict& v) { return to_py_str(v.category); })
      .def_readonly("frame_index", &Verdict::frame_index)
      .def_property_readonly(
          "excerpt", [](const Verdict& v) { return to_py_str(v.excerpt); });

  py::class_<Classifier, std::shared_ptr<Classifier>>(m, "Classifier",
                                                      "Thread-safe; immutable.")
      .def(py::init([](const std::shared_ptr<RuleSet>& rule_set,
                       ClassifierLimits limits) {
             return std::make_shared<Classifier>(rule_set, limits);
           }),
           py::arg("rule_set").none(false),
           py::arg("limits") = ClassifierLimits{})
      .def(
          "classify",
          [](const Classifier& classifier, const std::vector<Frame>& frames) {
            // The frames are C++ values by now; matching may take a while on
            // big messages, so other Python threads run meanwhile.
            py::gil_scoped_release release;
            return classifier.classify(frames);
          },
          py::arg("frames"))
      .def(
          "classify_tuples",
          [](const Classifier& classifier,
             std::vector<std::tuple<std::string, std::string,
                                    std::vector<std::string>, std::string>>
                 tuples) {
            // Same as classify, from plain (module, type_name, bases, message)
            // tuples: building them in Python costs far less than Frame
            // objects.
            std::vector<Frame> frames;
            frames.reserve(tuples.size());
            for (auto& [module, type_name, bases, message] : tuples) {
              frames.push_back(Frame{std::move(module), std::move(type_name),
                                     std::move(bases), std::move(message)});
            }
            py::gil_scoped_release release;
            return classifier.classify(frames);
          },
          py::arg("frames"));

  m.def("builtin_rules", &builtin_rules);
  m.def("merge_rules", &merge_rules, py::arg("base"), py::arg("overrides"));
  m.def(
      "parse_rules_text",
      [](const std::string& text, const std::string& source) {
        ParseRulesResult result = parse_rules_text(text, source);
        return py::make_tuple(py::cast(result.rules), py::cast(result.errors));
      },
      py::arg("text"), py::arg("source"), "Returns (rules, errors).");
  m.def(
      "sanitize_utf8",
      [](const std::string& text) { return to_py_str(sanitize_utf8(text)); },
      py::arg("text"));
  m.def(
      "compact_form",
      [](const std::string& text) { return to_py_str(compact_form(text)); },
      py::arg("text"));
}

}  // namespace mineru_health::bindings
