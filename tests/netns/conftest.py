"""Network-namespace fixtures: skip, with the kernel's reason, where namespaces cannot be made."""

from __future__ import annotations

import pytest

from failsoft.runtime.netns import unsupported_reason


@pytest.fixture(scope="session")
def netns_ok() -> None:
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")
