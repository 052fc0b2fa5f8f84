"""Checkpoints: discovery, manifests, the readiness quicklist, selection and quarantine."""
