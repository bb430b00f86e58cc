"""Markdown reports with PNG plots for `planner search/compare/size/validate --report PATH.md`.

Writers: :func:`planner.reports.search_report.write_search_report`, ``write_compare_report``,
``write_size_report`` and :func:`planner.reports.validate_report.write_validation_report`. Every
file is written atomically (:mod:`planner.reports.markdown`); plots use matplotlib's Agg renderer and
matplotlib is imported only when a plot is drawn (:mod:`planner.reports.plots`).
"""

from planner.reports.markdown import ReportFiles, atomic_write_bytes, atomic_write_text, command_line

__all__ = ["ReportFiles", "atomic_write_bytes", "atomic_write_text", "command_line"]
