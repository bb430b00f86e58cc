"""Importers: the public measurements in ``shared/data`` -> the :class:`Dataset` schema.

One module per source, each registering its importer (:mod:`.registry`) when imported; this package imports
them in registry order (:mod:`.aiconfigurator`, :mod:`.estimate_train_time`, :mod:`.vidur`, :mod:`.llmcompass`).
Shared pieces: :mod:`.table` (the CSV reader with its header check and SHA-256 cache), :mod:`.builder`
(rows per (kind, gpu) with their source records, ``merge``, row roles), :mod:`.collect` (``import_all``,
``save_all``) and :mod:`.cli` (``python -m costmodel.fitting.datasets.importers``).

``import_all()`` returns one :class:`Dataset` per (operator kind, GPU) with forward and backward rows
together. Every mapping (source column -> operator kind, features, units) is documented in
``costmodel/fitting/datasets/README.md``; the broken subsets named in the PROVENANCE.md files are dropped by
the filters of :mod:`costmodel.fitting.datasets.filters` and counted in the sidecar.

Sidecar (``Dataset.meta``):

* ``sources``: one entry per (source file, source column): ``importer``, ``path`` (relative to the
  data folder), ``sha256``, ``column``, ``direction``, ``dtype``, ``role``, ``rows_in``, ``rows_kept``,
  ``filters`` ([{name, dropped}]), ``fingerprint`` and ``dataset_rows`` ([start, stop) of its rows in
  this dataset, in this order). A source whose rows were all dropped, of a (kind, gpu) left without a
  dataset, is recorded, with its ``kind``, on the datasets read from the same file (else on the importer's
  other datasets of that GPU).
* ``fingerprint``: device strings and importers behind the dataset (details per source).
* ``notes``: caveats, skipped files and why.
* ``duplicate_shape_rows``: rows whose (direction, dtype, features) also occur in another row.

Roles: ``train`` (fit on it), ``spot_check`` (an independent hold-out: LLMCompass), ``composite_bwd``
(estimate-train-time GEMM backward = dgrad + wgrad of the forward shape, for checks only).

Run ``python -m costmodel.fitting.datasets.importers --out DIR`` to write every dataset as CSV + sidecar.
"""

# The per-source modules register their importer when imported: this order is the registry order, the order in
# which import_all concatenates datasets of one (kind, gpu). Keep it (datasets and fitted models depend on it).
# isort: off
from costmodel.fitting.datasets.importers.aiconfigurator import AIC_GPU, AIC_NCCL_OPS, import_aiconfigurator
from costmodel.fitting.datasets.importers.estimate_train_time import (ETT_SYSTEMS, ett_partition_vocab,
                                                              import_estimate_train_time)
from costmodel.fitting.datasets.importers.vidur import VIDUR_COMPUTE_GPU, VIDUR_NETWORK_GPU, import_vidur
from costmodel.fitting.datasets.importers.llmcompass import import_llmcompass
# isort: on
from costmodel.fitting.datasets.importers.builder import (
                                                              ROLES,
                                                              Builder,
                                                              duplicate_shape_rows,
                                                              merge,
                                                              role_mask,
                                                              source_index,
)
from costmodel.fitting.datasets.importers.collect import import_all, save_all
from costmodel.fitting.datasets.importers.registry import Importer, importers, register
from costmodel.fitting.datasets.importers.table import Table, read_table, sha256

__all__ = ["AIC_GPU", "AIC_NCCL_OPS", "ETT_SYSTEMS", "ROLES", "VIDUR_COMPUTE_GPU", "VIDUR_NETWORK_GPU", "Builder",
           "Importer", "Table", "duplicate_shape_rows", "ett_partition_vocab", "import_aiconfigurator", "import_all",
           "import_estimate_train_time", "import_llmcompass", "import_vidur", "importers", "merge", "read_table",
           "register", "role_mask", "save_all", "sha256", "source_index"]
