"""A tiny plugin that exercises every registration a modality makes."""
