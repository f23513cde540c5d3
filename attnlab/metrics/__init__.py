"""Run measurements: performance summary, parity levels, environment, loggers (all pure but the loggers)."""
