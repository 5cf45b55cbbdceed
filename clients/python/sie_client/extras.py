"""The error for a feature whose optional dependency is missing: it names the sie-client extra that installs it.

sie-client is installed from a checkout (it is not on PyPI), so the hint is the checkout's install line; once the
client itself is installed, its extra installs alone (sie-contract is already there)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def missing_extra(feature: str, extra: str, module: str) -> ModuleNotFoundError:
    """`feature` needs `module`, which the client's `extra` extra installs."""
    return ModuleNotFoundError(
        f"{feature} needs {module}, which the client's `{extra}` extra installs: "
        f"pip install './clients/python[{extra}]' (from a checkout of SIE)",
        name=module,
    )


@contextmanager
def needs_extra(feature: str, extra: str, module: str) -> Iterator[None]:
    """Imports made inside raise missing_extra when `module` (the top-level package the extra installs) is what is
    not installed."""
    try:
        yield
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] != module:
            raise
        raise missing_extra(feature, extra, module) from None
