#!/usr/bin/env python3
"""Compare mineru_health.classify(exc) with a pure-Python marker check.

The baseline re-implements, from its published description (see
docs/rules.md and the project's health-loop notes), the check MinerU PR #5188
proposed: one lower-cased string from the exception's module, class
hierarchy and message; a fixed list of plain markers; a list of
alphanumeric-only markers matched on that string with everything but letters
and digits removed; and "unrecoverable" together with "engine" or "vllm". It
looks at the one exception given, not its chain.

Both run in this process on the same exceptions, so the printed ratios (not
the absolute numbers) are what to compare across machines. Nothing here is a
pass/fail test.

A last table gives worst cases as ratios against the typical case (the mean
over the real mix, built-in rules) of the same run: a 64-deep chain of 1 MB
messages, an exception group of 10,000 members, a 10 MB message, and the
same against the largest rules file the loader accepts (2,000 rules at the
class-run limit, 1 MiB at most) loaded through load_rules().

    PYTHONPATH=/tmp/classifier-site python bench/classify/run.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import mineru_health

# ---- baseline: PR #5188's marker logic, shared with bench/recovery ------------
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recovery"))
from pr5188_baseline import is_engine_fatal as baseline_is_fatal

# ---- inputs ---------------------------------------------------------------------


def _exception_class(module: str, name: str, base: type[BaseException]) -> type[BaseException]:
    return type(name, (base,), {"__module__": module})


EngineDeadError = _exception_class("vllm.v1.engine.exceptions", "EngineDeadError", Exception)
EngineGenerateError = _exception_class(
    "vllm.v1.engine.exceptions", "EngineGenerateError", Exception
)
PdfiumError = _exception_class("pypdfium2._helpers.misc", "PdfiumError", RuntimeError)
AcceleratorError = _exception_class("torch", "AcceleratorError", RuntimeError)
DistBackendError = _exception_class("torch.distributed", "DistBackendError", RuntimeError)

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def _chained(outer: BaseException, *causes: BaseException) -> BaseException:
    current = outer
    for cause in causes:
        current.__cause__ = cause
        current = cause
    return outer


def _filler(size: int) -> str:
    line = (
        '  File "/opt/venv/lib/python3.11/site-packages/mineru/backend/vlm/'
        'vlm_analyze.py", line 212, in aio_doc_analyze -> page 17 block 3\n'
    )
    return (line * (size // len(line) + 1))[:size]


def real_mix() -> list[tuple[str, BaseException]]:
    return [
        ("vllm v1 EngineDeadError", EngineDeadError(ENGINE_DEAD_MESSAGE)),
        (
            "chain: wrapper > cause > EngineDead",
            _chained(
                RuntimeError("task 7 failed"),
                ValueError("page 3"),
                EngineDeadError(ENGINE_DEAD_MESSAGE),
            ),
        ),
        (
            "CUDA illegal memory access",
            AcceleratorError(
                "CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported."
            ),
        ),
        (
            "NCCL unhandled cuda error",
            DistBackendError(
                "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, "
                "NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA "
                "function failed."
            ),
        ),
        (
            "PdfiumError (task-local)",
            PdfiumError("Failed to load document (PDFium: Data format error)."),
        ),
        (
            "EngineGenerateError over EngineDead",
            _chained(EngineGenerateError(), EngineDeadError(ENGINE_DEAD_MESSAGE)),
        ),
        ("unmatched ValueError", ValueError("Operation on closed image")),
        ("Chinese message", RuntimeError("推理失败：文档第 3 页解析出错，请检查输入文件")),
    ]


def sized() -> list[tuple[str, BaseException]]:
    return [
        ("unmatched 1 KB", RuntimeError(_filler(1 << 10))),
        ("unmatched 100 KB", RuntimeError(_filler(100 << 10))),
        ("unmatched 10 MB", RuntimeError(_filler(10 << 20))),
    ]


def _near_miss(size: int, seed: int) -> str:
    pieces = [
        "CUDA error: ",
        "engine core ",
        "EngineCor ",
        "NCCL/",
        "[TM][",
        "errcode:50701 ",
        "HIP out of ",
        "aicore exceptio ",
        "推理失败 ",
        "Background loop ",
        "abababab ",
    ]
    rng = random.Random(seed)
    out: list[str] = []
    length = 0
    while length < size:
        piece = rng.choice(pieces)
        out.append(piece)
        length += len(piece)
    return "".join(out)[:size]


def worst_cases() -> list[tuple[str, BaseException]]:
    chain: BaseException = AcceleratorError(_near_miss(1 << 20, 0))
    for depth in range(1, 64):
        outer = RuntimeError(_near_miss(1 << 20, depth))
        outer.__cause__ = chain
        chain = outer
    members = [KeyError(_near_miss(1 << 10, i)) for i in range(10_000)]
    return [
        ("64-deep chain, 1 MB messages", chain),
        ("group of 10,000 members", ExceptionGroup("many", members)),
        ("one 10 MB message", RuntimeError(_near_miss(10 << 20, 7))),
    ]


def _rules_file(directory: str, alternatives: int) -> str:
    """kMaxRulesFileRules rules at the class-run limit, each with `alternatives` literals."""
    path = Path(directory) / f"rules-{alternatives}.txt"
    tail = "|".join(f"x{a}z" for a in range(alternatives))
    lines = [
        f"op.r{i} {'fatal' if i % 2 == 0 else 'heuristic'} operator "
        f"target={'message' if i % 2 == 0 else 'frame'} [a-z]{{1,6}}[0-9]q{i}(?:{tail})"
        for i in range(mineru_health.classifier._native.MAX_RULES_FILE_RULES)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def largest_rules_file(directory: str) -> tuple[str, int]:
    """The file with the most alternatives per rule that load_rules() still accepts."""

    def fits(alternatives: int) -> bool:
        path = _rules_file(directory, alternatives)
        if Path(path).stat().st_size > mineru_health.classifier._native.MAX_RULES_FILE_BYTES:
            return False
        try:
            mineru_health.load_rules(path)
        except mineru_health.RulesError:
            return False
        return True

    low, high = 1, 64
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return _rules_file(directory, low), low


# ---- timing ---------------------------------------------------------------------


def ns_per_call(fn: Callable[[], object], budget_s: float, min_calls: int) -> float:
    fn()  # warm-up
    calls = 0
    start = time.perf_counter_ns()
    deadline = start + int(budget_s * 1e9)
    now = start
    while calls < min_calls or now < deadline:
        fn()
        calls += 1
        now = time.perf_counter_ns()
    return (now - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short budget per row")
    args = parser.parse_args(argv)
    budget = 0.05 if args.quick else 0.4

    mineru_health.classify(ValueError("warm-up"))  # loads and compiles the rules
    print(f"python {sys.version.split()[0]}, mineru_health from {mineru_health.__file__}")
    print(f"budget {budget * 1000:.0f} ms per row; ratio = native / baseline (lower is better)\n")
    header = (
        f"{'input':<38} {'chars':>10} {'native ns':>12} {'baseline ns':>12} {'ratio':>7}  verdicts"
    )
    print(header)
    print("-" * len(header))

    mix = real_mix()
    rows = mix + sized()
    native_ns: dict[str, float] = {}
    base_ns: dict[str, float] = {}
    disagreements = []
    for name, exc in rows:
        chars = len(str(exc))
        min_calls = 3 if chars > (1 << 20) else 50
        verdict = mineru_health.classify(exc)
        base_fatal = baseline_is_fatal(exc)
        native_ns[name] = ns_per_call(lambda e=exc: mineru_health.classify(e), budget, min_calls)
        base_ns[name] = ns_per_call(lambda e=exc: baseline_is_fatal(e), budget, min_calls)
        native_word = f"{verdict.kind}:{verdict.rule or '-'}"
        base_word = "fatal" if base_fatal else "task_local"
        if verdict.fatal != base_fatal:
            disagreements.append(name)
        print(
            f"{name:<38} {chars:>10} {native_ns[name]:>12.0f} {base_ns[name]:>12.0f} "
            f"{native_ns[name] / base_ns[name]:>7.2f}  native={native_word} baseline={base_word}"
        )

    mix_native = sum(native_ns[name] for name, _ in mix)
    mix_base = sum(base_ns[name] for name, _ in mix)
    print(
        f"\nreal mix: native {mix_native / len(mix):.0f} ns, baseline {mix_base / len(mix):.0f} ns "
        f"per call; native/baseline = {mix_native / mix_base:.2f}"
    )
    for label, table in (("native", native_ns), ("baseline", base_ns)):
        print(
            f"growth {label:<8}: "
            f"100KB/1KB = {table['unmatched 100 KB'] / table['unmatched 1 KB']:.1f} "
            f"(size x100), 10MB/100KB = {table['unmatched 10 MB'] / table['unmatched 100 KB']:.1f} "
            "(size x102.4)"
        )
    print(
        "note: mineru_health.frames keeps the head and tail (1M chars) of longer messages, "
        "so the native 10MB row also measures that cut."
    )
    if disagreements:
        print(
            f"verdicts differ on: {', '.join(disagreements)} (expected: chains, CUDA/NCCL, "
            "task-local carve-outs are outside the baseline's markers)"
        )

    # ---- worst cases, as ratios against the typical case -----------------------
    typical = mix_native / len(mix)
    with tempfile.TemporaryDirectory() as directory:
        path, alternatives = largest_rules_file(directory)
        start = time.perf_counter()
        heavy = mineru_health.load_rules(path)
        load_ms = (time.perf_counter() - start) * 1000
        size_kib = Path(path).stat().st_size / 1024
    builtin = mineru_health.default_rules()
    print(
        f"\nworst cases (typical = real-mix mean, {typical:.0f} ns; largest rules file: "
        f"{len(heavy) - len(builtin)} rules with {alternatives} alternatives each, "
        f"{size_kib:.0f} KiB, loaded and compiled in {load_ms:.0f} ms)"
    )
    header = f"{'input':<32} {'rules':<10} {'ns/classify':>14} {'x typical':>10}  verdict"
    print(header)
    print("-" * len(header))
    worst = 0.0
    rows = [("vllm v1 EngineDeadError", mix[0][1]), *worst_cases()]
    for name, exc in rows:
        for label, rules in (("builtin", builtin), ("2000-file", heavy)):
            verdict = rules.classify(exc)
            ns = ns_per_call(lambda e=exc, r=rules: r.classify(e), budget, 3)
            worst = max(worst, ns / typical)
            print(
                f"{name:<32} {label:<10} {ns:>14.0f} {ns / typical:>10.1f}  "
                f"{verdict.kind}:{verdict.rule or '-'}"
            )
    print(
        f"worst/typical = {worst:.0f}x (frames are cut to 64 and messages to their head "
        "and tail before the native call)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
