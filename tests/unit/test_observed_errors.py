"""What real engines raised and logged in our own runs, against the built-in rules.

``tests/data/errors/observed/*.jsonl`` has the corpus's record shape (``harness.corpus``),
split ``observed``: each text an engine really raised or logged in one of our integration
tests (``source`` names it), with its chain as the worker saw it. Kept apart from the
public-thread corpus (its splits and scores stay as measured); every record here must be
judged as labelled: a miss is a finding about a rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import corpus
from mineru_health.classifier import default_rules

OBSERVED = Path(__file__).resolve().parents[1] / "data" / "errors" / "observed"
REPO = Path(__file__).resolve().parents[2]

RECORDS = corpus.load(OBSERVED)


def test_observed_records_are_well_formed() -> None:
    assert RECORDS, OBSERVED
    ids = [r.id for r in RECORDS]
    assert len(ids) == len(set(ids))
    for record in RECORDS:
        assert record.split == "observed", record.id
        assert record.label in corpus.LABELS, record.id
        assert (REPO / record.source).is_file(), record.id
        assert record.reason and "\n" not in record.reason, record.id


@pytest.mark.parametrize("record", RECORDS, ids=[r.id for r in RECORDS])
def test_observed_record_is_judged_as_labelled(record: corpus.Record) -> None:
    verdict = default_rules().classify_frames(corpus.frames(record))
    if record.label == "ambiguous":
        assert verdict.ambiguous and not verdict.fatal, verdict
    else:
        assert verdict.fatal == (record.label == "fatal"), verdict
        assert verdict.matched, verdict
