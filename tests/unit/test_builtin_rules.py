"""One example per built-in rule (table-driven), and the same text from a document.

Every built-in rule id must appear in EXAMPLES: the table is the executable
half of docs/rules.md's rule list. Each example is classified alone and must
be decided by its rule. Message rules scoped to engines are then re-tried with
the same text raised by MinerU's document code, which must never be fatal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import generated_docs
from mineru_health.classifier import builtin_rules, default_rules
from mineru_health.frames import Frame

EXC = ("Exception", "BaseException")
RT = ("RuntimeError", *EXC)
LLAMA = ("MineruLlamaCppError", *EXC)

# rule id -> (module, type, bases, message, raised_in)
EXAMPLES: dict[str, tuple[str, str, tuple[str, ...], str, str]] = {
    # vLLM V1
    "vllm.engine_dead": (
        "vllm.v1.engine.exceptions",
        "EngineDeadError",
        EXC,
        "EngineCore encountered an issue.",
        "vllm.v1.engine.async_llm",
    ),
    "vllm.engine_core_issue": (
        "builtins",
        "RuntimeError",
        EXC,
        "EngineCore encountered an issue. See stack trace (above)",
        "vllm.v1.engine.core_client",
    ),
    "vllm.engine_core_fatal": (
        "",
        "",
        (),
        ("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),
        "",
    ),
    "vllm.engine_core_init_failed": (
        "builtins",
        "RuntimeError",
        EXC,
        "Engine core initialization failed. See root cause above.",
        "vllm.v1.engine.utils",
    ),
    "vllm.kv_cache_start": (
        "builtins",
        "ValueError",
        EXC,
        ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"),
        "vllm.v1.core.kv_cache_utils",
    ),
    "vllm.worker_died": (
        "",
        "",
        (),
        ("Worker proc VllmWorker-0 died unexpectedly, shutting down executor."),
        "",
    ),
    "vllm.rpc_timeout": (
        "builtins",
        "TimeoutError",
        ("OSError", *EXC),
        "RPC call to execute_model timed out.",
        "vllm.v1.executor.multiproc_executor",
    ),
    "vllm.engine_generate_error": (
        "vllm.v1.engine.exceptions",
        "EngineGenerateError",
        EXC,
        "",
        "vllm.v1.engine.async_llm",
    ),
    # vLLM V0
    "vllm.v0.engine_dead": (
        "vllm.engine.async_llm_engine",
        "AsyncEngineDeadError",
        RT,
        "Background loop has errored already.",
        "vllm.engine.async_llm_engine",
    ),
    "vllm.v0.background_loop": ("", "", (), "Background loop has errored already.", ""),
    "vllm.v0.engine_loop": ("", "", (), "Engine loop is not running. Inspect the stacktrace", ""),
    "vllm.v0.task_finished": (
        "",
        "",
        (),
        "Task finished unexpectedly. This should never happen!",
        "",
    ),
    # ordinary errors inside engine loops
    "engine.loop_error": ("builtins", "AssertionError", EXC, "", "vllm.v1.core.sched.scheduler"),
    "engine.scheduler_value_error": (
        "builtins",
        "ValueError",
        EXC,
        "bad block table",
        "vllm.core.block_manager",
    ),
    "engine.loop_oom": (
        "torch",
        "OutOfMemoryError",
        RT,
        ("CUDA out of memory. Tried to allocate 2.00 GiB"),
        "vllm.model_executor.layers.linear",
    ),
    "engine.start_config": (
        "builtins",
        "ValueError",
        EXC,
        "Unknown quantization method: awq_x",
        "vllm.config.model",
    ),
    "engine.start_import": (
        "builtins",
        "ModuleNotFoundError",
        ("ImportError", *EXC),
        "No module named 'dlinfer'",
        "lmdeploy.pytorch.backends.selector",
    ),
    # lmdeploy
    "lmdeploy.rpc_server_dead": (
        "lmdeploy.pytorch.engine.mp_engine",
        "RPCServerDeadError",
        EXC,
        "",
        "lmdeploy.pytorch.engine.mp_engine.zmq_rpc",
    ),
    "lmdeploy.engine_loop_stopped": (
        "",
        "",
        (),
        ("lmdeploy - ERROR - Engine loop failed with error: map::at"),
        "",
    ),
    "lmdeploy.engine_stop_error": ("", "", (), "EngineStopError", ""),
    "lmdeploy.loop_task_failed": (
        "",
        "",
        (),
        ("lmdeploy - ERROR - model_agent.py:470 - Task <ModelAgentLoop> failed"),
        "",
    ),
    "lmdeploy.kv_cache_start": (
        "builtins",
        "RuntimeError",
        EXC,
        "No enough gpu memory for kv cache.",
        "lmdeploy.pytorch.engine.executor.base",
    ),
    "lmdeploy.env_check_failed": ("", "", (), "lmdeploy - ERROR - <dlinfer> check failed!", ""),
    "lmdeploy.env_check_exit": (
        "builtins",
        "SystemExit",
        ("BaseException",),
        "1",
        "lmdeploy.pytorch.check_env.base",
    ),
    "lmdeploy.turbomind_unbuilt": (
        "builtins",
        "ModuleNotFoundError",
        ("ImportError", *EXC),
        "No module named '_turbomind'",
        "lmdeploy.turbomind",
    ),
    "lmdeploy.engine_unavailable": (
        "builtins",
        "RuntimeError",
        EXC,
        "The inference engine is unavailable",
        "lmdeploy.serve",
    ),
    "lmdeploy.turbomind_fatal": (
        "builtins",
        "RuntimeError",
        EXC,
        "[TM][ERROR] Assertion fail: llama_batch.cc:412",
        "lmdeploy.serve.async_engine",
    ),
    "lmdeploy.turbomind_cuda_error": (
        "builtins",
        "RuntimeError",
        EXC,
        (
            "[TM][ERROR] CUDA runtime error: operation not supported "
            "/lmdeploy/src/turbomind/utils/allocator.h:197"
        ),
        "lmdeploy.turbomind.turbomind",
    ),
    "lmdeploy.context_length": (
        "builtins",
        "RuntimeError",
        EXC,
        "the request exceeds the model context length",
        "lmdeploy.serve.async_engine",
    ),
    # SGLang
    "sglang.subprocess_exception": ("", "", (), "Scheduler hit an exception: Traceback", ""),
    "sglang.child_failed": ("", "", (), "Received sigquit from a child process.", ""),
    "sglang.scheduler_dead": ("", "", (), "Rank 0 scheduler is dead.", ""),
    # llama.cpp (mineru_llama_cpp): the binding's classes, raised from engine.py
    "llama.engine_stopped": (
        "mineru_llama_cpp.exceptions",
        "EngineError",
        LLAMA,
        "no result (stopped)",
        "mineru_llama_cpp.engine",
    ),
    "llama.engine_start": (
        "builtins",
        "RuntimeError",
        EXC,
        "load_model failed",
        "mineru_llama_cpp.engine",
    ),
    "llama.compute_error": (
        "mineru_llama_cpp.exceptions",
        "EngineError",
        LLAMA,
        "Compute error.",
        "mineru_llama_cpp.engine",
    ),
    "llama.context_exceeded": (
        "mineru_llama_cpp.exceptions",
        "ContextExceededError",
        ("InvalidRequestError", *LLAMA),
        "the request exceeds the available context size",
        "mineru_llama_cpp.engine",
    ),
    "llama.context_exceeded_message": (
        "mineru_llama_cpp.exceptions",
        "EngineError",
        LLAMA,
        "Context size has been exceeded.",
        "mineru_llama_cpp.engine",
    ),
    "llama.invalid_request": (
        "mineru_llama_cpp.exceptions",
        "InvalidRequestError",
        LLAMA,
        "Failed to load image or audio file",
        "mineru_llama_cpp.engine",
    ),
    "llama.invalid_batch": (
        "mineru_llama_cpp.exceptions",
        "EngineError",
        LLAMA,
        "Invalid input batch.",
        "mineru_llama_cpp.engine",
    ),
    "ggml.abort": (
        "",
        "",
        (),
        ("/src/ggml/src/ggml-cuda/ggml-cuda.cu:88: GGML_ASSERT(ids.ne[1] == 1) failed"),
        "",
    ),
    "ggml.metal_error_state": (
        "",
        "",
        (),
        (
            "ggml_metal_graph_compute: backend is in error state "
            "from a previous command buffer failure - recreate the backend "
            "to recover"
        ),
        "",
    ),
    "vulkan.device_lost": (
        "mineru_llama_cpp.exceptions",
        "EngineError",
        LLAMA,
        "decode() failed: vk::Queue::submit: ErrorDeviceLost",
        "mineru_llama_cpp.engine",
    ),
    "rocm.queue_abort": (
        "",
        "",
        (),
        (
            ":0:rocdevice.cpp :3586: Callback: Queue 0x772c40900000 "
            "aborting with error : HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime "
            "failed to allocate the necessary resources. code: 0x1008"
        ),
        "",
    ),
    "npu.no_device": (
        "",
        "",
        (),
        (
            "[ERROR] APP(846,python) [log_inner.cpp:76] device_count:25: "
            '"[PTA]:"get device count of NPU failed""'
        ),
        "",
    ),
    "mlx.load_weights": (
        "builtins",
        "ValueError",
        EXC,
        ("Missing 1 parameters: \nlanguage_model.lm_head.weight."),
        "mlx.nn.layers.base",
    ),
    "vulkan.out_of_memory": (
        "mineru_llama_cpp.exceptions",
        "EngineError",
        LLAMA,
        ("decode() failed: vk::Device::allocateMemory: ErrorOutOfDeviceMemory"),
        "mineru_llama_cpp.engine",
    ),
    # Ray and processes
    "ray.actor_died": (
        "ray.exceptions",
        "ActorDiedError",
        ("RayActorError", "RayError", *EXC),
        "The actor died unexpectedly before finishing this task.",
        "ray._private.worker",
    ),
    "ray.actor_died_message": (
        "",
        "",
        (),
        ("The actor died unexpectedly before finishing this task."),
        "",
    ),
    "ray.out_of_memory": (
        "ray.exceptions",
        "OutOfMemoryError",
        ("RayError", *EXC),
        "Task was killed due to the node running low on memory.",
        "ray._private.worker",
    ),
    "ray.system_error": (
        "ray.exceptions",
        "OwnerDiedError",
        ("ObjectLostError", "RayError", *EXC),
        "Failed to retrieve object",
        "ray._private.worker",
    ),
    "process.killed_by_signal": (
        "",
        "",
        (),
        ("Worker proc 1234 was terminated by signal SIGKILL"),
        "",
    ),
    "process.aborted": (
        "",
        "",
        (),
        ("terminate called after throwing an instance of 'std::runtime_error'"),
        "",
    ),
    "process.assert_failed": (
        "",
        "",
        (),
        (
            "llama-server: src/llama-context.cpp:1021: "
            "Assertion `status == LLAMA_MEMORY_STATUS_SUCCESS' failed."
        ),
        "",
    ),
    "vllm.custom_all_reduce_exit": (
        "",
        "",
        (),
        ("Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'"),
        "",
    ),
    # CUDA-like sticky faults
    "cuda.illegal_address": (
        "torch",
        "AcceleratorError",
        RT,
        "CUDA error: an illegal memory access was encountered",
        "",
    ),
    "cuda.device_assert": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: device-side assert triggered",
        "torch.nn.functional",
    ),
    "cuda.launch_failure": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: unspecified launch failure",
        "torch.cuda",
    ),
    "cuda.ecc_uncorrectable": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: uncorrectable ECC error encountered",
        "torch.cuda",
    ),
    "cuda.illegal_instruction": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: an illegal instruction was encountered",
        "torch.cuda.streams",
    ),
    "cuda.misaligned_address": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: misaligned address",
        "torch.nn.functional",
    ),
    "cuda.hardware_stack_error": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: hardware stack error",
        "torch.cuda",
    ),
    "cuda.invalid_pc": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: invalid program counter",
        "torch.cuda",
    ),
    "cuda.invalid_address_space": (
        "builtins",
        "RuntimeError",
        EXC,
        ("CUDA error: operation not supported on global/shared address space"),
        "torch.cuda",
    ),
    "cuda.launch_timeout": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: the launch timed out and was terminated",
        "torch.cuda",
    ),
    "cuda.library_execution_failed": (
        "builtins",
        "RuntimeError",
        EXC,
        ("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`"),
        "torch.nn.modules.linear",
    ),
    "cuda.device_lost": (
        "",
        "",
        (),
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "",
    ),
    "cuda.unknown_error": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: unknown error",
        "torch.cuda",
    ),
    "cuda.graph_capture": ("builtins", "RuntimeError", EXC, "capture failed", "torch.cuda.graphs"),
    "cuda.stream_capture": (
        "builtins",
        "RuntimeError",
        EXC,
        "CUDA error: operation not permitted when stream is capturing",
        "torch.cuda",
    ),
    "rocm.memory_fault": (
        "",
        "",
        (),
        (
            "Memory access fault by GPU node-2 (Agent handle: 0x55d) on "
            "address 0x7f. Reason: Page not present"
        ),
        "",
    ),
    "device.missing_kernels": (
        "builtins",
        "RuntimeError",
        EXC,
        "HIP error: invalid device function",
        "torch.utils._device",
    ),
    "device.no_driver": (
        "builtins",
        "RuntimeError",
        EXC,
        "Found no NVIDIA driver on your system.",
        "torch.cuda",
    ),
    "device.out_of_memory_type": ("torch", "OutOfMemoryError", RT, "allocation failed", ""),
    "device.out_of_memory": (
        "builtins",
        "RuntimeError",
        EXC,
        "NPU out of memory. Tried to allocate 22.00 MiB",
        "torch_npu.npu",
    ),
    # Ascend
    "npu.device_fault": ("builtins", "RuntimeError", EXC, "FORCE STOP", "torch_npu.npu"),
    "npu.acl_runtime_error": (
        "builtins",
        "RuntimeError",
        EXC,
        ("aclnnMatmul failed, error code is 507015"),
        "torch_npu.npu.utils",
    ),
    "npu.execution_abnormal": ("", "", (), "The aicore execution is abnormal.", ""),
    "npu.inner_error": (
        "builtins",
        "RuntimeError",
        EXC,
        ("The Inner error is reported as above. The process exits for this inner error"),
        "torch_npu.npu",
    ),
    "npu.device_error_report": (
        "",
        "",
        (),
        ("The error from device(chipId:1, dieId:0), serial number is 3, there is an aicore error"),
        "",
    ),
    "npu.hccl_error_code": ("", "", (), "EI0009: Transport init error.", ""),
    "npu.sync_failed": (
        "builtins",
        "RuntimeError",
        EXC,
        "ACL stream synchronize failed.",
        "torch_npu.npu.utils",
    ),
    "npu.out_of_memory": (
        "builtins",
        "RuntimeError",
        EXC,
        "EL0004: Failed to allocate memory.",
        "torch_npu.npu",
    ),
    # Apple
    "metal.command_buffer_fault": (
        "builtins",
        "RuntimeError",
        EXC,
        ("[METAL] Command buffer execution failed: Caused GPU Hang Error"),
        "mlx_lm.generate",
    ),
    "metal.mps_command_buffer": ("", "", (), "Error: command buffer exited with error status.", ""),
    "metal.out_of_memory": (
        "builtins",
        "RuntimeError",
        EXC,
        "[METAL] Command buffer execution failed: Insufficient Memory",
        "mlx_lm.generate",
    ),
    "metal.missing_kernels": (
        "builtins",
        "RuntimeError",
        EXC,
        "Failed to load the default metallib.",
        "mlx.core",
    ),
    "metal.failed_assertion": (
        "",
        "",
        (),
        (
            "MPSNDArrayDescriptor.mm:84: failed assertion "
            "`[MPSNDArrayDescriptor sliceDimension:withSubrange:] error'"
        ),
        "",
    ),
    "metal.no_device": (
        "builtins",
        "RuntimeError",
        EXC,
        ("[metal::load_device] No Metal device available."),
        "mlx.core",
    ),
    # collectives
    "collective.error": (
        "builtins",
        "RuntimeError",
        EXC,
        ("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error"),
        "torch.distributed.distributed_c10d",
    ),
    "collective.watchdog": (
        "",
        "",
        (),
        (
            "[Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=2, OpType=ALLREDUCE)"
        ),
        "",
    ),
    "collective.backend_error": (
        "torch.distributed",
        "DistBackendError",
        RT,
        "",
        "torch.distributed.distributed_c10d",
    ),
    "collective.store_timeout": (
        "builtins",
        "RuntimeError",
        EXC,
        ("Timed out after 901 seconds waiting for clients. 1/2 clients joined."),
        "torch.distributed.elastic",
    ),
    "collective.store_error": (
        "torch.distributed",
        "DistStoreError",
        RT,
        "",
        "torch.distributed.rendezvous",
    ),
    "collective.store_network": (
        "torch.distributed",
        "DistNetworkError",
        RT,
        "",
        "torch.distributed.rendezvous",
    ),
    "collective.store_socket": (
        "builtins",
        "RuntimeError",
        EXC,
        ("The client socket has failed to connect to any network address of (10.0.0.2, 29500)."),
        "torch.distributed.rendezvous",
    ),
    # plain-language notices
    "engine.dead": (
        "builtins",
        "RuntimeError",
        EXC,
        "the inference engine is dead",
        "lmdeploy.serve.async_engine",
    ),
    "engine.unrecoverable": (
        "builtins",
        "RuntimeError",
        EXC,
        "vLLM hit an unrecoverable state",
        "vllm.entrypoints.llm",
    ),
    # task-local
    "vllm.context_length": (
        "builtins",
        "ValueError",
        EXC,
        ("The decoder prompt (length 16476) is longer than the maximum model length of 16384."),
        "vllm.v1.engine.processor",
    ),
    "mineru_vl_utils.request_error": (
        "mineru_vl_utils.vlm_client.base_client",
        "RequestError",
        ("ValueError", *EXC),
        "bad request",
        "mineru_vl_utils.vlm_client.http_client",
    ),
    "remote.server_error": (
        "mineru_vl_utils.vlm_client.base_client",
        "ServerError",
        RT,
        "Unexpected status code: [500]",
        "mineru_vl_utils.vlm_client.http_client",
    ),
    "remote.http_error": (
        "httpx",
        "ConnectError",
        ("TransportError", "RequestError", "HTTPError", *EXC),
        "All connection attempts failed",
        "httpx._transports.default",
    ),
    "pdfium.error": (
        "pypdfium2._helpers.misc",
        "PdfiumError",
        RT,
        "Failed to load document (PDFium: Data format error).",
        "pypdfium2._helpers.document",
    ),
    "pdfium.error_message": (
        "",
        "",
        (),
        "Failed to load document (PDFium: Data format error).",
        "",
    ),
    "pil.unidentified_image": (
        "PIL",
        "UnidentifiedImageError",
        ("OSError", *EXC),
        "cannot identify image file",
        "PIL.Image",
    ),
    "pil.decompression_bomb": (
        "PIL.Image",
        "DecompressionBombError",
        EXC,
        "Image size exceeds limit",
        "PIL.Image",
    ),
    "document.bad_file": ("zipfile", "BadZipFile", EXC, "File is not a zip file", "zipfile"),
    "mineru.load_file_failed": (
        "builtins",
        "Exception",
        ("BaseException",),
        "Failed to load file report.docx",
        "mineru.utils.io",
    ),
    "mineru.render_timeout": (
        "builtins",
        "TimeoutError",
        ("OSError", *EXC),
        "PDF image rendering timeout",
        "mineru.utils.pdf_image_tools",
    ),
    "request.cancelled": (
        "asyncio.exceptions",
        "CancelledError",
        ("BaseException",),
        "",
        "asyncio.tasks",
    ),
    "request.timeout": ("builtins", "TimeoutError", ("OSError", *EXC), "", "asyncio.timeouts"),
}


def _frame(example: tuple[str, str, tuple[str, ...], str, str]) -> Frame:
    module, type_name, bases, message, raised_in = example
    return Frame(module, type_name, bases, message, raised_in)


def test_every_builtin_rule_has_an_example() -> None:
    ids = [rule.id for rule in builtin_rules()]
    assert len(ids) == len(set(ids))
    assert sorted(set(ids) - set(EXAMPLES)) == []
    assert sorted(set(EXAMPLES) - set(ids)) == []


@pytest.mark.parametrize("rule_id", sorted(EXAMPLES))
def test_example_is_decided_by_its_rule(rule_id: str) -> None:
    rule = next(r for r in builtin_rules() if r.id == rule_id)
    verdict = default_rules().classify_frames([_frame(EXAMPLES[rule_id])])
    assert verdict.rule == rule_id, verdict
    assert verdict.fatal == (rule.strength in ("definitive", "heuristic")), verdict
    assert verdict.ambiguous == (rule.kind_name == "ambiguous"), verdict


ENGINE_MESSAGE_RULES = sorted(
    r.id for r in builtin_rules() if r.target_name != "type" and r.scope_name == "engine"
)


@pytest.mark.parametrize("rule_id", ENGINE_MESSAGE_RULES)
@pytest.mark.parametrize(
    ("module", "type_name", "raised_in"),
    [
        ("builtins", "ValueError", "mineru.backend.office.docx_analyze"),
        ("lxml.etree", "XMLSyntaxError", "lxml.etree"),
        ("builtins", "RuntimeError", "mineru_vl_utils.vlm_client.http_client"),
    ],
)
def test_engine_text_from_a_document_never_decides(
    rule_id: str, module: str, type_name: str, raised_in: str
) -> None:
    message = EXAMPLES[rule_id][3]
    frame = Frame(module, type_name, ("Exception", "BaseException"), message, raised_in)
    verdict = default_rules().classify_frames([frame])
    assert not verdict.fatal and not verdict.ambiguous, verdict
    assert verdict.rule != rule_id


RULES_DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"


def test_docs_list_every_builtin_rule() -> None:
    docs = RULES_DOC.read_text(encoding="utf-8")
    missing = [rule.id for rule in builtin_rules() if f"`{rule.id}`" not in docs]
    assert missing == [], "docs/rules.md does not list: " + ", ".join(missing)


def test_docs_rule_table_is_generated() -> None:
    text = RULES_DOC.read_text(encoding="utf-8")
    assert generated_docs().rules_table(text) == text, (
        "docs/rules.md is stale: run scripts/generated_docs.py"
    )
