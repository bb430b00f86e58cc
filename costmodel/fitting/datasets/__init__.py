"""Operator timing datasets: one schema for measured samples, whatever produced them."""

from costmodel.fitting.datasets.schema import SCHEMA_VERSION, Dataset, load_dataset, save_dataset

__all__ = ["SCHEMA_VERSION", "Dataset", "load_dataset", "save_dataset"]
