"""Language modelling for Pax: the LM task, text inputs and tokenizers, decoding, and Pax's LM
experiment catalogue under Pax's names."""
