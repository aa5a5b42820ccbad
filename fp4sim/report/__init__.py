"""The main job: ``python -m fp4sim reproduce`` recomputes the published numerical tables on the emulator.

The application layer's report package. It writes a Markdown report (``report.md``), every
number it printed as JSON (``results.json``) and the figures (``figures/*.png``) into a fresh
folder (``fp4sim-report-YYYYmmdd-HHMMSS/`` in the working directory, or ``--out DIR``);
``make demo`` runs it. Its modules, in import order (each imports only those above it):

* :mod:`~fp4sim.report.sizes` — :class:`Sizes` and :data:`QUICK`, :data:`DEFAULT`, :data:`FULL`;
* :mod:`~fp4sim.report.claims` — :data:`SOURCES` (the cited papers, repositories and
  specifications) and :data:`EXPECTED`, the published or expected values (the only numbers typed in by hand);
* :mod:`~fp4sim.report.tables` — :class:`Table`, :class:`Section` and value formatting;
* :mod:`~fp4sim.report.experiments` — the ``experiment_*`` functions: they only *call* the
  public emulators of :mod:`fp4sim.formats` and :mod:`fp4sim.attention`; the tests call the same
  functions at the ``--quick`` sizes, so the report and the tests have one source of truth;
* :mod:`~fp4sim.report.norm_study` — :func:`experiment_direct_p_norm`, the Direct-P norm study
  (why the affine route's cosine matches the article and its relative L2 error does not);
* :mod:`~fp4sim.report.figures` — one ``fig_*`` per figure, drawn from the experiments, and the
  ``figures`` command;
* :mod:`~fp4sim.report.sections` — one ``section_*(sizes) -> Section`` per topic, :data:`SECTIONS`;
* :mod:`~fp4sim.report.provenance` — :func:`provenance`: git revision, versions, platform, flags;
* :mod:`~fp4sim.report.document` — :func:`reproduce`, the Markdown and the headline table;
* :mod:`~fp4sim.report.cli` — the ``reproduce`` command.

>>> from fp4sim import report
>>> r = report.experiment_normalization_examples()  # the two-key example
>>> [round(float(x), 6) for x in r["represented"]], round(r["outputs"][(0.0, 6.0)]["MISMATCHED"], 6)
([1.0, 0.333333], 1.428571)
>>> list(report.SECTIONS)[:3]
['formats', 'code_match', 'scale_rules']
"""

from fp4sim.report import claims as _claims
from fp4sim.report import document as _document
from fp4sim.report import experiments as _experiments
from fp4sim.report import norm_study as _norm_study
from fp4sim.report import sections as _sections
from fp4sim.report import sizes as _sizes
from fp4sim.report import tables as _tables
from fp4sim.report.claims import *  # noqa: F403
from fp4sim.report.document import *  # noqa: F403
from fp4sim.report.experiments import *  # noqa: F403
from fp4sim.report.norm_study import *  # noqa: F403
from fp4sim.report.sections import *  # noqa: F403
from fp4sim.report.sizes import *  # noqa: F403
from fp4sim.report.tables import *  # noqa: F403

__all__ = [
    *_sizes.__all__,
    *_claims.__all__,
    *_tables.__all__,
    *_experiments.__all__,
    *_norm_study.__all__,
    *_sections.__all__,
    *_document.__all__,
]
