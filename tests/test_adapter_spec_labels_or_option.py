"""AdapterSpec.labels_or_option: an extract option that may stand in for the labels (GLiNER2's schema) must be one of
the adapter's extract options, on an adapter that reads labels."""

from __future__ import annotations

import pytest

from sie_worker.adapters.spec import AdapterSpec, Option

PROBLEM = "labels_or_option must be an extract option of an adapter that reads labels"


@pytest.mark.parametrize(
    ("labels", "options", "problem"),
    [
        (True, (Option("schema", "tasks"),), False),
        (True, (), True),  # names no option of the adapter
        (False, (Option("schema", "tasks"),), True),  # reads no labels to stand in for
    ],
)
def test_labels_or_option_names_an_extract_option_of_a_labels_adapter(
    labels: bool, options: tuple[Option, ...], problem: bool
) -> None:
    spec = AdapterSpec("x", tasks=("extract",), labels=labels, options=options, labels_or_option="schema")
    assert (PROBLEM in spec.problems()) == problem
