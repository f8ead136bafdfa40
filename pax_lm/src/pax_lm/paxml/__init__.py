"""paxml checkpoints: the ``paxml`` weight format (``pax import paxml``): where a paxml step's
arrays are and how praxis's names map onto Pax's LM."""
