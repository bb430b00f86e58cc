"""Whole-iteration predictions against measured training runs (``planner validate``).

- :mod:`planner.validation.runs`: the run-file schema (published_runs.csv header), parsing its free text,
  mapping a row to ModelSpec / ParallelPlan / hardware with every assumption recorded.
- :mod:`planner.validation.sources`: rules of the published sources, read from the shipped
  ``search_spaces/validation/published_sources.toml`` and matched on a row's ``source`` text.
- :mod:`planner.validation.compare`: a prediction in the row's measured metric and its relative error.
- :mod:`planner.validation.stats`: MAPE, median, p90 and bias per group.
- :mod:`planner.validation.report`: :func:`~planner.validation.report.validate` builds the ValidationReport.

This package file imports nothing, so importing one module (as planner.calibrate does with runs and
compare) does not load planner.prediction.
"""
