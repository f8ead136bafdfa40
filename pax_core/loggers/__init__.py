"""Metric sinks. Each is a registered component; ``base`` holds the interface they share."""

from pax_core.loggers.base import Logger, LoggerGroup

__all__ = ["Logger", "LoggerGroup"]
