"""The labelled corpus of real engine and document errors (tests/data/errors).

Each line of a ``*.jsonl`` file there is one record::

    {"id": "vllm-project/vllm#17103", "split": "dev" | "holdout",
     "engine": "vllm-v1", "device": "cuda",
     "label": "fatal" | "task_local" | "ambiguous",
     "source": "https://github.com/...", "reason": "...", "lang": "en" | "zh",
     "chain": [{"module": ..., "type": ..., "bases": [...], "message": ...,
                "raised_in": ..., "via": "cause" | "context" | "group_member",
                "depth": ...}, ...]}

``chain[0]`` is the exception the task failed with; each later link hangs
off the one before it (``via`` defaults to ``cause``; ``depth`` to the
link's index; group members give their own ``depth``). A link with an
empty ``type`` is text only (a log line or a pasted traceback, as the
thread shows it): it is parsed with :func:`frames_from_text`, as the CLI
and the router would.

Used by tests/unit/test_corpus.py and bench/accuracy/run.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mineru_health.classifier import Classification, Rules, default_rules
from mineru_health.frames import Frame, Via
from mineru_health.tracebacks import frames_from_text

LABELS = ("fatal", "task_local", "ambiguous")
_VIA = {"cause": Via.CAUSE, "context": Via.CONTEXT, "group_member": Via.GROUP}


@dataclass(frozen=True)
class Record:
    id: str
    split: str
    engine: str
    device: str
    label: str
    source: str
    reason: str
    lang: str
    chain: tuple[dict[str, Any], ...]


def load(directory: str | Path) -> list[Record]:
    records: list[Record] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                raw = json.loads(line)
                try:
                    records.append(
                        Record(
                            id=raw["id"],
                            split=raw["split"],
                            engine=raw["engine"],
                            device=raw["device"],
                            label=raw["label"],
                            source=raw["source"],
                            reason=raw["reason"],
                            lang=raw.get("lang", "en"),
                            chain=tuple(raw["chain"]),
                        )
                    )
                except KeyError as exc:
                    raise ValueError(f"{path}:{number}: missing field {exc}") from None
    return records


def frames(record: Record) -> list[Frame]:
    """The record's chain as classifier frames."""
    if len(record.chain) == 1 and not record.chain[0].get("type"):
        return frames_from_text(record.chain[0]["message"])
    out: list[Frame] = []
    for index, link in enumerate(record.chain):
        via = _VIA[link.get("via", "cause")] if index else Via.ROOT
        out.append(
            Frame(
                module=link.get("module", ""),
                type_name=link.get("type", ""),
                bases=tuple(link.get("bases", ())),
                message=link.get("message", ""),
                raised_in=link.get("raised_in", ""),
                via=via,
                depth=int(link.get("depth", index)),
            )
        )
    return out


def baseline_text(record: Record) -> tuple[str, list[str], str]:
    """What PR #5188's marker check sees: the outermost exception only."""
    link = record.chain[0]
    if not link.get("type"):
        return "", [], link.get("message", "")
    return link.get("module", ""), [link["type"], *link.get("bases", ())], link.get("message", "")


@dataclass
class Score:
    """Fatal-vs-rest confusion counts; ambiguous records are kept apart."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    ambiguous_total: int = 0
    ambiguous_flagged: int = 0  # verdict.ambiguous on an ambiguous record
    ambiguous_fatal: int = 0  # fatal verdict on an ambiguous record
    misses: list[str] = field(default_factory=list)

    def add(self, label: str, fatal: bool, ambiguous: bool, record_id: str) -> None:
        if label == "ambiguous":
            self.ambiguous_total += 1
            self.ambiguous_flagged += ambiguous
            self.ambiguous_fatal += fatal
            if not ambiguous:
                self.misses.append(
                    f"{record_id}: ambiguous -> {'fatal' if fatal else 'task_local'}"
                )
            return
        truth = label == "fatal"
        if truth and fatal:
            self.tp += 1
        elif truth:
            self.fn += 1
            self.misses.append(f"{record_id}: fatal -> not fatal")
        elif fatal:
            self.fp += 1
            self.misses.append(f"{record_id}: task_local -> fatal")
        else:
            self.tn += 1

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def labelled(self) -> int:
        return self.tp + self.fp + self.fn + self.tn


Judge = Callable[[Record], tuple[bool, bool]]  # -> (fatal, ambiguous)


def native_judge(rules: Rules | None = None) -> Judge:
    rules = rules or default_rules()

    def judge(record: Record) -> tuple[bool, bool]:
        verdict: Classification = rules.classify_frames(frames(record))
        return verdict.fatal, verdict.ambiguous

    return judge


def score(
    records: Iterable[Record], judge: Judge, key: Callable[[Record], str] | None = None
) -> dict[str, Score]:
    """Scores per ``key(record)`` (one bucket "all" without a key)."""
    out: dict[str, Score] = {}
    for record in records:
        fatal, ambiguous = judge(record)
        bucket = key(record) if key else "all"
        out.setdefault(bucket, Score()).add(record.label, fatal, ambiguous, record.id)
    return out


def split(records: Sequence[Record], name: str) -> Iterator[Record]:
    return (r for r in records if r.split == name)
