"""Session-wide ordering: the secret-leak scan runs after every other test."""

from __future__ import annotations

import pytest

LAST = "test_no_secret_appears_in_anything_the_operators_left_behind"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.name == LAST)
