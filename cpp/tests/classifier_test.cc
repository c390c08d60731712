// Classifier tests, table-driven: real messages that vLLM, lmdeploy, PyTorch,
// torch_npu, MLX, pypdfium2, PIL and MinerU raise; then the precedence rules
// of docs/rules.md ("Deciding"), one table row per rule; origin scopes;
// remote engines; bounds. Assertions are on verdicts only, never on time.
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
              std::string message, std::string raised_in = "") {
  Frame frame{"builtins", std::move(type), std::move(bases),
              std::move(message)};
  frame.raised_in = std::move(raised_in);
  return frame;
}

Frame runtime_error(std::string message, std::string raised_in = "") {
  return builtin("RuntimeError", kException, std::move(message),
                 std::move(raised_in));
}

Frame raised_in(Frame frame, std::string module) {
  frame.raised_in = std::move(module);
  return frame;
}

Frame at(Frame frame, int depth, Via via) {
  frame.depth = depth;
  frame.via = via;
  return frame;
}

// mineru_llama_cpp's exception classes, raised from its engine.py.
Frame llama_error(std::string type, std::string message) {
  return raised_in(Frame{"mineru_llama_cpp.exceptions",
                         std::move(type),
                         {"MineruLlamaCppError", "Exception", "BaseException"},
                         std::move(message)},
                   "mineru_llama_cpp.engine");
}

// mineru_vl_utils' LlamaCppEngineVlmClient re-raising str(EngineError).
Frame llama_server_error(std::string message) {
  return raised_in(Frame{"mineru_vl_utils.vlm_client.base_client",
                         "ServerError", kRuntimeError, std::move(message)},
                   "mineru_vl_utils.vlm_client.llama_cpp_engine_client");
}

Frame v1_engine_dead() {
  return raised_in(
      Frame{"vllm.v1.engine.exceptions", "EngineDeadError", kException,
            "EngineCore encountered an issue. See stack trace (above) for "
            "the root cause."},
      "vllm.v1.engine.core_client");
}

Frame v1_engine_generate_error() {
  return raised_in(
      Frame{"vllm.v1.engine.exceptions", "EngineGenerateError", kException, ""},
      "vllm.v1.engine.async_llm");
}

Frame cancelled() {
  return raised_in(
      Frame{"asyncio.exceptions", "CancelledError", {"BaseException"}, ""},
      "asyncio.queues");
}

Frame timeout_error() {
  return builtin("TimeoutError", {"OSError", "Exception", "BaseException"}, "",
                 "asyncio.timeouts");
}

Frame torch_cuda_error(std::string what) {
  return raised_in(
      Frame{"torch", "AcceleratorError", kRuntimeError,
            "CUDA error: " + what +
                "\nCUDA kernel errors might be asynchronously reported at "
                "some other API call, so the stacktrace below might be "
                "incorrect.\nFor debugging consider passing "
                "CUDA_LAUNCH_BLOCKING=1\nCompile with "
                "`TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"},
      "torch.cuda");
}

Frame cuda_oom(std::string site = "torch.nn.modules.conv") {
  return raised_in(
      Frame{"torch", "OutOfMemoryError", kRuntimeError,
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 79.25 GiB of which 1.19 GiB is free."},
      std::move(site));
}

Frame pdfium_error() {
  return raised_in(
      Frame{"pypdfium2._helpers.misc", "PdfiumError", kRuntimeError,
            "Failed to load document (PDFium: Data format "
            "error)."},
      "pypdfium2._helpers.document");
}

// The crafted .docx of issue 8: lxml quotes the document's tag name.
Frame lxml_tag_mismatch() {
  return raised_in(
      Frame{"lxml.etree",
            "XMLSyntaxError",
            {"ParseError", "LxmlSyntaxError", "LxmlError", "Error",
             "SyntaxError", "Exception", "BaseException"},
            "Opening and ending tag mismatch: EngineDeadError line 1 and "
            "body, line 1, column 80: EngineCore encountered an issue. "
            "CUDA error: an illegal memory access was encountered"},
      "src.lxml.etree");
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
  bool ambiguous = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

void expect_verdict(const Case& c, const Classification& verdict) {
  const std::string expected_rule = c.rule_id;
  EXPECT_EQ(verdict.fatal, c.fatal);
  EXPECT_EQ(verdict.ambiguous, c.ambiguous);
  EXPECT_EQ(verdict.matched, !expected_rule.empty());
  EXPECT_EQ(verdict.rule, expected_rule);
  EXPECT_EQ(verdict.frame_index, c.frame_index);
  EXPECT_TRUE(is_valid_utf8(verdict.excerpt)) << verdict.excerpt;
  EXPECT_LE(verdict.excerpt.size(), ClassifierLimits{}.excerpt_bytes);
  if (verdict.matched) {
    EXPECT_FALSE(verdict.category.empty());
    EXPECT_EQ(verdict.fatal, is_fatal(verdict.rule_kind));
  } else {
    EXPECT_TRUE(verdict.category.empty());
    EXPECT_TRUE(verdict.excerpt.empty());
  }
}

// ---- real failures, one frame or a plain chain ------------------------------

std::vector<Case> real_cases() {
  return {
      // vLLM V1 / V0
      {"v1_engine_dead", {v1_engine_dead()}, true, "vllm.engine_dead", 0},
      {"v0_background_loop_errored",
       {raised_in({"vllm.engine.async_llm_engine", "AsyncEngineDeadError",
                   kRuntimeError, "Background loop has errored already."},
                  "vllm.engine.async_llm_engine")},
       true,
       "vllm.v0.engine_dead",
       0},
      {"v0_background_loop_message_only",
       {runtime_error("Background loop is not running. If it was running, "
                      "inspect the output to find the stacktrace of the error "
                      "that caused the background loop to stop "
                      "(AsyncEngineDeadError).",
                      "vllm.engine.async_llm_engine")},
       true,
       "vllm.v0.background_loop",
       0},
      {"v0_mq_engine_dead",
       {raised_in(
           {"vllm.engine.multiprocessing", "MQEngineDeadError", kRuntimeError,
            "Engine loop is not running. Inspect the stacktrace to "
            "find the original error: RuntimeError('Engine process "
            "(pid 402494) died.')."},
           "vllm.engine.multiprocessing.client")},
       true,
       "vllm.v0.engine_dead",
       0},
      {"v1_engine_core_init_failed",
       {runtime_error("Engine core initialization failed. See root cause "
                      "above. Failed core proc(s): {}",
                      "vllm.v1.engine.utils")},
       true,
       "vllm.engine_core_init_failed",
       0},
      {"v1_kv_cache_start",
       {builtin("ValueError", kValueError,
                "No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine.",
                "vllm.v1.core.kv_cache_utils")},
       true,
       "vllm.kv_cache_start",
       0},
      {"v1_message_rewrapped_by_engine",
       {runtime_error("EngineCore encountered an issue. See stack trace "
                      "(above) for the root cause.",
                      "vllm.entrypoints.llm")},
       true,
       "vllm.engine_core_issue",
       0},
      {"v1_core_proc_died",
       {runtime_error("Engine core proc EngineCore_DP0 died unexpectedly, "
                      "shutting down client.")},
       true,
       "vllm.engine_core_fatal",
       0},
      {"v1_rpc_timeout",
       {builtin("TimeoutError", {"OSError", "Exception"},
                "RPC call to execute_model timed out.",
                "vllm.v1.executor.multiproc_executor")},
       true,
       "vllm.rpc_timeout",
       0},
      {"scheduler_assertion_kills_loop",
       {builtin("AssertionError", kException, "",
                "vllm.v1.core.sched.scheduler")},
       true,
       "engine.loop_error",
       0},
      {"prefill_oom_in_model_runner",
       {cuda_oom("vllm.v1.worker.gpu_model_runner")},
       true,
       "engine.loop_oom",
       0},
      {"ray_actor_died",
       {raised_in({"ray.exceptions",
                   "ActorDiedError",
                   {"RayActorError", "RayError", "Exception"},
                   "The actor died unexpectedly before finishing this task."},
                  "ray._private.worker")},
       true,
       "ray.actor_died",
       0},
      // lmdeploy
      {"lmdeploy_rpc_server_dead",
       {raised_in(
           {"lmdeploy.pytorch.engine.mp_engine.zmq_rpc", "RPCServerDeadError",
            kRuntimeError, "PyTorch ZMQ engine process is not alive."},
           "lmdeploy.pytorch.engine.mp_engine.zmq_rpc")},
       true,
       "lmdeploy.rpc_server_dead",
       0},
      {"lmdeploy_main_loop_stopped",
       {runtime_error("PyTorch engine main loop has stopped.",
                      "lmdeploy.pytorch.engine.engine")},
       true,
       "lmdeploy.engine_loop_stopped",
       0},
      {"lmdeploy_engine_stop_error_compact",
       {runtime_error("generation failed with status "
                      "ResponseType.ENGINE_STOP_ERROR",
                      "lmdeploy.serve.async_engine")},
       true,
       "lmdeploy.engine_stop_error",
       0},
      // CUDA and CUDA-like devices
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
      {"cublas_execution_failed",
       {runtime_error("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when "
                      "calling `cublasGemmEx( handle, opa, opb, m, n, k, "
                      "&falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, "
                      "&fbeta, c, CUDA_R_16F, ldc, CUDA_R_32F, "
                      "CUBLAS_GEMM_DFALT_TENSOR_OP)`",
                      "torch.nn.modules.linear")},
       true,
       "cuda.library_execution_failed",
       0},
      {"musa_illegal_address",
       {runtime_error("MUSA error: an illegal memory access was encountered",
                      "torch.nn.modules.module")},
       true,
       "cuda.illegal_address",
       0},
      {"hip_missing_kernels",
       {runtime_error("HIP error: invalid device function",
                      "torch.nn.functional")},
       true,
       "device.missing_kernels",
       0},
      {"rocm_memory_fault",
       {runtime_error("Memory access fault by GPU node-2 (Agent handle: "
                      "0x55d) on address 0x7f. Reason: Page not present or "
                      "supervisor privilege.",
                      "torch.cuda")},
       true,
       "rocm.memory_fault",
       0},
      // Ascend NPU
      {"npu_aicore_error_code",
       {runtime_error("ACL stream synchronize failed, error code:507015",
                      "torch_npu.npu.utils")},
       true,
       "npu.acl_runtime_error",
       0},
      {"npu_force_stop",
       {runtime_error("FORCE STOP", "torch_npu.npu")},
       true,
       "npu.device_fault",
       0},
      {"npu_oom_is_ambiguous",
       {raised_in({"torch", "OutOfMemoryError", kRuntimeError,
                   "NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; "
                   "60.97 GiB total capacity)."},
                  "torch_npu.npu.memory")},
       false,
       "device.out_of_memory_type",
       0,
       true},
      // Metal
      {"mlx_gpu_address_fault",
       {runtime_error("[METAL] Command buffer execution failed: Caused GPU "
                      "Address Fault Error "
                      "(0000000b:kIOGPUCommandBufferCallbackErrorPageFault).",
                      "mlx_vlm.generate")},
       true,
       "metal.command_buffer_fault",
       0},
      {"mlx_insufficient_memory_is_ambiguous",
       {runtime_error("[METAL] Command buffer execution failed: Insufficient "
                      "Memory "
                      "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory).",
                      "mlx_vlm.generate")},
       false,
       "metal.out_of_memory",
       0,
       true},
      {"mlx_missing_metallib",
       {runtime_error("Failed to load the default metallib. library not "
                      "found",
                      "mlx.core")},
       true,
       "metal.missing_kernels",
       0},
      // Collective communication
      {"nccl_unhandled_cuda_error",
       {raised_in({"torch.distributed", "DistBackendError", kRuntimeError,
                   "NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                   "NCCLUtils.hpp:275, unhandled cuda error (run with "
                   "NCCL_DEBUG=INFO for details), NCCL version "
                   "2.21.5\nncclUnhandledCudaError: Call to CUDA function "
                   "failed."},
                  "torch.distributed.distributed_c10d")},
       true,
       "collective.error",
       0},
      {"hccl_watchdog",
       {runtime_error("[Rank 0] Watchdog caught collective operation "
                      "timeout: WorkHCCL(SeqNum=1, OpType=ALLREDUCE, "
                      "Timeout(ms)=1800000) ran for 1800071 milliseconds "
                      "before timing out.")},
       true,
       "collective.watchdog",
       0},
      // Families researched for the breadth work (engine and runtime
      // sources): one row each, in the words those sources raise or log.
      {"v1_output_handler_failed",
       {Frame{"",
              "",
              {},
              "ERROR [async_llm.py:480] AsyncLLM output_handler "
              "failed."}},
       true,
       "vllm.engine_core_fatal",
       0},
      {"v1_worker_proc_failed_to_start",
       {Frame{"", "", {}, "WorkerProc failed to start."}},
       true,
       "vllm.worker_died",
       0},
      {"lmdeploy_loop_task_failed",
       {Frame{"",
              "",
              {},
              "lmdeploy - ERROR - engine.py:781 - Task "
              "<EngineMainLoop> failed"}},
       true,
       "lmdeploy.loop_task_failed",
       0},
      {"lmdeploy_no_memory_for_kv_cache",
       {runtime_error("No enough gpu memory for kv cache.",
                      "lmdeploy.pytorch.engine.executor.base")},
       true,
       "lmdeploy.kv_cache_start",
       0},
      {"dlinfer_import_inside_lmdeploy",
       {builtin("ModuleNotFoundError", {"ImportError", "Exception"},
                "No module named 'dlinfer'", "lmdeploy.pytorch.backends")},
       true,
       "engine.start_import",
       0},
      {"turbomind_oom_text_is_ambiguous",
       {Frame{"",
              "",
              {},
              "[TM][ERROR] CUDA runtime error: out of memory "
              "/lmdeploy/src/turbomind/utils/memory_utils.cu:32"}},
       false,
       "device.out_of_memory",
       0,
       true},
      // Raised by TurboMind's own binding: judged by raise site, like an
      // out-of-memory raised in vLLM's model runner.
      {"turbomind_oom_raised_in_engine",
       {runtime_error("[TM][ERROR] CUDA runtime error: out of memory "
                      "/lmdeploy/src/turbomind/utils/memory_utils.cu:32",
                      "lmdeploy.turbomind.turbomind")},
       true,
       "engine.loop_error",
       0},
      {"turbomind_check_failed",
       {Frame{"", "", {}, "[TM][ERROR] Assertion fail: LlamaBatch.cc:1203"}},
       true,
       "lmdeploy.turbomind_fatal",
       0},
      {"cann_device_error_report",
       {runtime_error("The error from device(chipId:0, dieId:0), serial "
                      "number is 12, aic error code=0x800000",
                      "torch_npu.npu.utils")},
       true,
       "npu.device_error_report",
       0},
      {"cann_uce_code",
       {runtime_error("NPU function error: aclrtSynchronizeStream, error "
                      "code is 507053",
                      "torch_npu.npu.utils")},
       true,
       "npu.acl_runtime_error",
       0},
      {"cann_inner_error_other_module",
       {runtime_error("EH9999: Inner Error!", "torch_npu.npu")},
       true,
       "npu.inner_error",
       0},
      // The engines MinerU 4.0 drives, in the words of the holdout's threads
      // (bench/accuracy/holdout_engines4).
      {"cann_inner_error_without_colon",
       {Frame{"", "", {}, "error code is 107027\nEE9999 Inner Error"}},
       true,
       "npu.inner_error",
       0},
      {"v1_engine_core_named_died",
       {Frame{"", "", {}, "EngineCore_0 died unexpectedly"}},
       true,
       "vllm.engine_core_fatal",
       0},
      // vLLM 0.28's client when its core process is killed (a real kill -9,
      // tests/integration/test_vllm_real.py).
      {"v1_engine_core_exited_unexpectedly",
       {Frame{"",
              "",
              {},
              "[core_client.py:728] [shutdown] MPClient: engine core exited "
              "unexpectedly; starting cleanup"}},
       true,
       "vllm.engine_core_fatal",
       0},
      {"turbomind_cuda_operation_not_supported",
       {runtime_error("[TM][ERROR] CUDA runtime error: operation not supported "
                      "/lmdeploy/src/turbomind/utils/allocator.h:197",
                      "lmdeploy.turbomind.turbomind")},
       true,
       "lmdeploy.turbomind_cuda_error",
       0},
      {"glibc_assert_aborts",
       {Frame{"",
              "",
              {},
              "llama-server: llama-context.cpp:1021: Assertion `status == "
              "LLAMA_MEMORY_STATUS_SUCCESS' failed."}},
       true,
       "process.assert_failed",
       0},
      {"macos_crash_report_terminate_handler",
       {Frame{"",
              "",
              {},
              "libmlx.dylib mlx::core::gpu::check_error(MTL::CommandBuffer*)\n"
              "libc++abi.dylib demangling_terminate_handler()"}},
       true,
       "process.aborted",
       0},
      {"hip_gpu_hang",
       {Frame{"",
              "",
              {},
              "HW Exception by GPU node-1 (Agent handle: "
              "0x5b52) reason :GPU Hang"}},
       true,
       "rocm.memory_fault",
       0},
      {"cuda_enum_no_kernel_image",
       {runtime_error("CUDA error: kernel launch failed. Search for "
                      "`cudaErrorNoKernelImageForDevice'",
                      "torch.cuda")},
       true,
       "device.missing_kernels",
       0},
      {"nccl_heartbeat_monitor",
       {Frame{"",
              "",
              {},
              "[PG 0 Rank 1] Heartbeat monitor timed out! "
              "Process will be terminated after dumping debug "
              "info."}},
       true,
       "collective.watchdog",
       0},
      {"c10d_client_socket",
       {runtime_error("The client socket has failed to connect to any "
                      "network address of (10.0.0.2, 29500).",
                      "torch.distributed.rendezvous")},
       true,
       "collective.store_socket",
       0},
      {"mps_framework_assertion",
       {Frame{"",
              "",
              {},
              "MPSNDArray.mm:782: failed assertion "
              "`[MPSNDArray initWithDevice:descriptor:] Error'"}},
       true,
       "metal.failed_assertion",
       0},
      {"mlx_no_metal_device",
       {runtime_error("[metal::load_device] No Metal device available.",
                      "mlx.core")},
       true,
       "metal.no_device",
       0},
      {"ray_actor_dead_worker_died",
       {Frame{"",
              "",
              {},
              "The actor is dead because its worker process has "
              "died. Worker exit type: SYSTEM_ERROR"}},
       true,
       "ray.actor_died_message",
       0},
      {"openai_bad_request_is_remote",
       {raised_in({"openai",
                   "BadRequestError",
                   {"APIStatusError", "APIError", "OpenAIError", "Exception"},
                   "Error code: 400 - {'message': 'EngineCore encountered an "
                   "issue.'}"},
                  "openai._base_client")},
       false,
       "remote.http_error",
       0},
      // A document quoting the new texts decides nothing.
      {"docx_quoting_cann_report",
       {builtin("ValueError", kValueError,
                "bad run: The error from device(chipId:0, dieId:0), No enough "
                "gpu memory for kv cache, HW Exception by GPU node-1",
                "mineru.backend.office.docx_analyze")},
       false,
       "",
       -1},
      {"import_error_in_mineru_is_not_engine_start",
       {builtin("ImportError", {"Exception"}, "cannot import name 'x'",
                "mineru.backend.office.pptx_analyze")},
       false,
       "",
       -1},
      // Task-local
      {"v1_engine_generate_error",
       {v1_engine_generate_error()},
       false,
       "vllm.engine_generate_error",
       0},
      {"vllm_decoder_prompt_too_long",
       {builtin("ValueError", kValueError,
                "The decoder prompt (length 12324) is longer than the maximum "
                "model length of 8192.",
                "vllm.v1.engine.processor")},
       false,
       "vllm.context_length",
       0},
      {"pdfium_bad_format", {pdfium_error()}, false, "pdfium.error", 0},
      {"mineru_load_file_chinese_name",
       {runtime_error("Failed to load file 年度报告（终稿）.pdf: [Errno 2] No "
                      "such file or directory",
                      "mineru.cli.common"),
        builtin("FileNotFoundError", {"OSError", "Exception"},
                "[Errno 2] No such file or directory", "mineru.cli.common")},
       false,
       "mineru.load_file_failed",
       0},
      {"pil_unidentified",
       {raised_in({"PIL",
                   "UnidentifiedImageError",
                   {"OSError", "Exception"},
                   "cannot identify image file <_io.BytesIO object>"},
                  "PIL.Image")},
       false,
       "pil.unidentified_image",
       0},
      {"mineru_render_timeout",
       {builtin("TimeoutError", {"OSError", "Exception"},
                "PDF image rendering timeout after 300s for pages 1-10",
                "mineru.utils.pdf_image_tools")},
       false,
       "mineru.render_timeout",
       0},
      {"asyncio_cancelled", {cancelled()}, false, "request.cancelled", 0},
      // llama.cpp: MinerU's client raises ServerError while handling the
      // binding's EngineError, which is the context link that decides.
      {"llama_engine_stopped_behind_server_error",
       {llama_server_error("no result (stopped)"),
        at(llama_error("EngineError", "no result (stopped)"), 1,
           Via::kContext)},
       true,
       "llama.engine_stopped",
       1},
      {"llama_compute_error_is_ambiguous",
       {llama_server_error("Compute error."),
        at(llama_error("EngineError", "Compute error."), 1, Via::kContext)},
       false,
       "llama.compute_error",
       1,
       true},
      {"llama_vulkan_device_lost",
       {llama_error("EngineError",
                    "decode() failed: vk::Queue::submit: ErrorDeviceLost")},
       true,
       "vulkan.device_lost",
       0},
      {"llama_context_exceeded",
       {llama_error("ContextExceededError",
                    "the request exceeds the available context size")},
       false,
       "llama.context_exceeded",
       0},
      {"llama_start_failed",
       {runtime_error("load_model failed", "mineru_llama_cpp.engine")},
       true,
       "llama.engine_start",
       0},
      {"llama_text_in_minerus_server_error_alone",
       {llama_server_error("no result (stopped)")},
       false,
       "",
       -1},
      {"ggml_abort_line_in_a_log",
       {Frame{"",
              "",
              {},
              "/Users/runner/llama.cpp/ggml/src/ggml-metal/"
              "ggml-metal-context.m:235: fatal error"}},
       true,
       "ggml.abort",
       0},
      {"ggml_metal_command_buffer_failed_beats_its_oom",
       {Frame{"",
              "",
              {},
              "ggml_metal_synchronize: error: command buffer 0 failed with "
              "status 5\nerror: Insufficient Memory "
              "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)"}},
       true,
       "ggml.metal_error_state",
       0},
      {"ggml_vulkan_device_lost_report",
       {Frame{"", "", {}, "ggml_vulkan: device lost on Vulkan0"}},
       true,
       "vulkan.device_lost",
       0},
      {"mlx_load_weights_shape_mismatch",
       {builtin("ValueError", kValueError,
                "Expected shape (1152, 2, 16, 16, 3) but received shape "
                "(1152, 3, 2, 16, 16) for parameter "
                "vision_tower.patch_embed.proj.weight",
                "mlx.nn.layers.base")},
       true,
       "mlx.load_weights",
       0},
      {"mlx_load_weights_text_from_a_document_is_not_fatal",
       {builtin("ValueError", kValueError, "Missing 2 parameters: see page 3",
                "mineru.backend.office.docx_analyze")},
       false,
       "",
       -1},
      {"lmdeploy_rpc_server_stopped",
       {Frame{"",
              "",
              {},
              "2026-03-01 10:00:00,000 - lmdeploy - ERROR - zmq_engine.py:188 "
              "- RPC Server stopped with exception: CUDA error"}},
       true,
       "lmdeploy.engine_loop_stopped",
       0},
      {"acl_err_equals_code",
       {runtime_error("PeekLastErr: level=0 err=507899.", "torch_npu.npu")},
       true,
       "npu.acl_runtime_error",
       0},
      {"metal_method_assertion",
       {Frame{"",
              "",
              {},
              "-[_MTLCommandBuffer addCompletedHandler:]:1011: failed "
              "assertion `Completed handler provided after commit call'"}},
       true,
       "metal.failed_assertion",
       0},
      {"ggml_assert_in_a_log",
       {Frame{"",
              "",
              {},
              "/src/ggml/src/ggml-metal/ggml-metal-ops.cpp:1412: "
              "GGML_ASSERT(ne00 % 4 == 0) failed"}},
       true,
       "ggml.abort",
       0},
      {"remote_server_500",
       {raised_in({"mineru_vl_utils.vlm_client.base_client", "ServerError",
                   kRuntimeError,
                   "Unexpected status code: [500], response body: "
                   "{\"error\": \"EngineDeadError: EngineCore encountered an "
                   "issue.\"}"},
                  "mineru_vl_utils.vlm_client.http_client")},
       false,
       "remote.server_error",
       0},
      {"mineru_vl_utils_request_error",
       {raised_in(
           {"mineru_vl_utils.vlm_client.base_client", "RequestError",
            kValueError, "The output was truncated due to length limit."},
           "mineru_vl_utils.vlm_client.http_client")},
       false,
       "mineru_vl_utils.request_error",
       0},
      // Chinese and odd text
      {"chinese_device_message_from_torch",
       {runtime_error("推理失败：CUDA 错误：an illegal memory access was "
                      "encountered",
                      "torch.cuda")},
       true,
       "cuda.illegal_address",
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
      // No match: task-local by default
      {"standalone_cuda_oom_is_ambiguous",
       {cuda_oom()},
       false,
       "device.out_of_memory_type",
       0,
       true},
      {"closed_image_is_not_a_rule",
       {builtin("ValueError", kValueError, "Operation on closed image",
                "PIL.Image")},
       false,
       "",
       -1},
      {"engine_deadline_is_not_engine_dead",
       {runtime_error("engine deadline exceeded for page 4")},
       false,
       "",
       -1},
      {"plain_key_error",
       {builtin("KeyError", {"LookupError", "Exception"}, "'engine'",
                "mineru.backend.vlm.vlm_magic_model")},
       false,
       "",
       -1},
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

class RealCases : public ::testing::TestWithParam<Case> {};

TEST_P(RealCases, Classification) {
  const Case& c = GetParam();
  expect_verdict(c, Classifier(builtin_set()).classify(c.frames));
}

INSTANTIATE_TEST_SUITE_P(Builtin, RealCases, ::testing::ValuesIn(real_cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(p.param.name);
                         });

TEST(Classifier, RealTableIsLarge) { EXPECT_GE(real_cases().size(), 45u); }

// ---- precedence: one row per rule of docs/rules.md "Deciding" ---------------

std::vector<Case> precedence_cases() {
  const Frame heuristic_death =
      runtime_error("The inference engine is gone", "vllm.entrypoints.llm");
  return {
      // 1. Strength: definitive > task_local > heuristic > ambiguous >
      //    generic.
      {"definitive_beats_task_local_cause",
       {v1_engine_dead(), v1_engine_generate_error()},
       true,
       "vllm.engine_dead",
       0},
      {"definitive_beats_task_local_outer",
       {pdfium_error(), torch_cuda_error("misaligned address")},
       true,
       "cuda.misaligned_address",
       1},
      {"task_local_beats_heuristic",
       {heuristic_death, pdfium_error()},
       false,
       "pdfium.error",
       1},
      {"heuristic_beats_ambiguous",
       {cuda_oom(), heuristic_death},
       true,
       "engine.dead",
       1},
      {"ambiguous_beats_generic",
       {timeout_error(), cuda_oom()},
       false,
       "device.out_of_memory_type",
       1,
       true},
      // 2. Generic timeouts and cancellations are task-local only when
      //    nothing in the chain says the engine is gone.
      {"generic_alone_is_task_local",
       {timeout_error()},
       false,
       "request.timeout",
       0},
      {"v0_engine_dead_raised_from_timeout",
       {raised_in({"vllm.engine.async_llm_engine", "AsyncEngineDeadError",
                   kRuntimeError, "Task finished unexpectedly."},
                  "vllm.engine.async_llm_engine"),
        at(timeout_error(), 1, Via::kCause)},
       true,
       "vllm.v0.engine_dead",
       0},
      {"timeout_over_heuristic_cause",
       {timeout_error(), at(heuristic_death, 1, Via::kCause)},
       true,
       "engine.dead",
       1},
      // 3. A frame reached only through __context__ never downgrades a
      //    fatal frame...
      {"v1_abort_engine_dead_over_cancelled_context",
       {v1_engine_dead(), at(cancelled(), 1, Via::kContext)},
       true,
       "vllm.engine_dead",
       0},
      {"context_task_local_does_not_downgrade_heuristic",
       {heuristic_death, at(pdfium_error(), 1, Via::kContext)},
       true,
       "engine.dead",
       0},
      // ...but may upgrade it,
      {"context_definitive_upgrades_heuristic",
       {heuristic_death, at(v1_engine_dead(), 1, Via::kContext)},
       true,
       "vllm.engine_dead",
       1},
      // ...and decides by strength when the frame above is not fatal.
      {"context_definitive_over_task_local",
       {pdfium_error(), at(v1_engine_dead(), 1, Via::kContext)},
       true,
       "vllm.engine_dead",
       1},
      {"context_task_local_over_ambiguous",
       {cuda_oom(), at(pdfium_error(), 1, Via::kContext)},
       false,
       "pdfium.error",
       1},
      // 4. Within one strength the outermost frame along __cause__ decides.
      {"outermost_of_equal_strength",
       {runtime_error("wrapper"),
        torch_cuda_error("an illegal memory access was encountered"),
        v1_engine_dead()},
       true,
       "cuda.illegal_address",
       1},
      {"outer_task_local_names_the_verdict",
       {pdfium_error(), v1_engine_generate_error()},
       false,
       "pdfium.error",
       0},
      // 5. Exception-group members are judged one by one; the group is fatal
      //    if any member is.
      {"task_group_engine_dead_and_cancelled_siblings",
       {builtin("ExceptionGroup", {"BaseExceptionGroup", "Exception"},
                "unhandled errors in a TaskGroup (3 sub-exceptions)",
                "asyncio.taskgroups"),
        at(cancelled(), 1, Via::kGroupMember),
        at(v1_engine_dead(), 1, Via::kGroupMember),
        at(cancelled(), 1, Via::kGroupMember)},
       true,
       "vllm.engine_dead",
       2},
      {"group_heuristic_member_beats_task_local_member",
       {builtin("ExceptionGroup", {"BaseExceptionGroup", "Exception"},
                "2 errors", "asyncio.taskgroups"),
        at(pdfium_error(), 1, Via::kGroupMember),
        at(heuristic_death, 1, Via::kGroupMember)},
       true,
       "engine.dead",
       2},
      {"group_of_task_local_members",
       {builtin("ExceptionGroup", {"BaseExceptionGroup", "Exception"},
                "2 errors", "asyncio.taskgroups"),
        at(cancelled(), 1, Via::kGroupMember),
        at(pdfium_error(), 1, Via::kGroupMember)},
       false,
       "pdfium.error",
       2},
      {"member_cause_chain_counts",
       {builtin("ExceptionGroup", {"BaseExceptionGroup", "Exception"},
                "1 error", "asyncio.taskgroups"),
        at(runtime_error("page 3 failed", "mineru.backend.vlm"), 1,
           Via::kGroupMember),
        at(v1_engine_dead(), 2, Via::kCause)},
       true,
       "vllm.engine_dead",
       2},
      // 6. Untrusted text never decides.
      {"crafted_docx_is_task_local",
       {lxml_tag_mismatch()},
       false,
       "document.bad_file",
       0},
      {"mineru_quoting_engine_text_is_not_fatal",
       {runtime_error("EngineCore encountered an issue. CUDA error: an "
                      "illegal memory access was encountered",
                      "mineru.backend.office.docx_analyze")},
       false,
       "",
       -1},
      {"message_naming_engine_dead_error_is_not_one",
       {runtime_error("EngineDeadError", "vllm.entrypoints.llm")},
       false,
       "",
       -1},
  };
}

class Precedence : public ::testing::TestWithParam<Case> {};

TEST_P(Precedence, Classification) {
  const Case& c = GetParam();
  expect_verdict(c, Classifier(builtin_set()).classify(c.frames));
}

INSTANTIATE_TEST_SUITE_P(Rules, Precedence,
                         ::testing::ValuesIn(precedence_cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(p.param.name);
                         });

// Operator rules beat built-ins, may replace or disable them.
std::shared_ptr<const RuleSet> with_operator_file(const std::string& text) {
  ParseRulesResult parsed = parse_rules_text(text, "ops.rules");
  EXPECT_TRUE(parsed.ok());
  for (const RuleError& error : parsed.errors) {
    ADD_FAILURE() << error.to_string();
  }
  CompileResult compiled = RuleSet::compile(
      merge_rules(builtin_rules(), parsed.rules, parsed.disabled));
  EXPECT_TRUE(compiled.ok());
  return compiled.rule_set;
}

TEST(OperatorRules, TaskLocalCarveOutBeatsBuiltinDefinitive) {
  Classifier classifier(with_operator_file(
      "site.fonts task_local bad_input target=message origin=any "
      "^fontlib says\n"));
  const Classification verdict = classifier.classify(
      {runtime_error("fontlib says no", "fontlib"), v1_engine_dead()});
  EXPECT_FALSE(verdict.fatal);
  EXPECT_EQ(verdict.rule, "site.fonts");
}

// Issue 17: a plain operator rule let document text decide again (a zip
// member name chosen by the document turned fatal). By default a file rule
// judges only what an engine or device runtime raised.
TEST(OperatorRules, APlainFileRuleIgnoresDocumentText) {
  Classifier classifier(with_operator_file(
      "site.gone fatal engine_dead target=message acme engine gone\n"));
  const Classification from_document = classifier.classify(
      {runtime_error("bad zip member 'acme engine gone.png'", "zipfile")});
  EXPECT_FALSE(from_document.fatal);
  const Classification from_engine = classifier.classify(
      {runtime_error("acme engine gone", "vllm.v1.engine.core")});
  EXPECT_TRUE(from_engine.fatal);
  EXPECT_EQ(from_engine.rule, "site.gone");
}

TEST(OperatorRules, FatalRuleBeatsBuiltinTaskLocal) {
  Classifier classifier(
      with_operator_file("site.oom fatal device CUDA out of memory\n"));
  const Classification verdict =
      classifier.classify({cuda_oom(), pdfium_error()});
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.rule, "site.oom");
}

TEST(OperatorRules, ReplacingABuiltinMakesItAnOperatorRule) {
  Classifier classifier(
      with_operator_file("vllm.engine_core_init_failed task_local engine_start "
                         "target=message engine core initialization failed\n"));
  const Classification verdict = classifier.classify({runtime_error(
      "Engine core initialization failed.", "vllm.v1.engine.utils")});
  EXPECT_FALSE(verdict.fatal);
  EXPECT_EQ(verdict.rule, "vllm.engine_core_init_failed");
}

TEST(OperatorRules, OffDisablesABuiltin) {
  Classifier classifier(with_operator_file("cuda.misaligned_address off\n"));
  EXPECT_FALSE(
      classifier.classify({torch_cuda_error("misaligned address")}).matched);
  EXPECT_TRUE(classifier.classify({v1_engine_dead()}).fatal);
}

TEST(OperatorRules, EngineOriginScopeKeepsDocumentsOut) {
  Classifier classifier(with_operator_file(
      "site.xid fatal device target=message origin=engine \\bXid 79\\b\n"));
  EXPECT_TRUE(
      classifier.classify({runtime_error("Xid 79", "torch.cuda")}).fatal);
  EXPECT_FALSE(
      classifier.classify({runtime_error("Xid 79", "mineru.utils")}).matched);
}

// ---- origins and remote engines ---------------------------------------------

struct OriginCase {
  const char* module;
  const char* raised_in;
  Origin origin;
};

TEST(Origins, ModulePrefixes) {
  const OriginCase cases[] = {
      {"builtins", "", Origin::kUnknown},
      {"", "", Origin::kUnknown},
      {"builtins", "torch.cuda", Origin::kRuntime},
      {"torch", "", Origin::kRuntime},
      {"vllm.v1.engine.exceptions", "vllm.v1.engine.async_llm",
       Origin::kRuntime},
      {"builtins", "torch_npu.npu.utils", Origin::kRuntime},
      {"builtins", "mineru.model.layout.pp_doclayoutv2", Origin::kRuntime},
      {"builtins", "mineru.model.docx.main", Origin::kUntrusted},
      {"builtins", "mineru.backend.vlm.vlm_analyze", Origin::kUntrusted},
      {"lxml.etree", "src.lxml.etree", Origin::kUntrusted},
      {"builtins", "lxml.etree", Origin::kUntrusted},
      {"torch", "mineru.utils.pdf_reader", Origin::kUntrusted},
      {"builtins", "asyncio.tasks", Origin::kOther},
      {"torchvision", "", Origin::kOther},  // not "torch" + "vision"
      {"openai", "", Origin::kUntrusted},
  };
  for (const OriginCase& c : cases) {
    Frame frame{c.module, "X", {}, ""};
    frame.raised_in = c.raised_in;
    EXPECT_EQ(frame_origin(frame), c.origin)
        << c.module << " @" << c.raised_in << ": "
        << to_string(frame_origin(frame));
  }
}

TEST(Origins, UnknownOriginTrustIsAnOption) {
  Classifier classifier(builtin_set());
  const std::vector<Frame> frames = {
      runtime_error("CUDA error: an illegal memory access was encountered")};
  EXPECT_TRUE(classifier.classify(frames).fatal);
  ClassifyOptions strict;
  strict.trust_unknown_origin = false;
  EXPECT_FALSE(classifier.classify(frames, strict).matched);
}

struct RemoteCase {
  const char* name;
  std::vector<Frame> frames;
  bool fatal;
  bool remote_engine;
  const char* category;
};

void PrintTo(const RemoteCase& c, std::ostream* os) { *os << c.name; }

class RemoteEngine : public ::testing::TestWithParam<RemoteCase> {};

TEST_P(RemoteEngine, Classification) {
  const RemoteCase& c = GetParam();
  ClassifyOptions options;
  options.remote_engine = true;
  const Classification verdict =
      Classifier(builtin_set()).classify(c.frames, options);
  EXPECT_EQ(verdict.fatal, c.fatal);
  EXPECT_EQ(verdict.remote_engine, c.remote_engine);
  EXPECT_EQ(verdict.category, c.category);
}

INSTANTIATE_TEST_SUITE_P(
    Builtin, RemoteEngine,
    ::testing::Values(
        RemoteCase{"server_500_with_engine_death_text",
                   {raised_in({"mineru_vl_utils.vlm_client.base_client",
                               "ServerError", kRuntimeError,
                               "Unexpected status code: [500], response "
                               "body: EngineCore encountered an issue."},
                              "mineru_vl_utils.vlm_client.http_client")},
                   false,
                   true,
                   "remote_engine"},
        RemoteCase{"connect_error",
                   {raised_in({"httpx",
                               "ConnectError",
                               {"TransportError", "RequestError", "HTTPError",
                                "Exception"},
                               "All connection attempts failed"},
                              "httpx._transports.default")},
                   false,
                   true,
                   "remote_engine"},
        RemoteCase{"text_without_origin_is_downgraded",
                   {Frame{"", "", {}, "EngineCore encountered an issue."}},
                   false,
                   true,
                   "remote_engine"},
        // This process's own device still counts: the worker runs local
        // models next to the remote engine.
        RemoteCase{"local_cuda_fault_stays_fatal",
                   {torch_cuda_error("an illegal memory access was "
                                     "encountered")},
                   true,
                   false,
                   "device"},
        RemoteCase{"local_engine_class_stays_fatal",
                   {v1_engine_dead()},
                   true,
                   false,
                   "engine_dead"},
        RemoteCase{"document_error_unchanged",
                   {pdfium_error()},
                   false,
                   false,
                   "bad_input"}),
    [](const ::testing::TestParamInfo<RemoteCase>& p) {
      return std::string(p.param.name);
    });

// ---- excerpts
// ----------------------------------------------------------------

TEST(Classifier, ExcerptSurroundsTheMatch) {
  ClassifierLimits limits;
  limits.excerpt_bytes = 40;
  Classifier classifier(builtin_set(), limits);
  std::string message(5000, 'x');
  message += " an illegal memory access was encountered ";
  message += std::string(5000, 'y');
  Classification verdict = classifier.classify({runtime_error(message)});
  ASSERT_TRUE(verdict.fatal);
  EXPECT_LE(verdict.excerpt.size(), 40u);
  EXPECT_NE(verdict.excerpt.find("illegal memory access"), std::string::npos)
      << verdict.excerpt;
}

TEST(Classifier, ExcerptKeepsUtf8WholeAroundChinese) {
  ClassifierLimits limits;
  limits.excerpt_bytes = 31;
  Classifier classifier(builtin_set(), limits);
  std::string message;
  for (int i = 0; i < 200; ++i) message += "引擎";
  message += "EngineCore encountered an issue";
  for (int i = 0; i < 200; ++i) message += "退出";
  Classification verdict = classifier.classify({runtime_error(message)});
  ASSERT_TRUE(verdict.fatal);
  EXPECT_LE(verdict.excerpt.size(), 31u);
  EXPECT_TRUE(is_valid_utf8(verdict.excerpt));
  EXPECT_FALSE(verdict.excerpt.empty());
}

TEST(Classifier, ExcerptFromMessageHeadWhenOnlyCompactMatched) {
  ClassifierLimits limits;
  limits.excerpt_bytes = 10;
  Classifier classifier(builtin_set(), limits);
  Classification verdict = classifier.classify(
      {runtime_error("Engine_Stop_Error happened here", "lmdeploy")});
  ASSERT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.excerpt, "Engine_Sto");
}

// ---- hostile input and bounds -----------------------------------------------

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
  message += " EngineCore encountered an issue";
  Classification verdict = classifier.classify({runtime_error(message)});
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.rule, "vllm.engine_core_issue");
}

TEST(ClassifierHostile, TenMegabytesOfRandomBytes) {
  Classifier classifier(builtin_set());
  Classification verdict = classifier.classify(
      {runtime_error(pseudo_random_bytes(10u << 20, 12345))});
  EXPECT_FALSE(verdict.fatal);
}

TEST(ClassifierHostile, RandomBytesEverywhereWithMarkerInTail) {
  Classifier classifier(builtin_set());
  Frame frame{pseudo_random_bytes(4096, 1),
              pseudo_random_bytes(4096, 2),
              {pseudo_random_bytes(4096, 3)},
              pseudo_random_bytes(1u << 20, 4) + " misaligned address"};
  frame.raised_in = "torch.cuda";
  Classification verdict = classifier.classify({frame});
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.rule, "cuda.misaligned_address");
  EXPECT_TRUE(is_valid_utf8(verdict.excerpt));
}

TEST(ClassifierHostile, MessageKeepsHeadAndTailWithinItsLimit) {
  ClassifierLimits limits;
  limits.max_message_bytes = 1000;
  Classifier classifier(builtin_set(), limits);
  const std::string filler(100000, 'z');
  const std::string marker = " EngineCore encountered an issue ";
  EXPECT_TRUE(classifier.classify({runtime_error(marker + filler)}).fatal);
  EXPECT_TRUE(classifier.classify({runtime_error(filler + marker)}).fatal);
  EXPECT_FALSE(
      classifier.classify({runtime_error(filler + marker + filler)}).matched);
}

TEST(ClassifierHostile, TotalMessageBudgetLeavesTypesJudged) {
  ClassifierLimits limits;
  limits.max_total_message_bytes = 2000;
  limits.max_message_bytes = 1500;
  Classifier classifier(builtin_set(), limits);
  std::vector<Frame> frames = {
      runtime_error(std::string(1500, 'q')),
      runtime_error(std::string(1500, 'q')),
      runtime_error("EngineCore encountered an issue")};
  // The third message is past the budget...
  EXPECT_FALSE(classifier.classify(frames).matched);
  // ...but a class still decides.
  frames.push_back(v1_engine_dead());
  EXPECT_EQ(classifier.classify(frames).rule, "vllm.engine_dead");
}

TEST(ClassifierHostile, SixtyFourFramesOfOneMegabyte) {
  Classifier classifier(builtin_set());
  std::vector<Frame> frames(64, runtime_error(std::string(1u << 20, 'a')));
  frames.push_back(v1_engine_dead());  // the 65th frame is past max_frames
  EXPECT_FALSE(classifier.classify(frames).matched);
}

TEST(ClassifierHostile, TenThousandFrames) {
  std::vector<Frame> frames(10000, runtime_error("nothing to see"));
  frames.back() = v1_engine_dead();
  EXPECT_FALSE(Classifier(builtin_set()).classify(frames).matched);
  ClassifierLimits limits;
  limits.max_frames = 10000;
  Classification verdict = Classifier(builtin_set(), limits).classify(frames);
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.frame_index, 9999);
}

TEST(ClassifierHostile, BadDepthsFormALinearChain) {
  std::vector<Frame> frames = {at(runtime_error("a"), 7, Via::kContext),
                               at(runtime_error("b"), -3, Via::kGroupMember),
                               at(v1_engine_dead(), 99, Via::kRoot)};
  Classification verdict = Classifier(builtin_set()).classify(frames);
  EXPECT_TRUE(verdict.fatal);
  EXPECT_EQ(verdict.frame_index, 2);
}

TEST(ClassifierHostile, HugeNamesAndManyBases) {
  Frame frame{std::string(1u << 20, 'm'), "EngineDeadError",
              std::vector<std::string>(10000, "Base"), "boom"};
  EXPECT_TRUE(Classifier(builtin_set()).classify({frame}).fatal);
}

TEST(ClassifierHostile, ZeroLimitsDoNotCrash) {
  ClassifierLimits limits{1, 0, 0, 0};
  Classification verdict =
      Classifier(builtin_set(), limits).classify({v1_engine_dead()});
  // With no message bytes, the class alone still decides.
  EXPECT_TRUE(verdict.fatal);
  EXPECT_TRUE(verdict.excerpt.empty());
  EXPECT_FALSE(Classifier(builtin_set(), ClassifierLimits{0, 0, 0, 0})
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

// ---- RuleSet::compile
// --------------------------------------------------------

TEST(RuleSetCompile, BuiltinsCompileAndStayCheap) {
  CompileResult result = RuleSet::compile(builtin_rules());
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.rule_set->rules().size(), builtin_rules().size());
  bool kinds[5] = {};
  for (const Rule& rule : builtin_rules()) {
    kinds[static_cast<int>(rule.kind)] = true;
    EXPECT_FALSE(rule.from_operator) << rule.id;
    EXPECT_LE(pattern_class_run(rule.pattern), RuleSetLimits{}.max_class_run)
        << rule.id;
  }
  for (bool seen : kinds) EXPECT_TRUE(seen);
}

TEST(RuleSetCompile, ErrorsAreValuesAndAllOrNothing) {
  std::vector<Rule> rules = {
      {"ok.rule", RuleKind::kFatal, "x", "fine"},
      {"bad id", RuleKind::kFatal, "x", "fine"},
      {"ok.rule", RuleKind::kTaskLocal, "x", "dup"},
      {"bad.pattern", RuleKind::kFatal, "x", "(unclosed"},
      {"empty.pattern", RuleKind::kFatal, "x", ""},
      {"costly", RuleKind::kFatal, "x", "a[ab]{14,19}c0q"},
  };
  CompileResult result = RuleSet::compile(rules, "test-source");
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.rule_set, nullptr);
  ASSERT_EQ(result.errors.size(), 5u);
  EXPECT_EQ(result.errors[0].rule_id, "bad id");
  EXPECT_EQ(result.errors[1].rule_id, "ok.rule");
  EXPECT_NE(result.errors[1].message.find("duplicate"), std::string::npos);
  EXPECT_EQ(result.errors[2].rule_id, "bad.pattern");
  EXPECT_NE(result.errors[2].message.find("missing )"), std::string::npos)
      << result.errors[2].message;
  EXPECT_EQ(result.errors[2].source, "test-source");
  EXPECT_EQ(result.errors[3].rule_id, "empty.pattern");
  EXPECT_EQ(result.errors[4].rule_id, "costly");
  EXPECT_NE(result.errors[4].message.find("too costly"), std::string::npos);
}

TEST(RuleSetCompile, SetLimits) {
  RuleSetLimits limits;
  limits.max_rules = 2;
  std::vector<Rule> three = {{"a", RuleKind::kFatal, "x", "a"},
                             {"b", RuleKind::kFatal, "x", "b"},
                             {"c", RuleKind::kFatal, "x", "c"}};
  EXPECT_FALSE(RuleSet::compile(three, "s", limits).ok());
  limits = RuleSetLimits{};
  limits.max_total_program_size = 10;
  EXPECT_FALSE(RuleSet::compile(three, "s", limits).ok());
  limits = RuleSetLimits{};
  limits.max_pattern_bytes = 3;
  CompileResult long_pattern =
      RuleSet::compile({{"long", RuleKind::kFatal, "x", "abcd"}}, "s", limits);
  ASSERT_EQ(long_pattern.errors.size(), 1u);
  EXPECT_EQ(long_pattern.errors[0].rule_id, "long");
  limits = RuleSetLimits{};
  limits.pattern_max_mem = 1 << 10;
  CompileResult big = RuleSet::compile(
      {{"big", RuleKind::kFatal, "x", "(?:abcdefghij){50}"}}, "s", limits);
  ASSERT_EQ(big.errors.size(), 1u);
  EXPECT_NE(big.errors[0].message.find("too costly"), std::string::npos)
      << big.errors[0].message;
}

TEST(RuleSetCompile, RuleOrderBreaksTies) {
  CompileResult result = RuleSet::compile({
      {"first", RuleKind::kFatal, "a", "boom"},
      {"second", RuleKind::kFatal, "b", "bo+m"},
  });
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(Classifier(result.rule_set).classify({runtime_error("boom")}).rule,
            "first");
}

struct RunCase {
  const char* pattern;
  int run;
};

TEST(PatternClassRun, CountsBoundedRunsOfClasses) {
  const RunCase cases[] = {
      {"enginedeaderror", 0},
      {"engine core encountered an issue", 0},
      {"a[ab]{14,19}c0q", 19},
      {"a[ab]{14,19}c", 19},
      {"a[ab]{1,8}c", 8},
      {"[ab][ab][ab]", 3},
      {".{0,100}", 100},
      {"\\d+ \\d+ \\d+ \\d+ \\d+ \\d+ \\d+ \\d+ \\d+ \\d+", 1},
      {"[^\\n]*\\bengine\\b", 1},
      {"(?:a|b){10}", 10},
      {"(?:[ab]{4}){4}", 16},
      {"[ab]{4,}", 4},
      {"(?i)foo|bar", 1},
      {"\\Q[ab]{20}\\E", 0},
      {"x{2}", 0},
      {"\\pL{9}", 9},
      {"[]a]{9}", 9},
      {"a{1000}{1000}", 0},
      {"(?P<n>\\w){9}", 9},
      {"", 0},
      {"(((", 0},
  };
  for (const RunCase& c : cases) {
    EXPECT_EQ(pattern_class_run(c.pattern), c.run) << c.pattern;
  }
}

TEST(RuleKindTest, Names) {
  EXPECT_STREQ(to_string(RuleKind::kFatal), "fatal");
  EXPECT_STREQ(strength_name(RuleKind::kFatal), "definitive");
  EXPECT_STREQ(to_string(RuleKind::kTaskLocal), "task_local");
  EXPECT_STREQ(to_string(RuleKind::kGeneric), "generic");
  EXPECT_TRUE(is_fatal(RuleKind::kHeuristic));
  EXPECT_FALSE(is_fatal(RuleKind::kAmbiguous));
  EXPECT_STREQ(to_string(Via::kRoot), "root");
  EXPECT_STREQ(to_string(Via::kCause), "cause");
  EXPECT_STREQ(to_string(Via::kContext), "context");
  EXPECT_STREQ(to_string(Via::kGroupMember), "group");
  EXPECT_STREQ(to_string(RuleTarget::kType), "type");
  EXPECT_STREQ(to_string(RuleScope::kEngine), "engine");
}

TEST(RuleTest, ToLineIsARulesFileLine) {
  const Rule rule("site.x", RuleKind::kHeuristic, "engine_dead", "a  b",
                  RuleTarget::kMessage, RuleScope::kEngine, true);
  EXPECT_EQ(rule.to_line(),
            "site.x heuristic engine_dead target=message origin=engine a  b");
  ParseRulesResult parsed = parse_rules_text(rule.to_line(), "<line>");
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed.rules.size(), 1u);
  EXPECT_EQ(parsed.rules[0].to_line(), rule.to_line());
}

TEST(VerdictTest, KindAndStrength) {
  Classification verdict;
  EXPECT_STREQ(verdict.kind(), "task_local");
  EXPECT_STREQ(verdict.strength(), "");  // nothing matched
  verdict.matched = true;
  verdict.rule_kind = RuleKind::kGeneric;
  EXPECT_STREQ(verdict.kind(), "task_local");
  EXPECT_STREQ(verdict.strength(), "generic");
  verdict.rule_kind = RuleKind::kAmbiguous;
  verdict.ambiguous = true;
  EXPECT_STREQ(verdict.kind(), "ambiguous");
  EXPECT_STREQ(verdict.strength(), "ambiguous");
  verdict = Classification{};
  verdict.matched = verdict.fatal = true;
  verdict.rule_kind = RuleKind::kFatal;
  EXPECT_STREQ(verdict.kind(), "fatal");
  EXPECT_STREQ(verdict.strength(), "definitive");
}

// ---- text forms
// --------------------------------------------------------------

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
        FormCase{"words", "Engine-Dead Error!", "Engine-Dead Error!",
                 "enginedeaderror"},
        FormCase{"invalid_byte",
                 "a\xFF"
                 "b",
                 "a\xEF\xBF\xBD"
                 "b",
                 "a\xEF\xBF\xBD"
                 "b"},
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
