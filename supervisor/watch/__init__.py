"""Watching the job from inside: log lines -> metrics -> detectors, file tailing, heartbeats."""
