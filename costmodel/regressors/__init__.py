"""Per-operator tree regressors (scikit-learn estimators over xgboost), their features and selection.

Implementations register themselves in :data:`REGISTRY` by name (duplicate names raise).
"""

from costmodel.regressors.base import REGISTRY, OperatorRegressor, register
from costmodel.regressors.boosted import BoostedRegressor
from costmodel.regressors.forest import ForestRegressor

__all__ = ["REGISTRY", "OperatorRegressor", "register", "ForestRegressor", "BoostedRegressor"]
