#!/usr/bin/env python3
"""Recall and precision per engine on the holdout of the engines MinerU 4.0 drives.

``holdout_engines4/records.jsonl``: real error texts from public threads (each with its
``source``), collected and labelled (fatal / task_local) before any rule was written for
them, for the engines 4.0 drives: llama.cpp/ggml, MLX/Metal, lmdeploy TurboMind, SGLang's
scheduler, vLLM V1's engine core and Ascend CANN (device ``npu``). Same schema as
``tests/data/errors`` (see its README), kept apart from it: the tests and
``bench/accuracy/run.py`` never read this file.

Per engine family: fatal recall, fatal precision, and the records *decided* task-local
that are labelled fatal (a task-local decision is never verified, so it must stay 0).

    python bench/accuracy/holdout_engines4.py [--misses] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mineru_health.classifier import default_rules

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness import corpus

HERE = Path(__file__).resolve().parent / "holdout_engines4"


def family(record: corpus.Record) -> str:
    return "ascend-cann" if record.device == "npu" else record.engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", action="store_true", help="list every miss")
    parser.add_argument("--json", help="write the table here too")
    args = parser.parse_args()

    rules = default_rules()
    records = corpus.load(HERE)
    rows: dict[str, dict[str, int]] = {}
    misses: list[str] = []
    for record in records:
        verdict = rules.classify_frames(corpus.frames(record))
        row = rows.setdefault(
            family(record),
            {"fatal": 0, "task_local": 0, "tp": 0, "fp": 0, "fatal_decided_task_local": 0},
        )
        row[record.label] += 1
        if record.label == "fatal":
            row["tp"] += verdict.fatal
            if verdict.kind == "task_local" and verdict.matched:
                row["fatal_decided_task_local"] += 1
                misses.append(f"{record.id}: fatal decided task-local by {verdict.rule}")
            elif not verdict.fatal:
                misses.append(f"{record.id}: fatal -> {verdict.kind} ({verdict.rule or 'no rule'})")
        elif verdict.fatal:
            row["fp"] += 1
            misses.append(f"{record.id}: task_local -> fatal by {verdict.rule}")

    total = {key: sum(row[key] for row in rows.values()) for key in next(iter(rows.values()))}
    print(
        f"{'engine':<20} {'fatal':>5} {'task':>5}  {'recall':>13}  {'precision':>9}  "
        f"{'fatal decided task-local':>24}"
    )
    for name, row in [*sorted(rows.items()), ("all", total)]:
        recall = row["tp"] / row["fatal"] if row["fatal"] else 1.0
        flagged = row["tp"] + row["fp"]
        precision = row["tp"] / flagged if flagged else 1.0
        print(
            f"{name:<20} {row['fatal']:>5} {row['task_local']:>5}  "
            f"{recall:>5.2f} ({row['tp']:>2}/{row['fatal']:>2})  {precision:>9.2f}  "
            f"{row['fatal_decided_task_local']:>24}"
        )
    if args.misses:
        print("\n" + "\n".join(misses))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "misses": misses}, indent=2), encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
