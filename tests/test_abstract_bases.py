"""Abstract bases enforce their methods: every class in costmodel/ and planner/ that declares an
@abstractmethod is an ABC (instantiating it, or a subclass that misses a method, raises TypeError)."""

from __future__ import annotations

import ast
import importlib
import inspect
from abc import ABCMeta

import numpy as np
import pytest

from tests.helpers import python_sources


def _declares_abstract(cls: ast.ClassDef) -> bool:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                name = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
                if name == "abstractmethod":
                    return True
    return False


ABSTRACT_CLASSES = sorted(
    (rel[:-3].replace("/", "."), node.name)
    for rel, tree in python_sources(("costmodel", "planner"))
    for node in ast.walk(tree)
    if isinstance(node, ast.ClassDef) and _declares_abstract(node)
)


def test_the_scan_finds_the_known_bases():
    assert {("costmodel.cost.regressors.base", "OperatorRegressor"),
            ("costmodel.cost.base", "OperatorCostModel")} <= set(ABSTRACT_CLASSES)


@pytest.mark.parametrize("module,name", ABSTRACT_CLASSES, ids=lambda v: v)
def test_every_class_with_abstract_methods_enforces_them(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, ABCMeta), f"{module}.{name} declares @abstractmethod but is not an ABC"
    assert inspect.isabstract(cls) and cls.__abstractmethods__
    with pytest.raises(TypeError, match="abstract"):
        cls()


def test_regressor_missing_a_method_cannot_be_instantiated():
    from costmodel.cost.regressors.base import OperatorRegressor

    class NoInterval(OperatorRegressor):
        name = "test-no-interval"

        def _fit_z(self, X, z):
            self.booster_ = None

        def _predict_z(self, X):
            return np.zeros(len(X))

    with pytest.raises(TypeError, match="_interval_z"):
        NoInterval()

    class Complete(NoInterval):
        def _interval_z(self, X, q):
            return np.zeros(len(X)), np.zeros(len(X))

    assert Complete().name == "test-no-interval"


def test_cost_model_missing_a_method_cannot_be_instantiated():
    from costmodel.cost.base import CostResult, OperatorCostModel

    class NoPredict(OperatorCostModel):
        def supports(self, kind, hardware):
            return True

    with pytest.raises(TypeError, match="predict"):
        NoPredict()

    class Complete(NoPredict):
        def predict(self, ops, hardware):
            return CostResult(time_s=np.zeros(len(ops)))

    assert Complete().predict([], None).time_s.shape == (0,)
