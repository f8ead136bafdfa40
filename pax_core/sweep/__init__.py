"""Hyper-parameter sweeps (``pax sweep``): search spaces (``space``), PyGlove's algorithms
(``algorithms``), the sweep directory (``record``), trial runners (``runners``), the loop that
ties them (``driver``), a trial's metrics (``metrics``) and the results (``results``)."""
