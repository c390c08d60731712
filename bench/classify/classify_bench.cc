// classify() cost: ns per call on a mix of real failure chains and on
// unmatched messages of 1 KB, 100 KB and 10 MB (the worst case: every form
// of every frame is scanned to the end). Inputs are generated; nothing is
// read. A baseline in the same run (lower-casing the text and four
// std::string::find calls, roughly what a hand-written marker check costs)
// turns the absolute numbers into ratios that survive a change of machine.
//
// A second table gives the worst cases as ratios against the typical case
// (the mean over the real mix, built-in rules) of the same run: adversarial
// inputs at the classifier's limits (64 frames of 64 KiB near-miss text,
// 10,000 frames, one 10 MB frame) against the built-in rules, then against
// the largest rules file the loader accepts (2,000 operator rules at the
// per-pattern class-run limit, merged with the built-ins).
//
//   build/<dir>/classify_bench [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mineru_health/classifier.h"

namespace {

using mineru_health::Classification;
using mineru_health::Classifier;
using mineru_health::Frame;
using mineru_health::Rule;
using mineru_health::RuleKind;
using mineru_health::RuleScope;
using mineru_health::RuleTarget;
using mineru_health::Via;
using Clock = std::chrono::steady_clock;

const std::vector<std::string> kException = {"Exception", "BaseException"};
const std::vector<std::string> kRuntimeError = {"RuntimeError", "Exception",
                                                "BaseException"};

struct Input {
  std::string name;
  std::vector<Frame> frames;
};

// Traceback-like filler that matches no rule.
std::string filler(std::size_t bytes) {
  static const std::string line =
      "  File \"/opt/venv/lib/python3.11/site-packages/mineru/backend/vlm/"
      "vlm_analyze.py\", line 212, in aio_doc_analyze -> page 17 block 3\n";
  std::string out;
  out.reserve(bytes + line.size());
  while (out.size() < bytes) out += line;
  out.resize(bytes);
  return out;
}

std::vector<Input> real_mix() {
  return {
      {"vllm v1 EngineDeadError",
       {{"vllm.v1.engine.exceptions", "EngineDeadError", kException,
         "EngineCore encountered an issue. See stack trace (above) for the "
         "root cause."}}},
      {"chain: wrapper > cause > EngineDead",
       {{"builtins", "RuntimeError", kException, "task 7 failed"},
        {"builtins", "ValueError", kException, "page 3"},
        {"vllm.v1.engine.exceptions", "EngineDeadError", kException,
         "EngineCore encountered an issue."}}},
      {"CUDA illegal memory access",
       {{"torch", "AcceleratorError", kRuntimeError,
         "CUDA error: an illegal memory access was encountered\nCUDA kernel "
         "errors might be asynchronously reported at some other API call."}}},
      {"NCCL unhandled cuda error",
       {{"torch.distributed", "DistBackendError", kRuntimeError,
         "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, "
         "NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function "
         "failed."}}},
      {"PdfiumError (task-local)",
       {{"pypdfium2._helpers.misc", "PdfiumError", kRuntimeError,
         "Failed to load document (PDFium: Data format error)."}}},
      {"context length (task-local)",
       {{"builtins", "ValueError", kException,
         "The decoder prompt (length 12324) is longer than the maximum model "
         "length of 8192."}}},
      {"unmatched ValueError",
       {{"builtins", "ValueError", kException, "Operation on closed image"}}},
      {"Chinese message",
       {{"builtins", "RuntimeError", kException,
         "推理失败：文档第 3 页解析出错，请检查输入文件"}}},
  };
}

Input sized(const char* name, std::size_t bytes) {
  return {name, {{"builtins", "RuntimeError", kException, filler(bytes)}}};
}

// Text that keeps every built-in rule's prefixes busy without matching:
// device words, engine words, digits and punctuation, mixed case, some
// Chinese, the compact-form letters.
std::string near_miss(std::size_t bytes, unsigned seed) {
  static const char* const kPieces[] = {"CUDA error: ",
                                        "cuda errr ",
                                        "engine core ",
                                        "EngineCor ",
                                        "NCCL/",
                                        "nccl erro ",
                                        "[TM][",
                                        "errcode:50701",
                                        "50799 ",
                                        "HIP out of ",
                                        "MUSA error: unknow ",
                                        "aicore exceptio ",
                                        "Command buffer execution ",
                                        "illegal memory acces ",
                                        "device-side asser ",
                                        "worker proc ",
                                        "Background loop ",
                                        "terminate calle ",
                                        "EI00",
                                        "ez999 ",
                                        "推理失败 ",
                                        "\u00e9 ",
                                        "0123456789 ",
                                        "aaaaaaaabbbbbbbb ",
                                        "abababab ",
                                        "\n"};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(
      0, sizeof(kPieces) / sizeof(kPieces[0]) - 1);
  std::string out;
  out.reserve(bytes + 64);
  while (out.size() < bytes) out += kPieces[pick(rng)];
  out.resize(bytes);
  return out;
}

std::vector<Input> worst_inputs() {
  std::vector<Input> inputs;
  {
    Input input{"64 frames x 64 KiB near-miss", {}};
    for (int i = 0; i < 64; ++i) {
      input.frames.push_back(Frame("torch", "AcceleratorError", kRuntimeError,
                                   near_miss(64u << 10, 100u + i), "torch.cuda",
                                   i == 0 ? Via::kRoot : Via::kContext, i));
    }
    inputs.push_back(std::move(input));
  }
  {
    Input input{"10,000 frames x 1 KiB (group)", {}};
    for (int i = 0; i < 10000; ++i) {
      input.frames.push_back(
          Frame("vllm.v1.worker", "KeyError", kException,
                near_miss(1u << 10, 7u + i), "vllm.v1.worker.gpu_model_runner",
                i == 0 ? Via::kRoot : Via::kGroupMember, i == 0 ? 0 : 1));
    }
    inputs.push_back(std::move(input));
  }
  {
    // Letters and digits in the shape of the largest rules file's patterns
    // ("[a-z]{1,7}[0-9]q<i>z"), never closed by a 'z'.
    Input input{"64 frames x 64 KiB rule-shaped", {}};
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> pick(0, 15);
    for (int i = 0; i < 64; ++i) {
      std::string text;
      text.reserve(64u << 10);
      while (text.size() < (64u << 10)) {
        const int r = pick(rng);
        text += r < 8 ? static_cast<char>('a' + r)
                      : (r < 14 ? static_cast<char>('0' + r - 8) : 'q');
      }
      input.frames.push_back(Frame("torch", "AcceleratorError", kRuntimeError,
                                   std::move(text), "torch.cuda", Via::kCause,
                                   i));
    }
    inputs.push_back(std::move(input));
  }
  inputs.push_back({"1 frame, 10 MB near-miss",
                    {Frame("builtins", "RuntimeError", kException,
                           near_miss(10u << 20, 3), "torch.nn.functional")}});
  {
    Input input{"64 frames, 4 KiB names", {}};
    for (int i = 0; i < 64; ++i) {
      input.frames.push_back(Frame(
          std::string(4096, 'm'), std::string(4096, 'T'),
          std::vector<std::string>(64, "Base"), near_miss(4u << 10, 50u + i),
          std::string(4096, 'r'), Via::kCause, i));
    }
    inputs.push_back(std::move(input));
  }
  return inputs;
}

// The heaviest rules file the loader accepts: kMaxRulesFileRules rules, each
// a run of character classes at the class-run limit in front of `alternatives`
// distinct literals, so that every position of the text starts a thread in
// every rule. Half message rules, half frame rules; definitive and heuristic.
std::vector<Rule> rules_file(int class_run, int alternatives) {
  std::vector<Rule> rules;
  for (std::size_t i = 0; i < mineru_health::kMaxRulesFileRules; ++i) {
    // class_run - 2 letters, one digit and the alternation (a class of
    // its first characters): a run of exactly class_run.
    std::string pattern = "[a-z]{1," + std::to_string(class_run - 2) +
                          "}[0-9]q" + std::to_string(i) + "(?:";
    for (int a = 0; a < alternatives; ++a) {
      if (a > 0) pattern += "|";
      pattern += "x" + std::to_string(a) + "z";
    }
    pattern += ")";
    rules.push_back(Rule("op.r" + std::to_string(i),
                         i % 2 == 0 ? RuleKind::kFatal : RuleKind::kHeuristic,
                         "operator", pattern,
                         i % 2 == 0 ? RuleTarget::kMessage : RuleTarget::kFrame,
                         RuleScope::kAny, true));
  }
  return rules;
}

// The largest `alternatives` whose file still compiles (with the built-ins)
// within RuleSetLimits: the program-size and memory budgets decide.
std::vector<Rule> largest_rules_file(int* alternatives_out) {
  const mineru_health::RuleSetLimits limits;
  auto fits = [&](int alternatives) {
    return mineru_health::RuleSet::compile(
               mineru_health::merge_rules(
                   mineru_health::builtin_rules(),
                   rules_file(limits.max_class_run, alternatives), {}),
               "bench")
        .ok();
  };
  int low = 1;
  int high = 64;
  while (!fits(low)) return {};
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (fits(mid)) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  *alternatives_out = low;
  return mineru_health::merge_rules(mineru_health::builtin_rules(),
                                    rules_file(limits.max_class_run, low), {});
}

// What a plain marker check costs on the same frames: one lower-cased
// string and four searches.
bool baseline(const std::vector<Frame>& frames) {
  for (const Frame& frame : frames) {
    std::string text =
        frame.module + "." + frame.type_name + " " + frame.message;
    std::transform(text.begin(), text.end(), text.begin(), [](char c) {
      return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    });
    for (const char* marker : {"enginedeaderror", "engine core",
                               "illegal memory access", "nccl error"}) {
      if (text.find(marker) != std::string::npos) return true;
    }
  }
  return false;
}

// Runs `fn` until ~`budget` has passed (at least `min_iterations` times) and
// returns the mean ns per call.
template <typename Fn>
double ns_per_call(Fn&& fn, std::chrono::milliseconds budget,
                   int min_iterations) {
  fn();  // warm-up: page in the input, fill the DFA caches
  long iterations = 0;
  const auto start = Clock::now();
  auto now = start;
  while (iterations < min_iterations || now - start < budget) {
    fn();
    ++iterations;
    now = Clock::now();
  }
  return static_cast<double>(
             std::chrono::duration_cast<std::chrono::nanoseconds>(now - start)
                 .count()) /
         static_cast<double>(iterations);
}

std::size_t input_bytes(const Input& input) {
  std::size_t bytes = 0;
  for (const Frame& frame : input.frames) bytes += frame.message.size();
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::chrono::milliseconds budget(quick ? 50 : 400);

  auto compiled =
      mineru_health::RuleSet::compile(mineru_health::builtin_rules());
  if (!compiled.ok()) {
    for (const auto& error : compiled.errors) {
      std::fprintf(stderr, "%s\n", error.to_string().c_str());
    }
    return 1;
  }
  const Classifier classifier(compiled.rule_set);
  std::printf("classify_bench: %zu builtin rules, budget %lld ms per row\n\n",
              compiled.rule_set->rules().size(),
              static_cast<long long>(budget.count()));
  std::printf("%-38s %10s %14s %14s %8s %10s  %s\n", "input", "bytes",
              "ns/classify", "ns/baseline", "ratio", "MB/s", "verdict");

  std::vector<Input> inputs = real_mix();
  const std::size_t mix_count = inputs.size();
  inputs.push_back(sized("unmatched 1 KB", 1u << 10));
  inputs.push_back(sized("unmatched 100 KB", 100u << 10));
  inputs.push_back(sized("unmatched 10 MB", 10u << 20));

  double mix_total = 0;
  double mix_baseline = 0;
  std::vector<double> sized_ns;
  volatile bool sink = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Input& input = inputs[i];
    const std::size_t bytes = input_bytes(input);
    const int min_iterations = bytes > (1u << 20) ? 3 : 100;
    Classification verdict;
    const double ns =
        ns_per_call([&] { verdict = classifier.classify(input.frames); },
                    budget, min_iterations);
    const double base = ns_per_call([&] { sink = baseline(input.frames); },
                                    budget, min_iterations);
    const double mb_per_s =
        static_cast<double>(bytes) / (ns / 1e9) / (1024.0 * 1024.0);
    std::printf("%-38s %10zu %14.0f %14.0f %8.1f %10.1f  %s\n",
                input.name.c_str(), bytes, ns, base, ns / base, mb_per_s,
                verdict.matched
                    ? (std::string(verdict.fatal ? "fatal " : "task_local ") +
                       verdict.rule)
                          .c_str()
                    : "no match");
    if (i >= mix_count) {
      sized_ns.push_back(ns);
    } else {
      mix_total += ns;
      mix_baseline += base;
    }
  }
  (void)sink;
  std::printf("\nreal mix: mean %.0f ns/classify, %.1fx the baseline\n",
              mix_total / static_cast<double>(mix_count),
              mix_total / mix_baseline);
  if (sized_ns.size() == 3) {
    std::printf(
        "growth: 100KB/1KB = %.1f (size x100), 10MB/100KB = %.1f (size "
        "x102.4); ~linear when close to the size ratio\n",
        sized_ns[1] / sized_ns[0], sized_ns[2] / sized_ns[1]);
  }

  // ---- worst cases, as ratios against the typical case -------------------
  const double typical = mix_total / static_cast<double>(mix_count);
  int alternatives = 0;
  std::vector<Rule> heavy = largest_rules_file(&alternatives);
  const auto compile_start = Clock::now();
  auto heavy_compiled = mineru_health::RuleSet::compile(heavy, "bench");
  const double compile_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - compile_start)
          .count();
  if (!heavy_compiled.ok()) {
    for (const auto& error : heavy_compiled.errors) {
      std::fprintf(stderr, "%s\n", error.to_string().c_str());
    }
    return 1;
  }
  const Classifier heavy_classifier(heavy_compiled.rule_set);
  std::printf(
      "\nworst cases (typical = real-mix mean above, %.0f ns; largest rules "
      "file: %zu rules with %d alternatives each, %zu with the built-ins, "
      "compiled in %.0f ms)\n",
      typical, mineru_health::kMaxRulesFileRules, alternatives,
      heavy_compiled.rule_set->rules().size(), compile_ms);
  std::printf("%-38s %-9s %10s %14s %10s  %s\n", "input", "rules", "bytes",
              "ns/classify", "x typical", "verdict");
  std::vector<Input> worst = real_mix();
  worst.resize(1);  // the typical EngineDeadError, for the rules-file row
  for (Input& input : worst_inputs()) worst.push_back(std::move(input));
  double worst_ratio = 0;
  for (const Input& input : worst) {
    for (int which = 0; which < 2; ++which) {
      const Classifier& c = which == 0 ? classifier : heavy_classifier;
      Classification verdict;
      const double ns =
          ns_per_call([&] { verdict = c.classify(input.frames); }, budget, 3);
      worst_ratio = std::max(worst_ratio, ns / typical);
      std::printf("%-38s %-9s %10zu %14.0f %10.1f  %s\n", input.name.c_str(),
                  which == 0 ? "builtin" : "2000-file", input_bytes(input), ns,
                  ns / typical,
                  verdict.matched ? verdict.rule.c_str() : "no match");
    }
  }
  std::printf("worst/typical = %.0fx\n", worst_ratio);
  return 0;
}
