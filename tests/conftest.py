import pytest

from costmodel.core.paths import data_dir, validation_dir
from tests.helpers import require_shared


@pytest.fixture
def shared_data():
    return require_shared(data_dir(), "shared data")


@pytest.fixture
def shared_validation():
    return require_shared(validation_dir(), "shared/validation")
