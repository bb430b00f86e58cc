"""Operator graph: (model, plan) -> per-stage operators, with records, builders and conventions."""
