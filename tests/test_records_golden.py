"""Every `reproduce` run's request records are bit for bit what they were when tests/data/reproduce_records.json was
written (support/golden.py): a rewrite of the engine or the policies that changes one arrival, admission, token time
or count fails here."""

import json

import pytest
from support.golden import GOLDEN, digest, key, quick_run, specs

from fairserve.reproduce.runs import run

pytestmark = pytest.mark.unit

EXPECTED = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("spec", specs(), ids=lambda s: key(s, quick=False))
def test_records_are_unchanged(spec):
    assert digest(quick_run(spec).records) == EXPECTED[key(spec, quick=True)]
    assert digest(run(spec).records) == EXPECTED[key(spec, quick=False)]


def test_the_golden_file_covers_every_run_and_a_change_shows():
    assert len(EXPECTED) == 2 * len(specs())
    records = quick_run(specs()[0]).records
    moved = [*records[:-1], type(records[-1])(**{**records[-1].to_dict(), "output_tokens": -1})]
    assert digest(moved) != digest(records)
