// The rules that ship with the package.
//
// Every pattern is matched, case-insensitively, against two forms of each
// frame's text "module.Type (Base1 Base2): message" (see docs/rules.md):
// the sanitized text, and its compact form (ASCII letters and digits
// lower-cased, other ASCII dropped, non-ASCII kept). A pattern written in
// lower-case letters and digits only, such as `enginedeaderror`, therefore
// also meets "Engine_Dead_Error" or "engine-dead-error"; a pattern with
// spaces or punctuation can only meet the sanitized text.
//
// Order matters only for ties: when several rules of one kind match the same
// frame, the first listed names the verdict.
//
// Deliberately absent:
// - CUDA out of memory (torch.OutOfMemoryError, "CUDA out of memory"). When
//   vLLM's EngineCore hits it inside a step, the core process dies and the
//   worker sees EngineDeadError, which is fatal by its own rule. When it is
//   raised in the worker's own process (layout/OCR models, one oversized
//   page, an in-process engine refusing one request), PyTorch's allocator
//   recovers once the request's tensors are freed and the next task usually
//   succeeds; restarting the worker would drop every other task in flight.
//   It is not a task-local rule either, so that a fatal frame elsewhere in
//   the same chain still decides.
// - PIL's "Operation on closed image": under concurrency it has killed
//   vLLM's EngineCore (MinerU PR #4979). When that happens the engine's own
//   EngineDeadError follows and is fatal; a task-local rule here would
//   override it whenever both appear in one chain.
// - lmdeploy's ErrorCode ENGINE_UNAVAILABLE ("The inference engine is
//   unavailable."): it also covers a sleeping engine and unknown sessions,
//   which are not fatal.
#include <string>
#include <vector>

#include "mineru_health/classifier.h"

namespace mineru_health {

namespace {

Rule fatal(std::string id, std::string category, std::string pattern) {
  return Rule{std::move(id), RuleKind::kFatal, std::move(category),
              std::move(pattern)};
}

Rule task_local(std::string id, std::string category, std::string pattern) {
  return Rule{std::move(id), RuleKind::kTaskLocal, std::move(category),
              std::move(pattern)};
}

}  // namespace

std::vector<Rule> builtin_rules() {
  return {
      // ---- vLLM -----------------------------------------------------------
      // v0: AsyncLLMEngine raises AsyncEngineDeadError once its background
      // loop failed; the multiprocessing front end raises MQEngineDeadError.
      // Listed before the v1 rule so their own id names the verdict.
      fatal("vllm.v0.engine_dead", "engine_dead",
            "asyncenginedeaderror|mqenginedeaderror"),
      // v1: vllm.v1.engine.exceptions.EngineDeadError, raised to every
      // caller once the EngineCore process is gone. Compact form, so the
      // class name also matches when re-spelled or embedded in a message.
      fatal("vllm.engine_dead", "engine_dead", "enginedeaderror"),
      // v1 EngineDeadError's fixed message, for wrappers that keep only str().
      fatal("vllm.engine_core_issue", "engine_dead",
            "engine ?core encountered an issue"),
      // v1 startup: the core process failed while loading the model or
      // allocating the KV cache. In MinerU the engine is built on the first
      // task, so this reaches the worker as a task failure.
      fatal("vllm.engine_core_init_failed", "engine_start",
            "engine core initialization failed"),
      // v1 client-side monitor text when a core process exits.
      fatal("vllm.engine_core_proc_died", "engine_dead",
            "engine ?core proc\\S* \\S+ died unexpectedly"),
      // v0 AsyncLLMEngine messages.
      fatal("vllm.v0.background_loop", "engine_dead",
            "background loop has errored already|background loop is not "
            "running"),
      // v0 multiprocessing engine messages.
      fatal("vllm.v0.engine_loop", "engine_dead",
            "engine loop is not running|engine loop has died|engine process "
            "\\(pid \\d+\\) died"),

      // ---- SGLang -----------------------------------------------------------
      // A server subprocess logs "<Component> hit an exception" before it
      // signals the parent, which then tears the whole tree down.
      fatal("sglang.subprocess_exception", "engine_dead",
            "(?:scheduler|detokenizer ?(?:manager)?|tokenizer ?manager|data "
            "?parallel ?controller) hit an exception"),
      fatal("sglang.child_failed", "engine_dead",
            "received sigquit from a child process"),
      fatal("sglang.scheduler_dead", "engine_dead",
            "rank \\d+ scheduler is dead"),

      // ---- lmdeploy -------------------------------------------------------
      // The PyTorch engine's health texts once its loops are gone, and the
      // log line written when the main loop raised.
      fatal("lmdeploy.engine_loop_stopped", "engine_dead",
            "engine (?:main |request )?loop (?:has stopped|is not "
            "alive|task has stopped)|engine main loop failed"),
      // ResponseType.ENGINE_STOP_ERROR, set on requests whose engine loop
      // died while they waited.
      fatal("lmdeploy.engine_stop_error", "engine_dead", "enginestoperror"),

      // ---- Any engine -------------------------------------------------------
      // Plain-language death notices (the family MinerU PR #5188 matched).
      // Word boundaries keep "engine deadline" out.
      fatal("engine.dead", "engine_dead",
            "\\b(?:inference )?engine (?:is |has )?(?:dead|died|gone)\\b"),
      fatal("engine.unrecoverable", "engine_dead",
            "\\bunrecoverable\\b[^\\n]*\\b(?:engine|vllm)\\b|\\b(?:engine|vllm)"
            "\\b[^\\n]*\\bunrecoverable\\b"),

      // ---- CUDA: sticky errors ----------------------------------------------
      // After these the CUDA context is unusable for the rest of the
      // process: every later kernel launch fails, so only a restart helps.
      fatal("cuda.illegal_address", "cuda",
            "illegal memory access was encountered|cudaerrorillegaladdress"),
      fatal("cuda.device_assert", "cuda",
            "device-side assert(?:ion)? triggered|cudaerrorassert"),
      fatal("cuda.launch_failure", "cuda",
            "unspecified launch failure|cudaerrorlaunchfailure"),
      fatal("cuda.ecc_uncorrectable", "cuda",
            "uncorrectable ecc error|cudaerroreccuncorrectable"),
      fatal("cuda.illegal_instruction", "cuda",
            "illegal instruction was encountered|"
            "cudaerrorillegalinstruction"),
      fatal("cuda.misaligned_address", "cuda",
            "misaligned address|cudaerrormisalignedaddress"),
      fatal("cuda.hardware_stack_error", "cuda",
            "hardware stack error|cudaerrorhardwarestackerror"),
      fatal("cuda.invalid_pc", "cuda",
            "invalid program counter|cudaerrorinvalidpc"),
      fatal("cuda.launch_timeout", "cuda",
            "launch timed out and was terminated|cudaerrorlaunchtimeout"),

      // ---- NCCL / torch.distributed -----------------------------------------
      // A failed collective leaves the communicator (and usually the CUDA
      // context) broken for every tensor-parallel rank.
      fatal("nccl.error", "nccl", "\\bnccl error\\b"),
      fatal("nccl.error_code", "nccl",
            "ncclunhandledcudaerror|ncclsystemerror|ncclinternalerror|"
            "ncclremoteerror"),
      fatal("nccl.watchdog_timeout", "nccl",
            "watchdog caught collective operation timeout"),
      fatal("nccl.communicator_aborted", "nccl",
            "nccl communicator (?:was )?aborted"),
      fatal("torch.dist_backend_error", "nccl", "distbackenderror"),

      // ---- Task-local: these win over any fatal rule in the same chain ----
      // v1 AsyncLLM.generate() wraps a failure of one request in it; the
      // engine itself is fine (its docstring calls it recoverable).
      task_local("vllm.engine_generate_error", "request",
                 "enginegenerateerror"),
      // One prompt (text plus image tokens) over max_model_len: vLLM's
      // processor and its OpenAI server each word it their own way.
      task_local("vllm.context_length", "request_too_long",
                 "longer than the maximum model length|maximum context "
                 "length is \\d+"),
      // mineru_vl_utils' RequestError: one request's output was unusable
      // (e.g. truncated by the length limit).
      task_local("mineru_vl_utils.request_error", "request",
                 "^mineru_vl_utils\\.[\\w.]*RequestError\\b"),
      // A corrupt, encrypted or truncated PDF (pypdfium2's PdfiumError,
      // e.g. "Failed to load document (PDFium: Data format error).").
      task_local("pdfium.error", "bad_input", "pdfiumerror"),
      // MinerU's API wraps an unreadable upload this way.
      task_local("mineru.load_file_failed", "bad_input",
                 "failed to load file "),
      task_local("pil.unidentified_image", "bad_input",
                 "unidentifiedimageerror|cannot identify image file"),
      task_local("pil.decompression_bomb", "bad_input",
                 "decompressionbomberror"),
      // MinerU's page rasterizer gave up on one document.
      task_local("mineru.render_timeout", "timeout",
                 "pdf image rendering timeout"),
      // One request cancelled or timed out. Anchored on the exception's own
      // type (the start of the frame text), so a message merely mentioning
      // a timeout does not count.
      task_local("request.cancelled", "cancelled",
                 "^(?:asyncio(?:\\.exceptions)?\\.|concurrent\\.futures(?:\\._"
                 "base)?\\.)?CancelledError\\b"),
      task_local(
          "request.timeout", "timeout",
          "^(?:builtins\\.|asyncio(?:\\.exceptions)?\\.)?TimeoutError\\b|"
          "^openai\\.[\\w.]*APITimeoutError\\b|"
          "^httpx\\.[\\w.]*Timeout(?:Exception)?\\b"),
  };
}

}  // namespace mineru_health
