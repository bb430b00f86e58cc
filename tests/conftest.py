import pytest

from costmodel.core.paths import data_dir, validation_dir


@pytest.fixture
def shared_data():
    d = data_dir()
    if d is None:
        pytest.skip("shared data not found: set PLANNER_DATA_DIR to ../shared/data to run this test")
    return d


@pytest.fixture
def shared_validation():
    d = validation_dir()
    if d is None:
        pytest.skip("shared/validation not found: set PLANNER_DATA_DIR to ../shared/data to run this test")
    return d
