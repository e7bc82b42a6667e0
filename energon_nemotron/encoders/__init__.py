"""Task encoders, registered by name (``registry.TASK_ENCODERS``)."""
