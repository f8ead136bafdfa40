"""Hyper-parameter sweeps (``pax sweep``): search spaces (``space``), the algorithms
(``algorithms``: PyGlove's, and OSS Vizier's in ``vizier``), early stopping (``stopping``), the
sweep directory (``record``), trial runners (``runners``), the loop that ties them (``driver``),
a trial's metrics (``metrics``) and the results (``results``)."""
