// classify() cost: ns per call on a mix of real failure chains and on
// unmatched messages of 1 KB, 100 KB and 10 MB (the worst case: every form
// of every frame is scanned to the end). Inputs are generated; nothing is
// read. A baseline in the same run (lower-casing the text and four
// std::string::find calls, roughly what a hand-written marker check costs)
// turns the absolute numbers into ratios that survive a change of machine.
//
//   build/<dir>/classify_bench [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mineru_health/classifier.h"

namespace {

using mineru_health::Classifier;
using mineru_health::Frame;
using mineru_health::Verdict;
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
    Verdict verdict;
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
                       verdict.rule_id)
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
  return 0;
}
