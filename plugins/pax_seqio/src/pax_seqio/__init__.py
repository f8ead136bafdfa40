"""pax-seqio: SeqIO tasks and mixtures as Pax inputs (``pax_seqio.inputs.SeqIOInput``).

Nothing is imported here: TensorFlow and SeqIO load only when a run builds the input.
"""

__version__ = "0.1.0"
