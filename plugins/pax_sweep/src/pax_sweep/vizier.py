"""``--algorithm vizier``: OSS Vizier's default designer (its Gaussian-process bandit) as a
PyGlove DNA generator, run in the sweep's own process (no Vizier server).

Vizier's PyGlove converter turns the sweep's DNA spec into a Vizier problem and Vizier's
suggestions back into DNA; the designer is told every completed trial (PyGlove's ``recover``
replays an earlier invocation's through ``_feedback``). Installed by
``pip install 'pax-core[vizier]'``.
"""

from __future__ import annotations

import pyglove as pg

from pax_core import UsageError

_REWARD = "reward"


def _vizier():
    """Vizier's modules, or one line saying how to install them."""
    try:
        from vizier import algorithms, pyglove
        from vizier._src.algorithms.designers import gp_bandit
        from vizier.service import pyvizier
    except Exception as e:  # an ImportError, or a Vizier that does not run on this jax
        raise UsageError(f"--algorithm vizier needs OSS Vizier with its JAX designers: pip "
                         f"install 'pax-core[vizier]' ({type(e).__name__}: {e})") from None
    return algorithms, pyglove, gp_bandit, pyvizier


@pg.members([("seed", pg.typing.Int(default=0), "Seed of the designer's random numbers.")])
class VizierDesigner(pg.geno.DNAGenerator):
    """Vizier's GP bandit behind PyGlove's propose / feedback / recover."""

    def _setup(self) -> None:
        self._algorithms, pyglove, gp_bandit, self._vz = _vizier()
        import jax

        # The designer's GP runs on JAX in the sweep's process: on its CPU, leaving every
        # accelerator to the trials.
        jax.config.update("jax_platforms", "cpu")
        self._converter = pyglove.VizierConverter.from_dna_spec(self.dna_spec)
        self._designer = gp_bandit.VizierGPBandit(self._converter.problem,
                                                  rng=jax.random.PRNGKey(self.seed))
        self._pending: dict[str, object] = {}  # DNA as text -> its Vizier trial

    def _propose(self) -> pg.DNA:
        [suggestion] = self._designer.suggest(1)
        trial = suggestion.to_trial(self.num_proposals + 1)
        dna = self._converter.to_dna(trial)
        self._pending[str(dna)] = trial
        return dna

    def _feedback(self, dna: pg.DNA, reward: float) -> None:
        trial = self._pending.pop(str(dna), None) or self._trial(dna)
        trial.complete(self._vz.Measurement({_REWARD: reward}))
        # The trials still training, so that the designer does not propose them again.
        self._designer.update(self._algorithms.CompletedTrials([trial]),
                              self._algorithms.ActiveTrials(list(self._pending.values())))

    def _trial(self, dna: pg.DNA) -> object:
        """A Vizier trial of an earlier invocation's choice."""
        dna.use_spec(self.dna_spec)
        return self._converter.to_trial(dna, fallback="raise_error")
