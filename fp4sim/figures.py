"""``fp4sim.figures``: the report's figures under their first name (they live in
:mod:`fp4sim.report.figures`, part of the application layer's report package)."""

from fp4sim.report.figures import *  # noqa: F403
from fp4sim.report.figures import __all__  # noqa: F401
