"""Operator times -> one iteration: composition, pipeline timeline, layer split, FLOPs, goodput."""
