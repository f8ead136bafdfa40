"""Models that ship with the core (modalities bring their own)."""
