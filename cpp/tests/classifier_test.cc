// Classifier tests, table-driven on messages that vLLM, SGLang, lmdeploy,
// PyTorch, pypdfium2, PIL and MinerU really raise. Assertions are on verdicts
// only, never on time.
#include "mineru_health/classifier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

namespace mineru_health {
namespace {

const std::vector<std::string> kException = {"Exception", "BaseException"};
const std::vector<std::string> kRuntimeError = {"RuntimeError", "Exception",
                                                "BaseException"};
const std::vector<std::string> kValueError = {"ValueError", "Exception",
                                              "BaseException"};

Frame builtin(std::string type, std::vector<std::string> bases,
              std::string message) {
  return Frame{"builtins", std::move(type), std::move(bases),
               std::move(message)};
}

Frame runtime_error(std::string message) {
  return builtin("RuntimeError", {"Exception", "BaseException"},
                 std::move(message));
}

Frame v1_engine_dead() {
  return Frame{"vllm.v1.engine.exceptions", "EngineDeadError", kException,
               "EngineCore encountered an issue. See stack trace (above) for "
               "the root cause."};
}

Frame v1_engine_generate_error() {
  return Frame{"vllm.v1.engine.exceptions", "EngineGenerateError", kException,
               ""};
}

Frame torch_cuda_error(std::string what) {
  return Frame{"torch", "AcceleratorError", kRuntimeError,
               "CUDA error: " + what +
                   "\nCUDA kernel errors might be asynchronously reported at "
                   "some other API call, so the stacktrace below might be "
                   "incorrect.\nFor debugging consider passing "
                   "CUDA_LAUNCH_BLOCKING=1\nCompile with "
                   "`TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"};
}

Frame cuda_oom() {
  return Frame{"torch", "OutOfMemoryError", kRuntimeError,
               "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
               "total capacity of 79.25 GiB of which 1.19 GiB is free."};
}

std::shared_ptr<const RuleSet> builtin_set() {
  static const std::shared_ptr<const RuleSet> set = [] {
    CompileResult result = RuleSet::compile(builtin_rules());
    EXPECT_TRUE(result.ok());
    for (const RuleError& error : result.errors) {
      ADD_FAILURE() << error.to_string();
    }
    return result.rule_set;
  }();
  return set;
}

bool is_valid_utf8(const std::string& s) { return sanitize_utf8(s) == s; }

struct Case {
  const char* name;
  std::vector<Frame> frames;
  bool fatal;
  const char* rule_id;  // "" when nothing may match
  int frame_index;
};

std::vector<Case> cases() {
  return {
      // ---- vLLM, fatal -------------------------------------------------
      {"v1_engine_dead", {v1_engine_dead()}, true, "vllm.engine_dead", 0},
      {"v0_background_loop_errored",
       {{"vllm.engine.async_llm_engine", "AsyncEngineDeadError", kRuntimeError,
         "Background loop has errored already."}},
       true,
       "vllm.v0.engine_dead",
       0},
      {"v0_background_loop_not_running_message_only",
       {runtime_error("Background loop is not running. If it was running, "
                      "inspect the output to find the stacktrace of the error "
                      "that caused the background loop to stop "
                      "(AsyncEngineDeadError).")},
       true,
       "vllm.v0.engine_dead",
       0},
      {"v0_mq_engine_dead",
       {{"vllm.engine.multiprocessing", "MQEngineDeadError", kRuntimeError,
         "Engine loop is not running. Inspect the stacktrace to find the "
         "original error: RuntimeError('Engine process (pid 402494) died.')."}},
       true,
       "vllm.v0.engine_dead",
       0},
      {"v0_engine_loop_message_in_http_error",
       {{"openai",
         "InternalServerError",
         {"APIStatusError", "APIError"},
         "Error code: 500 - Engine loop is not running. Inspect the "
         "stacktrace to find the original error: RuntimeError('Engine loop "
         "has died')."}},
       true,
       "vllm.v0.engine_loop",
       0},
      {"v1_engine_core_init_failed",
       {runtime_error("Engine core initialization failed. See root cause "
                      "above. Failed core proc(s): {}")},
       true,
       "vllm.engine_core_init_failed",
       0},
      {"v1_message_rewrapped",
       {runtime_error("parse failed: EngineCore encountered an issue. See "
                      "stack trace (above) for the root cause.")},
       true,
       "vllm.engine_core_issue",
       0},
      {"v1_message_shouted",
       {runtime_error("ENGINECORE ENCOUNTERED AN ISSUE")},
       true,
       "vllm.engine_core_issue",
       0},
      {"v1_core_proc_died",
       {runtime_error("Engine core proc EngineCore_DP0 died unexpectedly, "
                      "shutting down client.")},
       true,
       "vllm.engine_core_proc_died",
       0},
      // ---- compact form --------------------------------------------------
      {"compact_snake_case_type",
       {{"my.wrapper", "Engine_Dead_Error", kException, "boom"}},
       true,
       "vllm.engine_dead",
       0},
      {"compact_kebab_message",
       {runtime_error("worker saw engine-dead-error from the backend")},
       true,
       "vllm.engine_dead",
       0},
      {"compact_spaced_message",
       {runtime_error("Engine Dead Error!")},
       true,
       "vllm.engine_dead",
       0},
      {"lmdeploy_engine_stop_error_compact",
       {runtime_error("generation failed with status "
                      "ResponseType.ENGINE_STOP_ERROR")},
       true,
       "lmdeploy.engine_stop_error",
       0},
      // ---- SGLang / lmdeploy / generic ------------------------------------
      {"sglang_scheduler_dead",
       {builtin("EOFError", {"Exception", "BaseException"},
                "Rank 0 scheduler is dead. Please check if there are "
                "relevant logs.")},
       true,
       "sglang.scheduler_dead",
       0},
      {"sglang_scheduler_hit_exception",
       {runtime_error("[2025-01-20 19:10:07 TP0] Scheduler hit an exception: "
                      "Traceback (most recent call last):")},
       true,
       "sglang.subprocess_exception",
       0},
      {"sglang_sigquit",
       {runtime_error("Received sigquit from a child process. It usually "
                      "means the child failed.")},
       true,
       "sglang.child_failed",
       0},
      {"lmdeploy_main_loop_stopped",
       {runtime_error("PyTorch engine main loop has stopped.")},
       true,
       "lmdeploy.engine_loop_stopped",
       0},
      {"lmdeploy_request_loop_not_alive",
       {runtime_error("PyTorch engine request loop is not alive.")},
       true,
       "lmdeploy.engine_loop_stopped",
       0},
      {"generic_engine_gone",
       {runtime_error("The inference engine is gone")},
       true,
       "engine.dead",
       0},
      {"generic_unrecoverable",
       {runtime_error("vLLM is in an unrecoverable state, restart required")},
       true,
       "engine.unrecoverable",
       0},
      // ---- CUDA and NCCL ---------------------------------------------------
      {"cuda_illegal_memory_access",
       {torch_cuda_error("an illegal memory access was encountered")},
       true,
       "cuda.illegal_address",
       0},
      {"cuda_device_side_assert",
       {torch_cuda_error("device-side assert triggered")},
       true,
       "cuda.device_assert",
       0},
      {"cuda_unspecified_launch_failure",
       {torch_cuda_error("unspecified launch failure")},
       true,
       "cuda.launch_failure",
       0},
      {"cuda_ecc",
       {torch_cuda_error("uncorrectable ECC error encountered")},
       true,
       "cuda.ecc_uncorrectable",
       0},
      {"cuda_misaligned",
       {torch_cuda_error("misaligned address")},
       true,
       "cuda.misaligned_address",
       0},
      {"cuda_illegal_instruction",
       {torch_cuda_error("an illegal instruction was encountered")},
       true,
       "cuda.illegal_instruction",
       0},
      {"cuda_error_enum_name",
       {runtime_error("Cuda failure cudaErrorIllegalAddress at kernel.cu:42")},
       true,
       "cuda.illegal_address",
       0},
      {"nccl_unhandled_cuda_error",
       {{"torch.distributed", "DistBackendError", kRuntimeError,
         "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:"
         "275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
         "NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function "
         "failed."}},
       true,
       "nccl.error",
       0},
      {"nccl_system_error_code_only",
       {runtime_error("ncclSystemError: System call (e.g. socket, malloc) or "
                      "external library call failed or device error.")},
       true,
       "nccl.error_code",
       0},
      {"nccl_watchdog",
       {runtime_error("[Rank 0] Watchdog caught collective operation "
                      "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
                      "Timeout(ms)=600000) ran for 600071 milliseconds "
                      "before timing out.")},
       true,
       "nccl.watchdog_timeout",
       0},
      // ---- chains ----------------------------------------------------------
      {"fatal_deep_in_cause_chain",
       {runtime_error("task 7 failed"),
        builtin("ValueError", kValueError, "page 3"), v1_engine_dead()},
       true,
       "vllm.engine_dead",
       2},
      {"first_fatal_frame_decides",
       {runtime_error("wrapper"),
        torch_cuda_error("an illegal memory access was encountered"),
        v1_engine_dead()},
       true,
       "cuda.illegal_address",
       1},
      {"task_local_wins_over_outer_fatal",
       {v1_engine_dead(), v1_engine_generate_error()},
       false,
       "vllm.engine_generate_error",
       1},
      {"task_local_wins_over_inner_fatal",
       {{"pypdfium2._helpers.misc", "PdfiumError", kRuntimeError,
         "Failed to load document (PDFium: Data format error)."},
        torch_cuda_error("misaligned address")},
       false,
       "pdfium.error",
       0},
      {"oom_does_not_mask_engine_death",
       {v1_engine_dead(), cuda_oom()},
       true,
       "vllm.engine_dead",
       0},
      // ---- task-local ------------------------------------------------------
      {"v1_engine_generate_error",
       {v1_engine_generate_error()},
       false,
       "vllm.engine_generate_error",
       0},
      {"vllm_decoder_prompt_too_long",
       {builtin("ValueError", kValueError,
                "The decoder prompt (length 12324) is longer than the maximum "
                "model length of 8192. Make sure that `max_model_len` is no "
                "smaller than the number of text tokens plus multimodal "
                "tokens.")},
       false,
       "vllm.context_length",
       0},
      {"vllm_openai_context_length",
       {{"openai",
         "BadRequestError",
         {"APIStatusError", "APIError"},
         "Error code: 400 - {'object': 'error', 'message': \"This model's "
         "maximum context length is 16384 tokens. However, you requested "
         "17000 tokens (16000 in the messages, 1000 in the completion).\", "
         "'type': 'BadRequestError', 'code': 400}"}},
       false,
       "vllm.context_length",
       0},
      {"pdfium_bad_format",
       {{"pypdfium2._helpers.misc", "PdfiumError", kRuntimeError,
         "Failed to load document (PDFium: Data format error)."}},
       false,
       "pdfium.error",
       0},
      {"pdfium_password",
       {{"pypdfium2._helpers.misc", "PdfiumError", kRuntimeError,
         "Failed to load document (PDFium: Incorrect password error)."}},
       false,
       "pdfium.error",
       0},
      {"mineru_load_file_chinese_name",
       {runtime_error("Failed to load file 年度报告（终稿）.pdf: [Errno 2] No "
                      "such file or directory"),
        builtin("FileNotFoundError", {"OSError", "Exception", "BaseException"},
                "[Errno 2] No such file or directory")},
       false,
       "mineru.load_file_failed",
       0},
      {"pil_unidentified",
       {{"PIL",
         "UnidentifiedImageError",
         {"OSError", "Exception", "BaseException"},
         "cannot identify image file <_io.BytesIO object at 0x7f3a2c1b2d10>"}},
       false,
       "pil.unidentified_image",
       0},
      {"pil_decompression_bomb",
       {{"PIL.Image", "DecompressionBombError", kException,
         "Image size (200000000 pixels) exceeds limit of 178956970 pixels, "
         "could be decompression bomb DOS attack."}},
       false,
       "pil.decompression_bomb",
       0},
      {"mineru_render_timeout",
       {builtin("TimeoutError", {"OSError", "Exception", "BaseException"},
                "PDF image rendering timeout after 300s for pages 1-10")},
       false,
       "mineru.render_timeout",
       0},
      {"asyncio_cancelled",
       {{"asyncio.exceptions", "CancelledError", {"BaseException"}, ""}},
       false,
       "request.cancelled",
       0},
      {"openai_api_timeout",
       {{"openai",
         "APITimeoutError",
         {"APIConnectionError", "APIError", "OpenAIError", "Exception"},
         "Request timed out."}},
       false,
       "request.timeout",
       0},
      {"httpx_read_timeout",
       {{"httpx",
         "ReadTimeout",
         {"TimeoutException", "TransportError"},
         "timed out"}},
       false,
       "request.timeout",
       0},
      {"mineru_vl_utils_request_error",
       {{"mineru_vl_utils.vlm_client.base_client", "RequestError", kValueError,
         "The output was truncated due to length limit."}},
       false,
       "mineru_vl_utils.request_error",
       0},
      // ---- Chinese and odd text --------------------------------------------
      {"chinese_message_with_fatal_marker",
       {runtime_error("推理失败：EngineDeadError，引擎已退出")},
       true,
       "vllm.engine_dead",
       0},
      {"chinese_type_and_cuda_message",
       {{"业务.异常", "推理错误", kException,
         "CUDA 错误：an illegal memory access was encountered"}},
       true,
       "cuda.illegal_address",
       0},
      {"surrogatepass_bytes_around_marker",
       {runtime_error("\xED\xA0\x80 EngineDeadError \xED\xBF\xBF")},
       true,
       "vllm.engine_dead",
       0},
      {"invalid_utf8_then_marker",
       {runtime_error("\xFF\xFE\xC0\xAF garbage; Background loop has errored "
                      "already.")},
       true,
       "vllm.v0.background_loop",
       0},
      {"nul_bytes_in_message",
       {runtime_error(std::string("page\0data\0", 10) +
                      "unspecified launch failure")},
       true,
       "cuda.launch_failure",
       0},
      // ---- no match: task-local by default ---------------------------------
      {"closed_image_is_not_a_rule",
       {builtin("ValueError", kValueError, "Operation on closed image")},
       false,
       "",
       -1},
      {"cuda_oom_is_not_a_rule", {cuda_oom()}, false, "", -1},
      {"engine_deadline_is_not_engine_dead",
       {runtime_error("engine deadline exceeded for page 4")},
       false,
       "",
       -1},
      {"timeout_only_mentioned_in_message",
       {builtin("ValueError", kValueError,
                "TimeoutError while reading page; request timed out")},
       false,
       "",
       -1},
      {"plain_key_error",
       {builtin("KeyError", {"LookupError", "Exception"}, "'engine'")},
       false,
       "",
       -1},
      // ---- frames parsed from printed tracebacks (no module, no bases) ----
      {"text_frame_without_module",
       {Frame{"", "TimeoutError", {}, "timed out"}},
       false,
       "request.timeout",
       0},
      {"text_frame_message_only",
       {Frame{"", "", {}, "EngineCore encountered an issue."}},
       true,
       "vllm.engine_core_issue",
       0},
      {"no_frames", {}, false, "", -1},
      {"empty_frame", {Frame{}}, false, "", -1},
  };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class BuiltinCases : public ::testing::TestWithParam<Case> {};

TEST_P(BuiltinCases, Verdict) {
  const Case& c = GetParam();
  Classifier classifier(builtin_set());
  const Verdict verdict = classifier.classify(c.frames);
  const std::string expected_rule = c.rule_id;
  EXPECT_EQ(verdict.fatal, c.fatal);
  EXPECT_EQ(verdict.matched, !expected_rule.empty());
  EXPECT_EQ(verdict.rule_id, expected_rule);
  EXPECT_EQ(verdict.frame_index, c.frame_index);
  EXPECT_TRUE(is_valid_utf8(verdict.excerpt)) << verdict.excerpt;
  EXPECT_LE(verdict.excerpt.size(), ClassifierLimits{}.excerpt_bytes);
  if (verdict.matched) {
    EXPECT_FALSE(verdict.category.empty());
  } else {
    EXPECT_TRUE(verdict.category.empty());
    EXPECT_TRUE(verdict.excerpt.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Real, BuiltinCases, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(p.param.name);
                         });

TEST(Classifier, BuiltinTableIsLarge) { EXPECT_GE(cases().size(), 40u); }

TEST(Classifier, CategoriesOfBothKinds) {
  Classifier classifier(builtin_set());
  Verdict fatal = classifier.classify({v1_engine_dead()});
  EXPECT_EQ(fatal.category, "engine_dead");
  Verdict local =
      classifier.classify({{"pypdfium2._helpers.misc", "PdfiumError",
                            kRuntimeError, "Failed to load document."}});
  EXPECT_EQ(local.category, "bad_input");
  EXPECT_EQ(
      classifier.classify({torch_cuda_error("misaligned address")}).category,
      "cuda");
}

TEST(Classifier, ExcerptSurroundsTheMatch) {
  Classifier classifier(builtin_set(), ClassifierLimits{64, 1u << 20, 40});
  std::string message(5000, 'x');
  message += " an illegal memory access was encountered ";
  message += std::string(5000, 'y');
  Verdict verdict = classifier.classify({runtime_error(message)});
  ASSERT_TRUE(verdict.fatal);
  EXPECT_LE(verdict.excerpt.size(), 40u);
  EXPECT_NE(verdict.excerpt.find("illegal memory access"), std::string::npos)
      << verdict.excerpt;
}

TEST(Classifier, ExcerptKeepsUtf8WholeAroundChinese) {
  Classifier classifier(builtin_set(), ClassifierLimits{64, 1u << 20, 31});
  std::string message;
  for (int i = 0; i < 200; ++i) message += "引擎";
  message += "EngineDeadError";
  for (int i = 0; i < 200; ++i) message += "退出";
  Verdict verdict = classifier.classify({runtime_error(message)});
  ASSERT_TRUE(verdict.fatal);
  EXPECT_LE(verdict.excerpt.size(), 31u);
  EXPECT_TRUE(is_valid_utf8(verdict.excerpt));
  EXPECT_FALSE(verdict.excerpt.empty());
}

TEST(Classifier, ExcerptFromMessageHeadWhenOnlyCompactMatched) {
  Classifier classifier(builtin_set(), ClassifierLimits{64, 1u << 20, 10});
  Verdict verdict =
      classifier.classify({runtime_error("Engine-Dead-Error happened here")});
  ASSERT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.excerpt, "Engine-Dea");
}

// ---- hostile input ---------------------------------------------------------

std::string pseudo_random_bytes(std::size_t size, std::uint32_t seed) {
  std::string out(size, '\0');
  std::uint32_t state = seed;
  for (char& c : out) {
    state = state * 1664525u + 1013904223u;
    c = static_cast<char>(state >> 24);
  }
  return out;
}

TEST(ClassifierHostile, TenMegabyteMessageMarkerAtEnd) {
  Classifier classifier(builtin_set());
  std::string message(10u << 20, 'a');
  message += " EngineDeadError";
  Verdict verdict = classifier.classify({runtime_error(message)});
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.rule_id, "vllm.engine_dead");
  EXPECT_LE(verdict.excerpt.size(), ClassifierLimits{}.excerpt_bytes);
}

TEST(ClassifierHostile, TenMegabytesOfRandomBytes) {
  Classifier classifier(builtin_set());
  Verdict verdict = classifier.classify(
      {runtime_error(pseudo_random_bytes(10u << 20, 12345))});
  EXPECT_FALSE(verdict.matched);
  EXPECT_FALSE(verdict.fatal);
}

TEST(ClassifierHostile, RandomBytesEverywhereWithMarkerInTail) {
  Classifier classifier(builtin_set());
  Frame frame{pseudo_random_bytes(4096, 1),
              pseudo_random_bytes(4096, 2),
              {pseudo_random_bytes(4096, 3)},
              pseudo_random_bytes(1u << 20, 4) + " misaligned address"};
  Verdict verdict = classifier.classify({frame});
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.rule_id, "cuda.misaligned_address");
  EXPECT_TRUE(is_valid_utf8(verdict.excerpt));
}

TEST(ClassifierHostile, LongMessageKeepsHeadAndTail) {
  ClassifierLimits limits;
  limits.max_message_bytes = 1000;
  Classifier classifier(builtin_set(), limits);
  const std::string filler(100000, 'z');
  EXPECT_TRUE(
      classifier.classify({runtime_error("EngineDeadError " + filler)}).fatal);
  EXPECT_TRUE(
      classifier.classify({runtime_error(filler + " EngineDeadError")}).fatal);
  // Only the middle is dropped.
  EXPECT_FALSE(
      classifier
          .classify({runtime_error(filler + " EngineDeadError " + filler)})
          .matched);
}

TEST(ClassifierHostile, TenThousandFrames) {
  std::vector<Frame> frames(10000, runtime_error("nothing to see"));
  frames.back() = v1_engine_dead();
  // Default limits look at the first 64 frames only.
  EXPECT_FALSE(Classifier(builtin_set()).classify(frames).matched);

  ClassifierLimits limits;
  limits.max_frames = 10000;
  Verdict verdict = Classifier(builtin_set(), limits).classify(frames);
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.frame_index, 9999);
}

TEST(ClassifierHostile, HugeNamesAndManyBases) {
  Frame frame{std::string(1u << 20, 'm'), std::string(1u << 20, 'T'),
              std::vector<std::string>(10000, "Base"), "EngineDeadError"};
  EXPECT_TRUE(Classifier(builtin_set()).classify({frame}).fatal);
}

TEST(ClassifierHostile, ZeroLimitsDoNotCrash) {
  Verdict verdict = Classifier(builtin_set(), ClassifierLimits{1, 0, 0})
                        .classify({v1_engine_dead()});
  // With no message bytes, the type name alone still decides.
  EXPECT_TRUE(verdict.fatal);
  EXPECT_TRUE(verdict.excerpt.empty());
  EXPECT_FALSE(Classifier(builtin_set(), ClassifierLimits{0, 0, 0})
                   .classify({v1_engine_dead()})
                   .matched);
}

TEST(Classifier, NullRuleSetMatchesNothing) {
  Classifier classifier(nullptr);
  EXPECT_FALSE(classifier.classify({v1_engine_dead()}).matched);
}

TEST(Classifier, ConcurrentCallersAgree) {
  Classifier classifier(builtin_set());
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (!classifier.classify({v1_engine_dead()}).fatal) ++wrong;
        if (classifier.classify({v1_engine_generate_error()}).fatal) ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

// ---- RuleSet::compile ------------------------------------------------------

TEST(RuleSetCompile, BuiltinsCompile) {
  CompileResult result = RuleSet::compile(builtin_rules());
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.rule_set->rules().size(), builtin_rules().size());
  bool has_fatal = false;
  bool has_task_local = false;
  for (const Rule& rule : builtin_rules()) {
    has_fatal |= rule.kind == RuleKind::kFatal;
    has_task_local |= rule.kind == RuleKind::kTaskLocal;
  }
  EXPECT_TRUE(has_fatal);
  EXPECT_TRUE(has_task_local);
}

TEST(RuleSetCompile, ErrorsAreValuesAndAllOrNothing) {
  std::vector<Rule> rules = {
      {"ok.rule", RuleKind::kFatal, "x", "fine"},
      {"bad id", RuleKind::kFatal, "x", "fine"},
      {"ok.rule", RuleKind::kTaskLocal, "x", "dup"},
      {"bad.pattern", RuleKind::kFatal, "x", "(unclosed"},
      {"empty.pattern", RuleKind::kFatal, "x", ""},
  };
  CompileResult result = RuleSet::compile(rules, "test-source");
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.rule_set, nullptr);
  ASSERT_EQ(result.errors.size(), 4u);
  EXPECT_EQ(result.errors[0].rule_id, "bad id");
  EXPECT_EQ(result.errors[1].rule_id, "ok.rule");
  EXPECT_NE(result.errors[1].message.find("duplicate"), std::string::npos);
  EXPECT_EQ(result.errors[2].rule_id, "bad.pattern");
  EXPECT_NE(result.errors[2].message.find("missing )"), std::string::npos)
      << result.errors[2].message;
  EXPECT_EQ(result.errors[2].source, "test-source");
  EXPECT_EQ(result.errors[3].rule_id, "empty.pattern");
}

TEST(RuleSetCompile, OnlyOneKindPresent) {
  CompileResult result = RuleSet::compile(
      {{"only.local", RuleKind::kTaskLocal, "bad_input", "corrupt"}});
  ASSERT_TRUE(result.ok());
  Classifier classifier(result.rule_set);
  EXPECT_FALSE(classifier.classify({v1_engine_dead()}).matched);
  Verdict verdict = classifier.classify({runtime_error("Corrupt xref")});
  EXPECT_TRUE(verdict.matched);
  EXPECT_FALSE(verdict.fatal);
}

TEST(RuleSetCompile, RuleOrderBreaksTies) {
  CompileResult result = RuleSet::compile({
      {"first", RuleKind::kFatal, "a", "boom"},
      {"second", RuleKind::kFatal, "b", "bo+m"},
  });
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(
      Classifier(result.rule_set).classify({runtime_error("boom")}).rule_id,
      "first");
}

TEST(RuleKindTest, ToString) {
  EXPECT_STREQ(to_string(RuleKind::kFatal), "fatal");
  EXPECT_STREQ(to_string(RuleKind::kTaskLocal), "task_local");
}

// ---- text forms ------------------------------------------------------------

struct FormCase {
  const char* name;
  std::string input;
  std::string sanitized;
  std::string compact;
};

void PrintTo(const FormCase& c, std::ostream* os) { *os << c.name; }

class TextForms : public ::testing::TestWithParam<FormCase> {};

TEST_P(TextForms, SanitizeAndCompact) {
  const FormCase& c = GetParam();
  EXPECT_EQ(sanitize_utf8(c.input), c.sanitized);
  EXPECT_EQ(compact_form(sanitize_utf8(c.input)), c.compact);
}

INSTANTIATE_TEST_SUITE_P(
    Forms, TextForms,
    ::testing::Values(
        FormCase{"ascii", "Engine_Dead", "Engine_Dead", "enginedead"},
        FormCase{"punctuation", "engine-dead!", "engine-dead!", "enginedead"},
        FormCase{"camel", "EngineDead", "EngineDead", "enginedead"},
        FormCase{"chinese", "引擎 已-退出", "引擎 已-退出", "引擎已退出"},
        FormCase{"fullwidth", "ＡＢ：c", "ＡＢ：c", "ＡＢ：c"},
        FormCase{"invalid_run",
                 "a\xFF\xFE"
                 "b",
                 "a\xEF\xBF\xBD"
                 "b",
                 "a\xEF\xBF\xBD"
                 "b"},
        FormCase{"surrogate", "x\xED\xA0\x80y", "x\xEF\xBF\xBDy",
                 "x\xEF\xBF\xBDy"},
        FormCase{"overlong", "\xC0\xAF", "\xEF\xBF\xBD", "\xEF\xBF\xBD"},
        FormCase{"truncated", "ok\xE4\xB8", "ok\xEF\xBF\xBD", "ok\xEF\xBF\xBD"},
        FormCase{"above_max", "\xF4\x90\x80\x80", "\xEF\xBF\xBD",
                 "\xEF\xBF\xBD"},
        FormCase{"four_byte_ok", "\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80",
                 "\xF0\x9F\x98\x80"},
        FormCase{"empty", "", "", ""}),
    [](const ::testing::TestParamInfo<FormCase>& p) {
      return std::string(p.param.name);
    });

}  // namespace
}  // namespace mineru_health
