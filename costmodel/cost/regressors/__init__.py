"""Per-operator tree regressors (scikit-learn estimators over xgboost), their features and selection.

Implementations register themselves in :data:`REGISTRY` by name (duplicate names raise). The names
below are imported lazily (PEP 562) so that the prediction path, which only needs
:mod:`costmodel.cost.regressors.runtime`, never imports scikit-learn or xgboost.
"""

import importlib

_LAZY = {"REGISTRY": "base", "OperatorRegressor": "base", "register": "base",
         "ForestRegressor": "forest", "BoostedRegressor": "boosted", "load_regressor": "loading"}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        if name == "REGISTRY":  # every implementation must be registered before the registry is used
            importlib.import_module(__name__ + ".forest")
            importlib.import_module(__name__ + ".boosted")
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
