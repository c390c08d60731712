#!/usr/bin/env python3
"""Fatal recall and precision on the labelled corpus, per engine and per device family.

Reads tests/data/errors/*.jsonl (real errors from public issue threads; see
the README there), classifies every record with the built-in rules and with
the PR #5188 marker baseline (bench/recovery/pr5188_baseline.py: it looks at
the outermost exception only), and prints both side by side: first one line
per split (dev: used while writing rules; holdout and holdout2: collected
apart, see tests/data/errors/README.md), then per engine and per device
family within each split.

Ambiguous records (standalone out-of-memory and the like) are not counted in
recall/precision; the "amb" column shows how many the classifier flagged as
ambiguous (the baseline has no such verdict) and "amb!" how many came out
fatal (should be 0).

    PYTHONPATH=/tmp/classifier-site python bench/accuracy/run.py [--misses]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness import corpus

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "recovery"))
from pr5188_baseline import is_engine_fatal_parts


def baseline_judge(record: corpus.Record) -> tuple[bool, bool]:
    module, names, message = corpus.baseline_text(record)
    return is_engine_fatal_parts(module, names, message), False


def _cell(score: corpus.Score | None) -> str:
    if score is None or score.labelled == 0 and score.ambiguous_total == 0:
        return f"{'-':>23}"
    recall = f"{score.recall:.2f}" if score.tp + score.fn else "  - "
    precision = f"{score.precision:.2f}" if score.tp + score.fp else "  - "
    return f"{score.tp + score.fn:>3}f {score.fp + score.tn:>3}t R={recall} P={precision}"


def _splits(records: list[corpus.Record]) -> list[str]:
    """The splits in the order the corpus files first name them (dev first)."""
    seen: dict[str, None] = {}
    for record in sorted(records, key=lambda r: r.split != "dev"):
        seen.setdefault(record.split, None)
    return list(seen)


def _split_summary(records: list[corpus.Record]) -> None:
    native = corpus.native_judge()
    print("\n== per split ==")
    header = (
        f"{'split':<10} {'records':>7}  {'mineru_health':<23} {'amb':>5} {'amb!':>4}"
        f"   {'PR #5188 baseline':<23}"
    )
    print(header)
    print("-" * len(header))
    for split in [*_splits(records), "all"]:
        chosen = records if split == "all" else [r for r in records if r.split == split]
        ours = corpus.score(chosen, native)["all"]
        theirs = corpus.score(chosen, baseline_judge)["all"]
        count = ours.labelled + ours.ambiguous_total
        print(
            f"{split:<10} {count:>7}  {_cell(ours)} {ours.ambiguous_flagged:>2}/"
            f"{ours.ambiguous_total:<2} {ours.ambiguous_fatal:>4}   {_cell(theirs)}"
        )


def _table(title: str, records: list[corpus.Record], key: Callable[[corpus.Record], str]) -> None:
    native = corpus.native_judge()
    print(f"\n== {title} ==")
    header = (
        f"{'':<20} {'split':<8} {'records':>7}  {'mineru_health':<23} {'amb':>5} {'amb!':>4}"
        f"   {'PR #5188 baseline':<23}"
    )
    print(header)
    print("-" * len(header))
    for split in [*_splits(records), "all"]:
        chosen = records if split == "all" else [r for r in records if r.split == split]
        ours = corpus.score(chosen, native, key=key)
        theirs = corpus.score(chosen, baseline_judge, key=key)
        ours_total = corpus.score(chosen, native)["all"]
        theirs_total = corpus.score(chosen, baseline_judge)["all"]
        for name in sorted(ours):
            o, b = ours[name], theirs.get(name)
            count = o.labelled + o.ambiguous_total
            print(
                f"{name:<20} {split:<8} {count:>7}  {_cell(o)} "
                f"{o.ambiguous_flagged:>2}/{o.ambiguous_total:<2} {o.ambiguous_fatal:>4}   "
                f"{_cell(b)}"
            )
        count = ours_total.labelled + ours_total.ambiguous_total
        print(
            f"{'TOTAL':<20} {split:<8} {count:>7}  {_cell(ours_total)} "
            f"{ours_total.ambiguous_flagged:>2}/{ours_total.ambiguous_total:<2} "
            f"{ours_total.ambiguous_fatal:>4}   {_cell(theirs_total)}"
        )
        print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(ROOT / "tests" / "data" / "errors"))
    parser.add_argument("--misses", action="store_true", help="list the records judged wrong")
    args = parser.parse_args(argv)
    records = corpus.load(args.corpus)
    labels = {label: sum(r.label == label for r in records) for label in corpus.LABELS}
    sizes = ", ".join(
        f"{split} {sum(r.split == split for r in records)}" for split in _splits(records)
    )
    print(f"{len(records)} records ({', '.join(f'{k} {v}' for k, v in labels.items())}); {sizes}")
    print("cells: <fatal records>f <task-local records>t R=fatal recall P=fatal precision")
    _split_summary(records)
    _table("per engine family", records, key=lambda r: r.engine)
    _table("per device family", records, key=lambda r: r.device)
    if args.misses:
        for split in _splits(records):
            chosen = [r for r in records if r.split == split]
            for name, judge in (
                ("mineru_health", corpus.native_judge()),
                ("baseline", baseline_judge),
            ):
                misses = corpus.score(chosen, judge)["all"].misses
                print(f"{split} {name} misses ({len(misses)}):")
                for miss in misses:
                    print(f"  {miss}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
