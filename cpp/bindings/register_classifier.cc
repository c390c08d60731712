// Binds classifier.h: frames, rules, compiled rule sets and the classifier.
// Type conversion only; the Python package wraps these in its public API.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mineru_health/classifier.h"
#include "registers.h"
#include "value_type.h"

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

// (rules, disabled ids, errors), typed for the generated stub.
using ParsedRules =
    py::typing::Tuple<py::typing::List<Rule>, py::typing::List<py::str>,
                      py::typing::List<RuleError>>;

ParsedRules parse_result(const ParseRulesResult& result) {
  return ParsedRules(py::make_tuple(py::cast(result.rules),
                                    to_py_strs(result.disabled),
                                    py::cast(result.errors)));
}

using FrameTuple =
    std::tuple<std::string, std::string, std::vector<std::string>, std::string,
               std::string, Via, int>;

// Results are read-only; only Frame, an input, is writable.
template <typename T>
void text_property(py::class_<T>& cls, const char* name,
                   std::string T::*field) {
  cls.def_property_readonly(
      name, [field](const T& self) { return to_py_str(self.*field); });
}

void writable_text(py::class_<Frame>& cls, const char* name,
                   std::string Frame::*field) {
  cls.def_property(
      name, [field](const Frame& self) { return to_py_str(self.*field); },
      [field](Frame& self, std::string value) {
        self.*field = std::move(value);
      });
}

}  // namespace

void register_classifier(py::module_& m) {
  py::native_enum<Via>(m, "Via", "enum.Enum")
      .value("ROOT", Via::kRoot)
      .value("CAUSE", Via::kCause)
      .value("CONTEXT", Via::kContext)
      .value("GROUP", Via::kGroupMember)
      .finalize();
  py::native_enum<RuleKind>(m, "RuleKind", "enum.Enum")
      .value("FATAL", RuleKind::kFatal)
      .value("TASK_LOCAL", RuleKind::kTaskLocal)
      .value("HEURISTIC", RuleKind::kHeuristic)
      .value("AMBIGUOUS", RuleKind::kAmbiguous)
      .value("GENERIC", RuleKind::kGeneric)
      .finalize();
  py::native_enum<RuleTarget>(m, "RuleTarget", "enum.Enum")
      .value("TYPE", RuleTarget::kType)
      .value("MESSAGE", RuleTarget::kMessage)
      .value("FRAME", RuleTarget::kFrame)
      .finalize();
  py::native_enum<RuleScope>(m, "RuleScope", "enum.Enum")
      .value("ENGINE", RuleScope::kEngine)
      .value("ANY", RuleScope::kAny)
      .finalize();
  m.def(
      "rule_kind_name",
      [](RuleKind kind) { return std::string(to_string(kind)); },
      py::arg("kind"));
  m.def(
      "strength_name",
      [](RuleKind kind) { return std::string(strength_name(kind)); },
      py::arg("kind"));

  py::class_<Frame> frame(m, "Frame",
                          "One exception of a failure chain, in pre-order.");
  frame.def(py::init<std::string, std::string, std::vector<std::string>,
                     std::string, std::string, Via, int>(),
            py::arg("module"), py::arg("type_name"), py::arg("bases"),
            py::arg("message"), py::arg("raised_in"), py::arg("via"),
            py::arg("depth"));
  writable_text(frame, "module", &Frame::module);
  writable_text(frame, "type_name", &Frame::type_name);
  writable_text(frame, "message", &Frame::message);
  writable_text(frame, "raised_in", &Frame::raised_in);
  frame
      .def_property(
          "bases", [](const Frame& f) { return to_py_strs(f.bases); },
          [](Frame& f, std::vector<std::string> v) { f.bases = std::move(v); })
      .def_readwrite("via", &Frame::via)
      .def_readwrite("depth", &Frame::depth);

  py::class_<Rule> rule(
      m, "Rule",
      "One rule: `pattern` (RE2, case-insensitive) on `target` text "
      "classifies as `kind`. `scope` says which frames a message or frame "
      "rule may judge (ENGINE: only those an engine or device runtime "
      "raised); `from_operator` marks rules from a rules file, consulted "
      "first.");
  rule.def(py::init<std::string, RuleKind, std::string, std::string, RuleTarget,
                    RuleScope, bool>(),
           py::arg("id"), py::arg("kind"), py::arg("category"),
           py::arg("pattern"),
           py::arg_v("target", RuleTarget::kFrame, "RuleTarget.FRAME"),
           py::arg_v("scope", RuleScope::kAny, "RuleScope.ANY"),
           py::arg("from_operator") = false);
  text_property(rule, "id", &Rule::id);
  rule.def_readonly("kind", &Rule::kind);
  text_property(rule, "category", &Rule::category);
  text_property(rule, "pattern", &Rule::pattern);
  rule.def_readonly("target", &Rule::target)
      .def_readonly("scope", &Rule::scope)
      .def_readonly("from_operator", &Rule::from_operator)
      .def_property_readonly(
          "kind_name", [](const Rule& r) { return to_string(r.kind); },
          "fatal, heuristic, task_local, generic or ambiguous.")
      .def_property_readonly(
          "strength", [](const Rule& r) { return strength_name(r.kind); },
          "The rule's place on the precedence ladder (definitive for fatal).")
      .def_property_readonly("target_name",
                             [](const Rule& r) { return to_string(r.target); })
      .def_property_readonly("scope_name",
                             [](const Rule& r) { return to_string(r.scope); })
      .def(
          "to_line", [](const Rule& r) { return to_py_str(r.to_line()); },
          "The rule as one line of a rules file.");
  def_value_type(rule);

  py::class_<RuleError> rule_error(
      m, "RuleError", "Why a rule could not be compiled, parsed or read.");
  text_property(rule_error, "source", &RuleError::source);
  rule_error.def_readonly("line", &RuleError::line);
  text_property(rule_error, "rule_id", &RuleError::rule_id);
  text_property(rule_error, "message", &RuleError::message);
  rule_error.def("to_string",
                 [](const RuleError& e) { return to_py_str(e.to_string()); });
  def_value_type(rule_error);

  py::class_<ClassifierLimits>(m, "ClassifierLimits",
                               "Bounds on one classification.")
      .def(py::init<>())
      .def_readwrite("max_frames", &ClassifierLimits::max_frames)
      .def_readwrite("max_message_bytes", &ClassifierLimits::max_message_bytes)
      .def_readwrite("max_total_message_bytes",
                     &ClassifierLimits::max_total_message_bytes)
      .def_readwrite("excerpt_bytes", &ClassifierLimits::excerpt_bytes);

  py::class_<RuleSetLimits>(m, "RuleSetLimits",
                            "Bounds on what a rule set may contain.")
      .def(py::init<>())
      .def_readwrite("max_rules", &RuleSetLimits::max_rules)
      .def_readwrite("max_pattern_bytes", &RuleSetLimits::max_pattern_bytes)
      .def_readwrite("max_program_size", &RuleSetLimits::max_program_size)
      .def_readwrite("max_class_run", &RuleSetLimits::max_class_run)
      .def_readwrite("pattern_max_mem", &RuleSetLimits::pattern_max_mem)
      .def_readwrite("set_max_mem", &RuleSetLimits::set_max_mem)
      .def_readwrite("max_total_program_size",
                     &RuleSetLimits::max_total_program_size);

  py::class_<ClassifyOptions>(m, "ClassifyOptions",
                              "The context of one classification.")
      .def(py::init<>())
      .def_readwrite("remote_engine", &ClassifyOptions::remote_engine)
      .def_readwrite("trust_unknown_origin",
                     &ClassifyOptions::trust_unknown_origin);

  py::class_<RuleSet, std::shared_ptr<RuleSet>>(
      m, "RuleSet", "An immutable, compiled rule set.")
      .def_static(
          "compile",
          [](std::vector<Rule> rules, const std::string& source,
             const RuleSetLimits& limits) {
            CompileResult result =
                RuleSet::compile(std::move(rules), source, limits);
            return py::make_tuple(
                result.rule_set ? py::cast(mutable_holder(result.rule_set))
                                : py::none(),
                py::cast(result.errors));
          },
          py::arg("rules"), py::arg("source"), py::arg("limits"),
          "Returns (rule_set or None, errors).")
      .def_property_readonly("rules", [](const RuleSet& rule_set) {
        return std::vector<Rule>(rule_set.rules());
      });

  py::class_<Classification> verdict(
      m, "Classification",
      "The classifier's decision on one failure. `matched` is false when no "
      "rule matched (the failure is then task-local); `frame_index` points "
      "into the frames classified.");
  verdict
      .def_property_readonly(
          "kind", [](const Classification& v) { return v.kind(); },
          "fatal, ambiguous or task_local.")
      .def_readonly("fatal", &Classification::fatal)
      .def_readonly("matched", &Classification::matched)
      .def_readonly("ambiguous", &Classification::ambiguous)
      .def_readonly("remote_engine", &Classification::remote_engine);
  text_property(verdict, "rule", &Classification::rule);
  text_property(verdict, "category", &Classification::category);
  verdict
      .def_property_readonly(
          "strength", [](const Classification& v) { return v.strength(); },
          "The deciding rule's: definitive, task_local, heuristic, ambiguous, "
          "generic; empty when nothing matched.")
      .def_readonly("rule_kind", &Classification::rule_kind)
      .def_readonly("frame_index", &Classification::frame_index);
  text_property(verdict, "excerpt", &Classification::excerpt);
  def_value_type(verdict);

  py::class_<Classifier, std::shared_ptr<Classifier>>(m, "Classifier",
                                                      "Thread-safe; immutable.")
      .def(py::init([](const std::shared_ptr<RuleSet>& rule_set,
                       ClassifierLimits limits) {
             return std::make_shared<Classifier>(rule_set, limits);
           }),
           py::arg("rule_set").none(false), py::arg("limits"))
      .def(
          "classify",
          [](const Classifier& classifier, const std::vector<Frame>& frames,
             const ClassifyOptions& options) {
            // The frames are C++ values by now; matching may take a while on
            // big messages, so other Python threads run meanwhile.
            py::gil_scoped_release release;
            return classifier.classify(frames, options);
          },
          py::arg("frames"), py::arg("options"))
      .def(
          "classify_tuples",
          [](const Classifier& classifier, std::vector<FrameTuple> tuples,
             const ClassifyOptions& options) {
            // Same as classify, from plain (module, type_name, bases, message,
            // raised_in, via, depth) tuples: building them in Python costs
            // far less than Frame objects. pybind11 converted them with the
            // GIL held; only C++ values cross into the matching.
            std::vector<Frame> frames;
            frames.reserve(tuples.size());
            for (auto& [module, type_name, bases, message, raised_in, via,
                        depth] : tuples) {
              frames.emplace_back(std::move(module), std::move(type_name),
                                  std::move(bases), std::move(message),
                                  std::move(raised_in), via, depth);
            }
            py::gil_scoped_release release;
            return classifier.classify(frames, options);
          },
          py::arg("frames"), py::arg("options"));

  m.def("builtin_rules", &builtin_rules);
  m.def(
      "merge_rules",
      [](std::vector<Rule> base, const std::vector<Rule>& overrides,
         const std::vector<std::string>& disabled) {
        return merge_rules(std::move(base), overrides, disabled);
      },
      py::arg("base"), py::arg("overrides"), py::arg("disabled"));
  m.def(
      "read_rules_file",
      [](const std::string& path) {
        ParseRulesResult result;
        {
          // Reading a file is I/O: other Python threads run meanwhile.
          py::gil_scoped_release release;
          result = read_rules_file(path);
        }
        return parse_result(result);
      },
      py::arg("path"), "Returns (rules, disabled ids, errors).");
  m.attr("MAX_RULES_FILE_BYTES") = kMaxRulesFileBytes;
  m.attr("MAX_RULES_FILE_RULES") = kMaxRulesFileRules;
}

}  // namespace mineru_health::bindings
