"""Supervised fine-tuning on conversations: JSONL conversations (``conversations``), chat
templates that mark the assistant's tokens (``templates``), the input that trains on those
tokens only (``chat_input``), the one that streams conversations prepared with ``pax data
prepare --chat`` (``prepared``), and the experiment mixin (``dataset``)."""
