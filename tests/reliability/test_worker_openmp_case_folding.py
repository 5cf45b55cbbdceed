"""OMP_WAIT_POLICY and GOMP_SPINCOUNT are compared as libgomp compares them: ASCII letters in any case, byte by byte
(strncasecmp). A value whose letters only Unicode case folding makes "passive" or a "k" suffix (PASSIVE with U+017F,
the long s; active with U+0131, the dotless i; 10 and U+212A, the Kelvin sign) is one libgomp ignores, its idle threads
then spinning:
the worker refuses it at start as it refuses a typo. Before, its case-insensitive match folded Unicode and took them.
Each value is checked against the libgomp torch ships (outside attack on the start-up check)."""

from __future__ import annotations

import pytest

from reliability.test_worker_openmp_unreadable_policy import libgomp_takes, worker_takes

pytestmark = pytest.mark.process

FOLDED = [
    ("OMP_WAIT_POLICY", "PA\u017f\u017fIVE"),  # LATIN SMALL LETTER LONG S folds to s
    ("OMP_WAIT_POLICY", "act\u0131ve"),  # LATIN SMALL LETTER DOTLESS I folds to i
    ("GOMP_SPINCOUNT", "10\u212a"),  # KELVIN SIGN folds to k
    ("GOMP_SPINCOUNT", "\u0131nfinite"),  # dotless i again, in INFINITE
]
# Their ASCII spellings, which both read.
ASCII = [("OMP_WAIT_POLICY", "PASSIVE"), ("OMP_WAIT_POLICY", "active"), ("GOMP_SPINCOUNT", "10K")]


@pytest.mark.parametrize(("name", "value"), FOLDED + ASCII, ids=ascii)
def test_the_worker_takes_a_wait_value_exactly_when_libgomp_does(name: str, value: str) -> None:
    assert worker_takes(name, value) == libgomp_takes(name, value) == ((name, value) in ASCII)
