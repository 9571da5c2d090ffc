"""What the user sees in a terminal: help, progress, the short summary."""

OWN_LOGGERS = ("embedpipe", "service", "transforms", "pipeline")   # at INFO on the console; the rest at WARNING
