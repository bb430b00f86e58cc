"""Offline fits: imported datasets, the regressors' fit, the roofline efficiency table, CPU figures."""
