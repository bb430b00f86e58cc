"""Prediction-time evaluation of shipped tree ensembles with numpy only.

`import xgboost` pulls in scikit-learn (xgboost/compat.py) and costs ~1.5 s; loading a booster
adds more. The predict path (``planner predict`` / ``search``) needs neither: an xgboost JSON
model is a list of binary trees (arrays ``left_children``, ``right_children``, ``split_indices``,
``split_conditions``, ``default_left``; a leaf's value is its ``split_conditions`` entry), and the
prediction is ``base_score + sum of the leaf values`` per output (xgboost doc "Introduction to
Model IO", JSON schema ``doc/model.schema``). This module reads exactly that, evaluates all trees
at once with numpy, and is checked against ``xgboost.Booster.inplace_predict`` in
tests/test_runtime_trees.py. Files are parsed as JSON data: nothing is executed.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.cost.regressors.io import atomic_write_bytes, check_model_file, sha256_hex, sidecar_path

RUNTIME_FORMAT = 2
"""Version of the compact ``.trees.bin`` layout written by :func:`write_runtime`."""
_ARRAYS = ("left", "right", "feat", "thr", "default_left", "leaf", "tree_group", "base")


class TreeTable:
    """All trees of one xgboost gbtree model as padded numpy arrays."""

    @classmethod
    def from_arrays(cls, arrays: dict) -> "TreeTable":
        self = cls.__new__(cls)
        for name in _ARRAYS:
            setattr(self, name, arrays[name])
        self.left, self.right, self.feat = (a.astype(np.intp) for a in (self.left, self.right, self.feat))
        self.default_left, self.leaf = self.default_left.astype(bool), self.leaf.astype(bool)
        self.tree_group = self.tree_group.astype(np.intp)
        self.num_target = len(self.base)
        self._finish(int(arrays["max_steps"][0]))
        return self

    def arrays(self) -> dict:
        """Compact arrays that rebuild this table exactly (see :func:`write_runtime`)."""
        return {"left": self.left.astype(np.int32), "right": self.right.astype(np.int32),
                "feat": self.feat.astype(np.int32), "thr": self.thr, "default_left": self.default_left.astype(np.uint8),
                "leaf": self.leaf.astype(np.uint8), "tree_group": self.tree_group.astype(np.int32),
                "base": self.base.astype(np.float64), "max_steps": np.array([self.max_steps], dtype=np.int64)}

    def _finish(self, max_steps: int) -> None:
        self.value = np.where(self.leaf, self.thr, 0.0).astype(np.float64)
        self.max_steps = max_steps
        self.num_features = int(self.feat.max()) + 1

    def __init__(self, model: dict, source: str = "model"):
        try:
            learner = model["learner"]
            gb = learner["gradient_booster"]
            if gb["name"] != "gbtree":
                raise PlannerError(f"{source}: booster {gb['name']!r} is not a tree model")
            trees = gb["model"]["trees"]
            info = np.asarray(gb["model"]["tree_info"], dtype=np.intp)
            base = learner["learner_model_param"]["base_score"]
            base = np.asarray(json.loads(base) if base.startswith("[") else [float(base)], dtype=np.float64)
            self.num_target = max(int(learner["learner_model_param"].get("num_target", "1")), len(base))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise PlannerError(f"{source} is not an xgboost JSON tree model ({exc.__class__.__name__}); "
                               "re-run `planner fit`") from None
        if not trees:
            raise PlannerError(f"{source} holds no trees; re-run `planner fit`")
        if self.num_target > max(len(trees), len(base)):  # each output has a base score or a tree
            raise PlannerError(f"{source} says num_target={self.num_target} for {len(trees)} trees; "
                               "re-run `planner fit`")
        self.base = np.broadcast_to(base, (self.num_target,)).astype(np.float64)
        width = max(len(t["left_children"]) for t in trees)
        n = len(trees)
        self.left = np.zeros((n, width), dtype=np.intp)
        self.right = np.zeros((n, width), dtype=np.intp)
        self.feat = np.zeros((n, width), dtype=np.intp)
        self.thr = np.zeros((n, width), dtype=np.float32)
        self.default_left = np.zeros((n, width), dtype=bool)
        self.leaf = np.ones((n, width), dtype=bool)
        depth = 0
        for i, t in enumerate(trees):
            k = len(t["left_children"])
            left = np.asarray(t["left_children"], dtype=np.intp)
            self.left[i, :k] = np.where(left < 0, np.arange(k), left)
            right = np.asarray(t["right_children"], dtype=np.intp)
            self.right[i, :k] = np.where(right < 0, np.arange(k), right)
            self.feat[i, :k] = t["split_indices"]
            self.thr[i, :k] = t["split_conditions"]
            self.default_left[i, :k] = np.asarray(t["default_left"], dtype=bool)
            self.leaf[i, :k] = left < 0
            depth = max(depth, int(t.get("tree_param", {}).get("num_nodes", k)).bit_length())
        self.tree_group = info if len(info) == n else np.zeros(n, dtype=np.intp)
        self._finish(max(1, depth) * 2 + 2)  # a bound on the path length; the loop stops earlier

    def leaf_values(self, X: np.ndarray) -> np.ndarray:
        """[n, T] value of the leaf each row reaches in each tree."""
        X = np.asarray(X, dtype=np.float32)
        n, T = X.shape[0], self.left.shape[0]
        ti = np.arange(T)[None, :]
        rows = np.arange(n)[:, None]
        node = np.zeros((n, T), dtype=np.intp)
        for _ in range(self.max_steps):
            at_leaf = self.leaf[ti, node]
            if at_leaf.all():
                break
            x = X[rows, self.feat[ti, node]]
            go_left = np.where(np.isnan(x), self.default_left[ti, node], x < self.thr[ti, node])
            nxt = np.where(go_left, self.left[ti, node], self.right[ti, node])
            node = np.where(at_leaf, node, nxt)
        return self.value[ti, node]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """[n, num_target] margin predictions (base_score + sum of leaves per output)."""
        vals = self.leaf_values(X)
        out = np.empty((vals.shape[0], self.num_target))
        for g in range(self.num_target):
            out[:, g] = self.base[g] + vals[:, self.tree_group == g].sum(axis=1)
        return out


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise PlannerError(f"model file {path} is missing; re-run `planner fit`") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise PlannerError(f"model file {path} is corrupted or truncated ({exc.__class__.__name__}); "
                           "re-run `planner fit`") from None


def cache_dir() -> Path:
    """Where compact tree tables are cached: ``$PLANNER_CACHE_DIR`` or ``~/.cache/planner``."""
    env = os.environ.get("PLANNER_CACHE_DIR")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "planner"
    return base / "trees"


def _encode(tables: dict) -> bytes:
    """Compact numpy form of tree tables: one JSON header line, then .npy-encoded arrays."""
    header: dict[str, Any] = {"format": RUNTIME_FORMAT, "tables": {}}
    buf = io.BytesIO()
    for role in sorted(tables):  # the header is written with sorted keys: arrays follow that order
        arrays = tables[role].arrays()
        header["tables"][role] = list(arrays)
        for a in arrays.values():
            np.lib.format.write_array(buf, np.ascontiguousarray(a), allow_pickle=False)
    return (json.dumps(header, sort_keys=True) + "\n").encode() + buf.getvalue()


def _decode(path: Path) -> dict | None:
    """Tables from a cache file, or None when it is absent or unreadable (read with allow_pickle=False)."""
    try:
        with open(path, "rb") as fh:
            header = json.loads(fh.readline())
            if header.get("format") != RUNTIME_FORMAT:
                return None
            return {role: TreeTable.from_arrays({n: np.lib.format.read_array(fh, allow_pickle=False) for n in names})
                    for role, names in header["tables"].items()}
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def load_tables(sources: dict, expected_sha256: dict | None = None) -> dict:
    """TreeTables for {role: xgboost JSON path}, through a cache keyed by the files' SHA-256.

    The xgboost JSON is the artifact; the cache only saves parsing it again (about 10x faster to
    load). A missing, corrupt or unwritable cache falls back to parsing the JSON.
    """
    raws = {}
    for role, p in sources.items():
        try:
            raws[role] = p.read_bytes()
        except FileNotFoundError:
            raise PlannerError(f"model file {p} is missing; re-run `planner fit`") from None
    digests = {role: check_model_file(p, raws[role], expected_sha256) for role, p in sources.items()}
    key = sha256_hex(b"".join(digests[r].encode() + r.encode() for r in sorted(raws)))
    cached = cache_dir() / f"{key}.bin"
    tables = _decode(cached)
    if tables is not None and set(tables) == set(sources):
        return tables
    tables = {}
    for role, p in sources.items():
        try:
            doc = json.loads(raws[role])
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise PlannerError(f"model file {p} is corrupted or truncated ({exc.__class__.__name__}); "
                               "re-run `planner fit`") from None
        tables[role] = TreeTable(doc, str(p))
    try:
        atomic_write_bytes(cached, _encode(tables))
    except OSError:
        pass  # a read-only home only costs speed
    return tables


class RuntimeRegressor:
    """A shipped :class:`~costmodel.cost.regressors.base.OperatorRegressor` artifact, evaluated with numpy.

    Same outputs as the fitted estimator: time = exp(z) x ref, where ref is the roofline column
    (target 'ratio') or 1 (target 'time'); intervals from the forest's per-tree spread or the
    boosted model's quantile booster, widened to bracket the point prediction.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        side_p = sidecar_path(path)
        side = _load_json(side_p)
        if not isinstance(side, dict):
            raise PlannerError(f"model sidecar {side_p} must be a JSON object; re-run `planner fit`")
        try:
            self.estimator = side["estimator"]
            params = side["params"]
            self.target = params.get("target", "ratio")
            self.ref_col = int(params.get("ref_col", -1))
            self.q = tuple(params.get("interval_q", (0.1, 0.9)))
            self.n_features_in_ = int(side["n_features_in"])
            self.meta_ = side
            extra = side.get("extra_files", {})
            sources = {"main": path}
            if "interval" in extra:
                sources["interval"] = path.with_name(extra["interval"])
            hashes = side.get("file_sha256")
            tables = load_tables(sources, hashes if isinstance(hashes, dict) else None)
            self.trees = tables["main"]
            self.interval = tables.get("interval")
        except PlannerError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise PlannerError(f"model sidecar {side_p} is incomplete ({exc.__class__.__name__}: {exc}); "
                               "re-run `planner fit`") from None
        if self.estimator not in ("forest", "boosted"):
            raise PlannerError(f"model sidecar {side_p} names unknown estimator {self.estimator!r}")
        if self.trees.num_features > self.n_features_in_:
            raise PlannerError(f"model file {path} uses feature {self.trees.num_features - 1} but its sidecar says "
                               f"{self.n_features_in_} features; re-run `planner fit`")

    def _ref(self, X: np.ndarray) -> np.ndarray:
        return np.ones(len(X)) if self.target == "time" else X[:, self.ref_col]

    def predict_with_interval(self, X: np.ndarray, q: tuple = (0.1, 0.9)):
        """(point, low, high) seconds for feature rows ``X``."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[-1]} features, this model expects {self.n_features_in_}")
        ref = self._ref(X)
        vals = self.trees.leaf_values(X)
        mid = self.trees.base[0] + vals.sum(axis=1)
        if self.estimator == "forest":
            T = vals.shape[1]
            members = (mid - vals.sum(axis=1))[:, None] + vals * T
            lo, hi = np.quantile(members, q, axis=1)
        elif self.interval is not None:
            qs = self.interval.predict(X)
            lo, hi = qs[:, 0], qs[:, -1]
        else:
            lo = hi = mid
        return np.exp(mid) * ref, np.exp(np.minimum(lo, mid)) * ref, np.exp(np.maximum(hi, mid)) * ref
