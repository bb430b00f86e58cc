import pytest

from costmodel.core.paths import data_dir, validation_dir
from tests.helpers import require_shared


@pytest.fixture
def shared_data():
    return require_shared(data_dir(), "shared data")


@pytest.fixture
def shared_validation():
    return require_shared(validation_dir(), "shared/validation")


@pytest.fixture(autouse=True)
def user_config_dir(tmp_path_factory, monkeypatch):
    """Every test sees its own empty user config directory ($XDG_CONFIG_HOME, where `planner calibrate` saves):
    no test reads or writes the real ~/.config (subprocesses inherit the variable)."""
    path = tmp_path_factory.mktemp("xdg_config")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(path))
    return path
