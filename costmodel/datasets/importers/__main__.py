"""``python -m costmodel.datasets.importers``: see :mod:`costmodel.datasets.importers.cli`."""

from costmodel.datasets.importers.cli import main

raise SystemExit(main())
