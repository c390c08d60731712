// The rules that ship with the package, grouped by engine and device. The
// precedence they take part in (strengths, targets, origin scopes) is
// documented in docs/rules.md; the sources each family was researched from
// are listed there too.
//
// Longer than the house ~500-line guideline on purpose: it is one table, and
// keeping every rule in one list keeps their order (which breaks ties between
// rules of equal strength) readable in one place.
//
// Conventions:
// - Type rules (target kType) see "module.Type (Base1 Base2) @raised_in". A
//   class name is evidence no document or remote server can forge, so they
//   decide for any frame; `[^@]*@module` pins the raise site.
// - Message rules (target kMessage, scope kEngine) decide only for frames an
//   engine or device runtime raised (vllm, torch, lmdeploy...), never for
//   text from document libraries, HTTP clients or MinerU's conversion code.
// - A pattern in lower-case letters and digits only also meets the compact
//   form (punctuation and spaces dropped).
//
// Deliberately absent or weak:
// - lmdeploy's "internal error happened, status code ..." (lmdeploy 0.10 and
//   0.11): it comes back as generated text, not as an exception, so there is
//   nothing to classify; the liveness check covers that engine.
// - PIL's "Operation on closed image": under concurrency it has killed
//   vLLM's EngineCore (MinerU PR #4979); the engine's own EngineDeadError
//   then follows and decides. A task-local rule here would be wrong then.
#include <string>
#include <utility>
#include <vector>

#include "mineru_health/classifier.h"

namespace mineru_health {

namespace {

Rule type_rule(std::string id, RuleKind kind, std::string category,
               std::string pattern) {
  return Rule{std::move(id),
              kind,
              std::move(category),
              std::move(pattern),
              RuleTarget::kType,
              RuleScope::kAny,
              false};
}

Rule engine_message(std::string id, RuleKind kind, std::string category,
                    std::string pattern) {
  return Rule{std::move(id),
              kind,
              std::move(category),
              std::move(pattern),
              RuleTarget::kMessage,
              RuleScope::kEngine,
              false};
}

// Task-local message rules that may judge any frame: a document can only
// make its own task fail by quoting them. Kept to texts that are specific.
Rule any_message(std::string id, RuleKind kind, std::string category,
                 std::string pattern) {
  return Rule{std::move(id),
              kind,
              std::move(category),
              std::move(pattern),
              RuleTarget::kMessage,
              RuleScope::kAny,
              false};
}

constexpr RuleKind kFatal = RuleKind::kFatal;
constexpr RuleKind kHeuristic = RuleKind::kHeuristic;
constexpr RuleKind kTaskLocal = RuleKind::kTaskLocal;
constexpr RuleKind kAmbiguous = RuleKind::kAmbiguous;
constexpr RuleKind kGeneric = RuleKind::kGeneric;

// Device runtimes word their errors after CUDA's ("MUSA error: ...").
constexpr char kDevicePrefix[] =
    "(?:cuda|hip|musa|maca|mc|sdaa|gcu|tops|cnrt|mlu|npu|xpu|cuda driver)";

std::string device(const std::string& tail) {
  return std::string("\\b") + kDevicePrefix + tail;
}

}  // namespace

std::vector<Rule> builtin_rules() {
  return {
      // ==== vLLM V1 ========================================================
      // EngineDeadError: raised to every caller once the EngineCore process
      // is gone (vllm/v1/engine/exceptions.py). Checked by class only: a
      // message that merely names it is not one.
      type_rule("vllm.engine_dead", kFatal, "engine_dead",
                "(?:^|[ .(])EngineDeadError\\b"),
      // Its fixed message, for engine code that re-raises str() only.
      engine_message("vllm.engine_core_issue", kFatal, "engine_dead",
                     "engine ?core encountered an issue"),
      // "EngineCore_0 died unexpectedly": the core process's own name, as
      // its parent reports it when no "proc" precedes the name. "engine core
      // exited unexpectedly": vLLM 0.28's client, the moment its core is
      // killed (seen for real: tests/data/errors/observed).
      engine_message("vllm.engine_core_fatal", kFatal, "engine_dead",
                     "engine ?core encountered a fatal error|engine ?core "
                     "proc\\S* \\S+ died unexpectedly|engine ?core(?:_\\w+)? "
                     "died unexpectedly|engine core client "
                     "(?:is|has) (?:shut ?down|dead)|engine ?core hit an "
                     "exception|got fatal signal from worker processes|"
                     "asyncllm output_handler failed|engine core exited "
                     "unexpectedly"),
      // Start-up: the core process failed (model load, KV-cache allocation).
      // MinerU builds the engine on the first task, so this reaches the
      // worker as a task failure and every later task would fail the same.
      engine_message("vllm.engine_core_init_failed", kFatal, "engine_start",
                     "engine core initiali[sz]ation failed|engine ?core "
                     "failed to start|engine process failed to start"),
      engine_message(
          "vllm.kv_cache_start", kFatal, "engine_start",
          "no available memory for the cache blocks|larger than the maximum "
          "number of tokens that can be stored in kv cache|insufficient "
          "memory for (?:the )?kv cache|not enough (?:gpu )?memory (?:for|to "
          "allocate) (?:the )?kv cache|larger than the available kv cache "
          "memory|on startup is less than desired gpu memory utili[sz]ation"),
      // Executor workers (multiproc / Ray) and their RPCs.
      engine_message("vllm.worker_died", kFatal, "engine_dead",
                     "worker ?proc\\S* \\S+ died unexpectedly|worker process "
                     "died unexpectedly|worker failed with error|executor "
                     "(?:failed|is dead|has died)|workerproc failed to start|"
                     "workerproc hit an exception"),
      engine_message("vllm.rpc_timeout", kHeuristic, "engine_dead",
                     "rpc call to \\S+ timed out|timed out waiting for "
                     "(?:worker|engine|rpc) response"),
      // V1 AsyncLLM wraps an unexpected failure of one request in this; the
      // engine itself is fine (its docstring calls it recoverable).
      type_rule("vllm.engine_generate_error", kTaskLocal, "request",
                "(?:^|[ .(])EngineGenerateError\\b"),

      // ==== vLLM V0 ========================================================
      type_rule("vllm.v0.engine_dead", kFatal, "engine_dead",
                "(?:^|[ .(])(?:AsyncEngineDeadError|MQEngineDeadError)\\b"),
      engine_message("vllm.v0.background_loop", kFatal, "engine_dead",
                     "background loop has errored already|background loop is "
                     "not running|background loop (?:is |has )?stopped"),
      engine_message("vllm.v0.engine_loop", kFatal, "engine_dead",
                     "engine loop is not running|engine loop has died|engine "
                     "process \\(pid \\d+\\) died|mqllmengine (?:is "
                     "(?:already )?dead|terminated)|no heartbeat received from "
                     "mqllmengine"),
      engine_message("vllm.v0.task_finished", kFatal, "engine_dead",
                     "task finished unexpectedly\\. this should never happen|"
                     "engine background task failed|engine iteration timed "
                     "out"),

      // ==== Ordinary errors inside an engine loop ===========================
      // An assertion, a KeyError... raised by the scheduler or the model
      // runner of an in-process engine kills its loop: every later request
      // fails. Judged by class and raise site, never by message.
      type_rule(
          "engine.loop_error", kHeuristic, "engine_dead",
          "^(?:builtins\\.)?(?:AssertionError|KeyError|IndexError|"
          "RuntimeError|TypeError|AttributeError|ZeroDivisionError|"
          "StopIteration)\\b[^@]*@(?:vllm\\.v1\\.core\\.|vllm\\.v1\\."
          "engine\\.core\\b|vllm\\.core\\.|vllm\\.engine\\.llm_engine\\b|"
          "vllm\\.v1\\.worker\\.|vllm\\.worker\\.|vllm\\.v1\\.executor\\.|"
          "vllm\\.executor\\.|lmdeploy\\.pytorch\\.engine\\.|lmdeploy\\."
          "pytorch\\.paging\\.|lmdeploy\\.turbomind\\.)"),
      type_rule("engine.scheduler_value_error", kHeuristic, "engine_dead",
                "^(?:builtins\\.)?ValueError\\b[^@]*@(?:vllm\\.v1\\.core\\."
                "sched|vllm\\.core\\.scheduler|vllm\\.core\\.block|lmdeploy\\."
                "pytorch\\.paging\\.)"),
      // Out of memory raised by an in-process engine's own code (model
      // runner, model layers, executor, start-up): V0's loop and V1's core
      // never recover from it, so every later request fails.
      type_rule("engine.loop_oom", kHeuristic, "engine_dead",
                "OutOfMemoryError\\b[^@]*@(?:vllm\\.(?:v1\\.(?:worker|core|"
                "executor|engine\\.core\\b|attention)|worker|model_executor|"
                "executor|attention|distributed|engine\\.llm_engine\\b|"
                "engine\\.async_llm_engine\\b)|lmdeploy\\.pytorch\\.)"),

      // Start-up: the engine cannot be built from this configuration or
      // install (vLLM's config and argument checks, model loading and
      // platform detection; lmdeploy's config, architecture and TurboMind
      // conversion checks; MLX model loading). MinerU builds its engine on
      // the first task, so every later task fails the same way.
      type_rule("engine.start_config", kHeuristic, "engine_start",
                "^(?:builtins\\.)?(?:ValueError|TypeError|KeyError|"
                "AssertionError|NotImplementedError|ImportError|"
                "ModuleNotFoundError|OSError|RuntimeError)\\b[^@]*@(?:vllm\\."
                "(?:config|engine\\.arg_utils|v1\\.engine\\.utils|"
                "model_executor\\.model_loader|model_executor\\.models\\."
                "registry|transformers_utils\\.config|platforms)\\b|lmdeploy\\."
                "(?:messages|archs|pytorch\\.config|turbomind\\.deploy|"
                "turbomind\\.supported_models)\\b|mlx_(?:vlm|lm)\\.utils\\b)"),

      // An engine's own modules failing to import (a missing or mismatched
      // extension, kernel package or dependency): raised while the engine is
      // built, so it never serves. Judged by raise site only.
      type_rule("engine.start_import", kHeuristic, "engine_start",
                "^(?:builtins\\.)?(?:ImportError|ModuleNotFoundError)\\b[^@]*@"
                "(?:vllm|vllm_ascend|lmdeploy|_turbomind|dlinfer|mlx|mlx_lm|"
                "mlx_vlm|torch_npu|torch_musa|torch_mlu|torch_gcu|torch_sdaa|"
                "torch_dipu)(?:\\.|$)"),

      // ==== lmdeploy ========================================================
      // PyTorch engine run in a child process (ZMQ): dead backend. The child
      // logs "RPC Server stopped with exception" when its server loop dies
      // (mp_engine/zmq_engine.py), then closes the engine.
      type_rule("lmdeploy.rpc_server_dead", kFatal, "engine_dead",
                "(?:^|[ .(])RPCServerDeadError\\b"),
      engine_message("lmdeploy.engine_loop_stopped", kFatal, "engine_dead",
                     "engine (?:main |request )?loop (?:has stopped|is not "
                     "alive|task has stopped)|engine main loop failed|"
                     "engine loop failed with error|zmq "
                     "engine process is not alive|mpengine \\S+ (?:is "
                     "dead|died)|rpc server stopped with exception"),
      engine_message("lmdeploy.engine_stop_error", kFatal, "engine_dead",
                     "enginestoperror"),
      // The engine's background tasks (lmdeploy/pytorch/engine: the main
      // loop and its helpers, the model agent loop) log "Task <name> failed"
      // when they die; the engine stops with them. A child process of the
      // multiprocess executor or the ZMQ engine dying ends it too; 0.12's
      // EngineLoop logs "EngineLoop wait_tasks failed." when one of its
      // tasks (MainLoopMain, MainLoopWaitExecutor...) raised.
      engine_message(
          "lmdeploy.loop_task_failed", kFatal, "engine_dead",
          "task <(?:enginemainloop|mainloop\\w*|getoutputsloop|"
          "modelagent\\w*|rayexecutorprefetchoutput)> failed|engine "
          "loop wait tasks failed|engineloopwaittasksfailed|received "
          "custom termination "
          "signal from sub processing|zmq engine process exited "
          "before publishing"),
      // The PyTorch engine's executor sizes the KV cache from free memory at
      // start (pytorch/engine/executor/base.py).
      engine_message("lmdeploy.kv_cache_start", kFatal, "engine_start",
                     "no enough gpu memory for (?:kv cache|runtime)"),
      // lmdeploy's environment checks log "<name> check failed!" and exit
      // (lmdeploy/pytorch/check_env): the engine cannot be built here.
      engine_message("lmdeploy.env_check_failed", kFatal, "engine_start",
                     "<[\\w.]+> (?:check|test) failed!"),
      type_rule("lmdeploy.env_check_exit", kFatal, "engine_start",
                "SystemExit\\b[^@]*@lmdeploy\\.pytorch\\.check_env\\b"),
      // TurboMind's extension missing or built without what the model needs.
      engine_message("lmdeploy.turbomind_unbuilt", kFatal, "engine_start",
                     "no module named '_turbomind'|while importing _turbomind|"
                     "turbomind has not been built with"),
      // The serving layer's ENGINE_UNAVAILABLE also covers a sleeping engine
      // and unknown sessions, which MinerU's one-shot sessions never hit.
      engine_message("lmdeploy.engine_unavailable", kHeuristic, "engine_dead",
                     "the inference engine is unavailable"),
      // TurboMind's C++ checks ([TM][FATAL], failed assertions and CHECKs).
      // Its "[TM][ERROR] CUDA runtime error: <text>" is left to the CUDA
      // rules: an out-of-memory seen as text alone stays ambiguous, and one
      // raised by TurboMind's binding is fatal by its raise site
      // (engine.loop_error), as for an OOM in vLLM's model runner.
      engine_message("lmdeploy.turbomind_fatal", kHeuristic, "engine_dead",
                     "\\[tm\\]\\[fatal\\]|\\[tm\\]\\[error\\] *(?:assertion "
                     "fail|check failed)"),
      // TurboMind's CUDA checks (check_cuda_error in src/turbomind/utils)
      // throw "[TM][ERROR] CUDA runtime error: <cudaGetErrorString>" from its
      // allocator, kernels and cuBLAS wrapper; these codes mean the device or
      // the install cannot run the engine at all, or the context is broken
      // (sticky). Out of memory is not among them: it stays ambiguous.
      engine_message(
          "lmdeploy.turbomind_cuda_error", kFatal, "device",
          "\\[tm\\]\\[error\\] *cuda runtime error: (?:operation not "
          "supported|api call is not supported|invalid device "
          "function|misaligned address|an illegal memory access|"
          "illegal (?:address|instruction)|unspecified launch "
          "failure|no kernel image)"),
      engine_message("lmdeploy.context_length", kTaskLocal, "request_too_long",
                     "the request exceeds the model context length"),

      // ==== SGLang ==========================================================
      engine_message("sglang.subprocess_exception", kFatal, "engine_dead",
                     "(?:scheduler|detokenizer ?(?:manager)?|tokenizer "
                     "?manager|data ?parallel ?controller) hit an exception"),
      engine_message("sglang.child_failed", kFatal, "engine_dead",
                     "received sigquit from a child process"),
      engine_message("sglang.scheduler_dead", kFatal, "engine_dead",
                     "rank \\d+ scheduler is dead"),

      // ==== llama.cpp (mineru_llama_cpp, MinerU 4.0 on CPU and macOS) =======
      // An in-process llama-server context. Its binding raises EngineError
      // for every server-side error result, InvalidRequestError for bad
      // requests, ContextExceededError for an oversized prompt; MinerU's
      // client re-raises them as mineru_vl_utils' ServerError/RequestError
      // while handling them, so these rules judge the original frame (a
      // context link, which may make the chain fatal).
      //
      // The binding's reader returns no result only when the server's queue
      // was stopped: the decode loop is gone for good.
      engine_message("llama.engine_stopped", kFatal, "engine_dead",
                     "no result \\(stopped\\)"),
      // Engine construction (model load, backend selection) failed: MinerU
      // builds the engine on the first task, so every later task fails too.
      engine_message("llama.engine_start", kFatal, "engine_start",
                     "^load_model failed|packaged cpu backend is unavailable|"
                     "requested \\S+ backend is unavailable; check gpu "
                     "drivers|mineru_llama_cpp_backend must be "),
      // llama_decode() < -1 (graph compute or its buffer allocation failed)
      // and a failed image-chunk encode. Out of memory on CPU; on Metal the
      // backend refuses every later graph after one failed command buffer.
      // The same text either way: counted, not fatal alone.
      engine_message("llama.compute_error", kAmbiguous, "device",
                     "^(?:\\w+\\(\\) failed: )?compute error\\.|^failed to "
                     "process mtmd chunk"),
      // Per-request failures: the server releases the slot and goes on.
      type_rule("llama.context_exceeded", kTaskLocal, "request_too_long",
                "^mineru_llama_cpp\\.[\\w.]*ContextExceededError\\b"),
      engine_message("llama.context_exceeded_message", kTaskLocal,
                     "request_too_long",
                     "^(?:\\w+\\(\\) failed: )?(?:context size has been "
                     "exceeded|context shift is disabled)"),
      type_rule("llama.invalid_request", kTaskLocal, "request",
                "^mineru_llama_cpp\\.[\\w.]*InvalidRequestError\\b"),
      engine_message("llama.invalid_batch", kTaskLocal, "request",
                     "^(?:\\w+\\(\\) failed: )?invalid input batch\\."),
      // ggml's own checks abort the process (GGML_ASSERT, and the CUDA,
      // ROCm, MUSA, CANN and SYCL backends' error report before their
      // GGML_ABORT): seen only as log text, and the process is gone.
      // ggml_abort (ggml.c) prints "<file>:<line>: <message>" and a
      // backtrace (ggml_print_backtrace, also run by ggml's handler for
      // uncaught C++ exceptions) before abort(); GGML_ABORT's callers live in
      // ggml's own sources (ggml-metal-context.m:...: fatal error,
      // ggml-cuda.cu:...: CUDA error).
      engine_message("ggml.abort", kFatal, "worker_dead",
                     "ggml_assert\\(.+\\) failed|\\bcurrent device: -?\\d+, "
                     "in function \\S+ at \\S+:\\d+|(?:^|[/\\\\ ])ggml[\\w-]*"
                     "\\.(?:c|cpp|cu|m):\\d+: \\S|\\bggml_print_backtrace\\b|"
                     "using native backtrace\\. set ggml_backtrace_lldb"),
      // ggml-metal-context.m: a failed command buffer aborts the process
      // (older builds) or leaves the backend in its error state, and every
      // later graph fails until the backend is recreated.
      engine_message("ggml.metal_error_state", kFatal, "device",
                     "backend is in error state from a previous command "
                     "buffer failure|ggml_metal_\\w+: (?:error: )?command "
                     "buffer \\d+ failed with status \\d+"),
      // Vulkan (ggml-vulkan via vulkan.hpp: "vk::Queue::submit:
      // ErrorDeviceLost", and its own "ggml_vulkan: device lost on
      // <device>"): a lost device stays lost for the process.
      engine_message("vulkan.device_lost", kFatal, "device",
                     "errordevicelost|vk_error_device_lost|ggml_vulkan: device "
                     "lost on "),
      engine_message("vulkan.out_of_memory", kAmbiguous, "out_of_memory",
                     "erroroutofdevicememory|vk_error_out_of_device_memory"),

      // ==== Distributed runtime (Ray, worker processes) =====================
      type_rule("ray.actor_died", kFatal, "worker_dead",
                "^ray\\.[\\w.]*(?:RayActorError|ActorDiedError|"
                "ActorUnavailableError|WorkerCrashedError|NodeDiedError|"
                "LocalRayletDiedError)\\b"),
      engine_message("ray.actor_died_message", kFatal, "worker_dead",
                     "the actor died unexpectedly|actor \\S+ (?:has )?died|"
                     "the worker died unexpectedly|worker crashed while "
                     "executing|raylet (?:has )?died|the actor is dead "
                     "because|a worker died or was killed while executing|"
                     "worker exit type: system_error|has been marked dead "
                     "because the detector has missed too many heartbeats"),
      // Lost objects and the system errors of Ray's core: the actor or node
      // holding the engine's results is gone.
      type_rule("ray.system_error", kHeuristic, "worker_dead",
                "^ray\\.[\\w.]*(?:RaySystemError|OwnerDiedError|"
                "ObjectLostError|ObjectReconstructionFailed\\w*Error)\\b"),
      type_rule("ray.out_of_memory", kHeuristic, "worker_dead",
                "^ray\\.[\\w.]*OutOfMemoryError\\b"),
      engine_message("process.killed_by_signal", kHeuristic, "worker_dead",
                     "(?:process|worker|proc) \\S+ (?:terminated|was "
                     "terminated|exited|died) (?:with|by) signal|terminated "
                     "with signal sig(?:kill|segv|abrt|bus)|exited with "
                     "(?:exit ?)?code -?(?:9|11|6|137|139)\\b|(?:segmentation "
                     "fault|aborted|bus error) ?\\(core dumped\\)"),

      // A C++ exception nobody caught: the process aborts (MLX without a
      // Metal device, TurboMind, custom kernels).
      // A macOS crash report names the frames instead (libc++abi's
      // demangling_terminate_handler, std::__terminate): MLX's check_error
      // throwing on Metal's completion queue ends that way.
      engine_message("process.aborted", kFatal, "worker_dead",
                     "terminate called after throwing an instance of|"
                     "libc\\+\\+abi:? terminating (?:due to uncaught exception|"
                     "with uncaught exception)|terminating app due to uncaught "
                     "exception|\\bdemangling_terminate_handler\\b|"
                     "\\bstd::__terminate\\b"),
      // C's assert() (glibc: "Assertion `cond' failed.") and libstdc++'s
      // checked accessors ("Assertion '__n < this->size()' failed.") abort
      // the process: llama.cpp's own asserts in llama-server and the
      // standard library's, seen as log text only.
      engine_message("process.assert_failed", kFatal, "worker_dead",
                     "\\bassertion [`'][^\\n]+' failed"),
      // vLLM's custom all-reduce checks every CUDA call and exits the
      // process on failure (CUDACHECK in csrc/custom_all_reduce.cuh).
      engine_message("vllm.custom_all_reduce_exit", kFatal, "device",
                     "failed: cuda error \\S+:\\d+ '"),

      // ==== CUDA and CUDA-like devices: sticky faults =======================
      // After these the device context is unusable for the rest of the
      // process: every later kernel launch fails. The same words come from
      // HIP, MUSA, MACA and the other CUDA-like runtimes.
      engine_message("cuda.illegal_address", kFatal, "device",
                     "illegal memory access was encountered|illegal memory "
                     "access|errorillegaladdress"),
      engine_message("cuda.device_assert", kFatal, "device",
                     "device-side assert(?:ion)? triggered|cudaerrorassert|"
                     "\\.cu:\\d+: \\S+: block: \\[\\d+,\\d+,\\d+\\], thread: "
                     "\\[\\d+,\\d+,\\d+\\] assertion"),
      engine_message("cuda.launch_failure", kFatal, "device",
                     "unspecified launch failure|errorlaunchfailure"),
      engine_message("cuda.ecc_uncorrectable", kFatal, "device",
                     "uncorrectable ecc error|erroreccuncorrectable|"
                     "uncorrectable nvlink error"),
      engine_message("cuda.illegal_instruction", kFatal, "device",
                     "illegal instruction was encountered|"
                     "errorillegalinstruction"),
      engine_message("cuda.misaligned_address", kFatal, "device",
                     "misaligned address|errormisalignedaddress"),
      engine_message("cuda.hardware_stack_error", kFatal, "device",
                     "hardware stack error|errorhardwarestackerror"),
      engine_message("cuda.invalid_address_space", kFatal, "device",
                     "operation not supported on global/shared address space|"
                     "errorinvalidaddressspace"),
      engine_message("cuda.invalid_pc", kFatal, "device",
                     "invalid program counter|errorinvalidpc"),
      engine_message("cuda.launch_timeout", kFatal, "device",
                     "launch timed out and was terminated|errorlaunchtimeout"),
      engine_message("cuda.library_execution_failed", kFatal, "device",
                     "(?:cublas|cudnn|cusparse|cusolver|hipblas|miopen|"
                     "rocblas|mublas|mudnn)_status_(?:execution_failed|"
                     "mapping_error)|cublas runtime error ?: the gpu program "
                     "failed to execute"),
      engine_message("cuda.device_lost", kFatal, "device",
                     "gpu (?:is|has fallen|fell) (?:lost|off the bus)|fallen "
                     "off the bus|\\bxid\\b ?:? ?(?:48|62|63|64|74|79|92|94|"
                     "95)\\b|errordevicesunavailable|"
                     "cudaerrordevicesunavailable"),
      engine_message("cuda.unknown_error", kHeuristic, "device",
                     device(" error: unknown error")),
      // Anything raised while a CUDA graph is being captured: the capture
      // (at engine start or on a new batch size) is invalidated, and the
      // stream with it.
      type_rule("cuda.graph_capture", kHeuristic, "device",
                "@torch\\.cuda\\.graphs\\b"),
      engine_message("cuda.stream_capture", kHeuristic, "device",
                     "operation not permitted when stream is capturing|"
                     "errorstreamcaptureinvalidated"),
      // ROCm: the HSA runtime's faults, and the HIP runtime's report of a
      // hung or faulted queue ("HW Exception by GPU node-N ... reason :GPU
      // Hang"), after which the process aborts.
      // ROCclr's HSA queue callback prints this and calls abort() on any
      // device exception (rocdevice.cpp callbackQueue).
      engine_message("rocm.queue_abort", kFatal, "worker_dead",
                     "callback(?:queue|: queue \\S+) aborting with error"),
      engine_message("rocm.memory_fault", kFatal, "device",
                     "memory access fault by gpu|hsa_status_error_memory_"
                     "(?:aperture_violation|fault)|hsa_status_error_exception|"
                     "hsa_status_error_illegal_instruction|hw exception by gpu "
                     "node"),
      // Start-up: no kernels for this device, no usable driver.
      engine_message("device.missing_kernels", kFatal, "engine_start",
                     "no kernel image is available for execution on the "
                     "device|invalid device function|hiperrornobinaryforgpu|"
                     "unable to find code object for all current devices|"
                     "the provided ptx was compiled with an unsupported "
                     "toolchain|errornokernelimagefordevice|"
                     "errorinvaliddevicefunction|errorunsupportedptxversion"),
      engine_message("device.no_driver", kHeuristic, "engine_start",
                     "found no nvidia driver|cuda driver initiali[sz]ation "
                     "failed|no cuda-capable device is detected|nvidia driver "
                     "on your system is too old|cannot re-initiali[sz]e cuda "
                     "in forked subprocess|cuda-capable device\\(s\\) is/are "
                     "busy or unavailable|api call is not supported in the "
                     "installed cuda driver|errorcallrequiresnewerdriver|cuda "
                     "driver version is insufficient "
                     "for cuda runtime version|errorinsufficientdriver|system "
                     "not yet initiali[sz]ed|errorsystemnotready|system has "
                     "unsupported display driver / cuda driver combination|"
                     "errorsystemdrivermismatch|forward compatibility was "
                     "attempted on non supported hw|"
                     "errorcompatnotsupportedondevice"),
      // Out of memory: the device may be fine once this task's tensors are
      // freed, or may be failing; the worker's error budget decides.
      type_rule("device.out_of_memory_type", kAmbiguous, "out_of_memory",
                "^torch\\.[\\w.]*OutOfMemoryError\\b"),
      engine_message("device.out_of_memory", kAmbiguous, "out_of_memory",
                     device(" out of memory") + "|" +
                         device(" runtime error: out of memory") +
                         "|\\bmps backend out of memory|" +
                         device(" error: out of memory") +
                         "|(?:cuda|hip)error(?:outofmemory|memoryallocation)|"
                         "(?:cublas|cudnn|hipblas|miopen)_status_alloc_failed|"
                         "cuda_error_out_of_memory|hipoutofmemory"),

      // ==== Ascend NPU (torch_npu, CANN) ====================================
      // Task-queue stops and hardware faults torch_npu reports as text
      // (torch_npu/csrc/core/npu/NPUException.cpp).
      engine_message("npu.device_fault", kFatal, "device",
                     "\\bforce stop\\b|\\buce error\\b|hbm multi bit ecc "
                     "error|suspect mem error|(?:hccs|ub) link error|device "
                     "task abort|suspect remote error"),
      // ACL runtime error codes (CANN's rt_error_codes.h): the task
      // scheduler's internal error and lost heartbeat (507001, 507010), DMA
      // errors, AI Core, AI CPU and vector core exceptions and timeouts,
      // stream and event synchronisation timeouts, device memory UCE and HBM
      // ECC errors, link and remote errors (507053-507057), driver and AI
      // CPU internal errors, a broken host-device link, a failed HCCL retry
      // (507899-507904), the device setting up (507033), a model execution
      // failing on the device and its report timing out (507011, 507012,
      // and 507010/507013 around them), and tasks or
      // streams aborted on the device (107022, 107023, 107035). torch_npu
      // prints them as "error code is N", CANN as "runtime result = N".
      engine_message(
          "npu.acl_runtime_error", kFatal, "device",
          "(?:error ?code(?: is)?|ret(?:urn)? ?code|errno|\\berr|runtime "
          "result)[ =:]*(?:5070(?:01|1[0-8]|3[3456]|4[2-9]|5[0-7])"
          "|507899|5079(?:0[0-4])|1070(?:2[23]|35))\\b"),
      engine_message("npu.execution_abnormal", kFatal, "device",
                     "the (?:aicore|aicpu|vector core) execution (?:is "
                     "abnormal|times out)|task scheduler loses the heartbeat|"
                     "there is an? (?:aicore|aivec|aic|aiv|aicpu|vector core) "
                     "(?:error )?exception|there is an? sdma error|"
                     "(?:aicore|aicpu) exception|"
                     "exception of (?:fftsplus )?(?:aicore|aivec|aicpu|sdma) "
                     "error|"
                     "hardware execution error|host device communication "
                     "\\(hdc\\) session is disconnected"),
      // torch_npu's own words after a CANN inner error (E?9999: EZ9999,
      // EE9999, EH9999...), which torch_npu also reports as "CANN Inner
      // Error".
      engine_message(
          "npu.inner_error", kFatal, "device",
          "the process exits for this inner error|\\be[0-9a-z]9999:? "
          "inner error|cann inner error"),
      // CANN's device error report (device_error_proc.cc): printed only when
      // the device itself reports a task exception or timeout (AI Core, SDMA,
      // HCCL FFTS+ tasks), with the chip and die it came from.
      engine_message(
          "npu.device_error_report", kFatal, "device",
          "the error from device\\s*\\(|\\bdevice_error_proc\\.cc\\b"),
      // HCCL reports its own failures with EI codes (EI0001...: transport
      // init, link, timeout); the communicator is unusable afterwards.
      engine_message("npu.hccl_error_code", kFatal, "collective",
                     "\\bei\\d{4}: |\\w\\(ei\\d{4}\\)"),
      engine_message("npu.sync_failed", kFatal, "device",
                     "acl stream synchronize failed|aclrtsynchronize"
                     "(?:stream|device|event)(?:withtimeout)? failed|"
                     "rtstreamsynchronize\\S* (?:execute )?failed|all tasks "
                     "in the specified stream are not completed|stream "
                     "synchroni[sz]e timeout"),
      // torch_npu logs this when aclrtGetDeviceCount fails and then reports
      // zero devices (c10_npu device_count); ACL_ERROR_RT_NO_DEVICE is 207004.
      engine_message("npu.no_device", kHeuristic, "engine_start",
                     "get device count of npu failed|acl_error_rt_no_device|"
                     "(?:error ?code(?: is)?|runtime result)[ =:]*207004\\b"),
      engine_message("npu.out_of_memory", kAmbiguous, "out_of_memory",
                     "\\bel0004\\b|failed to allocate memory|the memory on "
                     "the device is exhausted|acl_error_rt_memory_allocation|"
                     "(?:error ?code(?: is)?)[ =:]*20(?:70(?:01|05|18)|0000)"
                     "\\b"),

      // ==== Apple silicon: MLX (Metal) and PyTorch MPS ======================
      // MLX poisons the device after a failed command buffer, so every later
      // evaluation fails (mlx/backend/metal/device.cpp).
      engine_message("metal.command_buffer_fault", kFatal, "device",
                     "command buffer execution failed: (?:caused gpu "
                     "(?:address fault|timeout|hang)|discarded|internal "
                     "error|invalid resource|page ?fault|not permitted|"
                     "ignored|impacting interactivity)|"
                     "kio(?:gpu|accel)commandbuffercallbackerror(?:pagefault|"
                     "timeout|"
                     "hang|submissionsignored|invalidresource|notpermitted|"
                     "impactinginteractivity|innocentvictim)|victim of gpu "
                     "error"),
      // Metal Performance Shaders and Metal itself assert inside the
      // framework ("<File>.mm:<line>: failed assertion `...'", or
      // "-[<Class> <method>]:<line>: failed assertion `...'") and abort the
      // process (PyTorch's MPS backend, MLX, ggml-metal).
      engine_message("metal.failed_assertion", kFatal, "worker_dead",
                     "\\.mm:\\d+: failed assertion|\\]:\\d+: failed assertion|"
                     "mtlreportfailure"),
      // MLX finds no Metal device or cannot create its queue or events, or
      // was built without a GPU backend: no evaluation can run
      // (mlx/backend/metal/device.cpp, event.cpp; mlx/backend/no_metal,
      // no_gpu).
      engine_message("metal.no_device", kFatal, "device",
                     "no metal device available|failed to make new command "
                     "queue|failed to create metal shared event|unable to "
                     "construct residency set|without metal backend|gpu "
                     "backend is not available|cannot make gpu stream without "
                     "gpu backend"),
      engine_message("metal.mps_command_buffer", kHeuristic, "device",
                     "command buffer exited with error status"),
      engine_message(
          "metal.out_of_memory", kAmbiguous, "out_of_memory",
          "kio(?:gpu|accel)commandbuffercallbackerroroutofmemory|command "
          "buffer execution failed: insufficient memory|"
          "\\[metal::malloc\\] attempting to allocate|resource "
          "limit \\(\\d+\\) exceeded|\\[malloc\\] unable to "
          "allocate \\d+ bytes"),
      // mlx.nn.Module.load_weights (strict, how mlx-lm and mlx-vlm load a
      // model) refuses a checkpoint whose parameters do not match the model:
      // raised while the engine is built, so it never serves.
      engine_message("mlx.load_weights", kHeuristic, "engine_start",
                     "received \\d+ parameters not in model|\\bmissing \\d+ "
                     "parameters: |expected shape \\([\\d, ]*\\) but received "
                     "shape \\([\\d, ]*\\) for parameter "),
      engine_message("metal.missing_kernels", kFatal, "engine_start",
                     "failed to load the (?:default )?metallib|can not load "
                     "metallib|unable to load (?:kernel|function)|unable to "
                     "build metal library"),

      // ==== Collective communication ========================================
      // A failed collective leaves the communicator (and usually the device
      // context) broken on every tensor-parallel rank. NCCL's names and their
      // RCCL, HCCL (Ascend), CNCL (Cambricon), MCCL (Moore Threads / MetaX),
      // ECCL (Enflame) and TCCL (Tecorigin) counterparts.
      engine_message("collective.error", kFatal, "collective",
                     "\\b(?:nccl|rccl|hccl|cncl|mccl|eccl|tccl) error\\b|"
                     "\\b(?:nccl|rccl|hccl|cncl|mccl|eccl|tccl)(?:unhandled"
                     "\\w*error|systemerror|internalerror|remoteerror|"
                     "invalidusage)\\b|hccl function error|call hccl api "
                     "failed|hccl op retry failed"),
      engine_message("collective.watchdog", kFatal, "collective",
                     "watchdog caught collective operation timeout|process "
                     "group watchdog thread terminated|(?:nccl|rccl|hccl|"
                     "cncl|mccl|eccl|tccl) watchdog thread terminated|"
                     "heartbeat monitor timed out|watchdog got stuck for \\d+ "
                     "seconds|"
                     "(?:nccl|hccl) "
                     "communicator (?:was )?aborted|some (?:nccl|hccl) "
                     "operations have failed or timed out|wait execution of "
                     "the notify register times out"),
      type_rule("collective.backend_error", kFatal, "collective",
                "^torch\\.[\\w.]*DistBackendError\\b"),
      engine_message("collective.store_timeout", kHeuristic, "collective",
                     "timed out after \\d+ seconds waiting for clients|"
                     "(?:barrier|rendezvous|store) (?:timed out|timeout)|"
                     "connection closed by peer"),
      type_rule("collective.store_error", kHeuristic, "collective",
                "^torch\\.[\\w.]*DistStoreError\\b"),
      // The c10d store's sockets: the ranks cannot reach each other while
      // the process group forms, so the engine never starts.
      type_rule("collective.store_network", kHeuristic, "collective",
                "^torch\\.[\\w.]*DistNetworkError\\b"),
      engine_message("collective.store_socket", kHeuristic, "collective",
                     "the client socket has failed to connect to any network "
                     "address|the server socket has failed to listen on any "
                     "local network address|the client socket has timed out "
                     "after \\d+"),

      // ==== Any engine: plain-language death notices =========================
      engine_message("engine.dead", kHeuristic, "engine_dead",
                     "\\b(?:inference )?engine (?:is |has )?(?:dead|died|"
                     "gone)\\b"),
      engine_message("engine.unrecoverable", kHeuristic, "engine_dead",
                     "\\bunrecoverable\\b[^\\n]*\\b(?:engine|vllm)\\b|\\b(?:"
                     "engine|vllm)\\b[^\\n]*\\bunrecoverable\\b"),

      // ==== Task-local: one request or one document =========================
      // One prompt over the model's context length.
      any_message("vllm.context_length", kTaskLocal, "request_too_long",
                  "longer than the maximum model length|maximum context "
                  "length is \\d+|exceeds the maximum model length|"
                  "prompt \\(length \\d+\\) is longer"),
      // mineru_vl_utils' RequestError: one request's output was unusable.
      type_rule("mineru_vl_utils.request_error", kTaskLocal, "request",
                "^mineru_vl_utils\\.[\\w.]*RequestError\\b"),
      // The VLM server of an http-client backend failed or is unreachable:
      // a remote engine, never this worker's.
      type_rule("remote.server_error", kTaskLocal, "remote_engine",
                "^mineru_vl_utils\\.[\\w.]*ServerError\\b[^@]*@mineru_vl_"
                "utils\\.vlm_client\\.http_client\\b"),
      type_rule("remote.http_error", kTaskLocal, "remote_engine",
                "^(?:httpx|httpcore|openai|aiohttp|requests|urllib3)\\.[\\w.]*"
                "(?:ConnectError|RemoteProtocolError|ReadError|WriteError|"
                "NetworkError|HTTPStatusError|APIConnectionError|"
                "InternalServerError|APIStatusError|ServerDisconnectedError|"
                "ClientConnectorError|ClientResponseError|ConnectionError|"
                "ProtocolError|HTTPError|BadRequestError|AuthenticationError|"
                "PermissionDeniedError|NotFoundError|ConflictError|"
                "UnprocessableEntityError|RateLimitError|InvalidRequestError|"
                "ServiceUnavailableError|APIError)\\b"),
      // Documents: corrupt, encrypted, unreadable or hostile files.
      type_rule("pdfium.error", kTaskLocal, "bad_input",
                "^pypdfium2\\.[\\w.]*PdfiumError\\b"),
      any_message("pdfium.error_message", kTaskLocal, "bad_input",
                  "failed to load (?:document|page) \\(pdfium: "),
      type_rule("pil.unidentified_image", kTaskLocal, "bad_input",
                "^PIL\\.[\\w.]*UnidentifiedImageError\\b"),
      type_rule("pil.decompression_bomb", kTaskLocal, "bad_input",
                "^PIL\\.[\\w.]*DecompressionBombError\\b"),
      type_rule("document.bad_file", kTaskLocal, "bad_input",
                "^(?:lxml\\.[\\w.]*(?:XMLSyntaxError|ParserError|"
                "DocumentInvalid)|xml\\.[\\w.]*(?:ParseError|ExpatError)|"
                "zipfile\\.[\\w.]*(?:BadZipFile|BadZipfile|LargeZipFile)|"
                "docx\\.[\\w.]*(?:PackageNotFoundError|InvalidXmlError)|"
                "openpyxl\\.[\\w.]*InvalidFileException|pptx\\.[\\w.]*"
                "PackageNotFoundError|pdfminer\\.[\\w.]*(?:PDFSyntaxError|"
                "PSEOF|PDFEncryptionError|PDFPasswordIncorrect)|pypdf\\."
                "[\\w.]*(?:PdfReadError|PdfStreamError|FileNotDecryptedError))"
                "\\b"),
      any_message("mineru.load_file_failed", kTaskLocal, "bad_input",
                  "failed to load file "),
      any_message("mineru.render_timeout", kTaskLocal, "timeout",
                  "pdf image rendering timeout"),
      // One request cancelled or timed out, judged by class. Generic: task-
      // local only when nothing else in the chain says the engine is gone.
      type_rule("request.cancelled", kGeneric, "cancelled",
                "^(?:asyncio(?:\\.exceptions)?\\.|concurrent\\.futures(?:\\._"
                "base)?\\.)?CancelledError\\b"),
      type_rule("request.timeout", kGeneric, "timeout",
                "^(?:builtins\\.|asyncio(?:\\.exceptions)?\\.|concurrent\\."
                "futures(?:\\._base)?\\.)?TimeoutError\\b|^openai\\.[\\w.]*"
                "APITimeoutError\\b|^httpx\\.[\\w.]*Timeout(?:Exception)?\\b|"
                "^(?:httpcore|aiohttp|requests|urllib3)\\.[\\w.]*"
                "(?:Timeout|TimeoutError)\\b"),
  };
}

}  // namespace mineru_health
