"""Command-line entry points: ``tabletopic`` (serve, ...), ``kafka-topics``, ``kafka-configs``."""
