"""``python -m costmodel.fitting.datasets.importers``: see :mod:`costmodel.fitting.datasets.importers.cli`."""

from costmodel.fitting.datasets.importers.cli import main

raise SystemExit(main())
