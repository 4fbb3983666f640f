"""durations: `1h30m` ⇄ 5400 seconds, for configuration files and log lines."""

from durations.format import format_duration
from durations.humanize import approximate
from durations.parse import DurationError, parse_duration
from durations.units import UNITS, unit_seconds

__all__ = ["UNITS", "DurationError", "approximate", "format_duration", "parse_duration", "unit_seconds"]
__version__ = "2.0.3"
