"""Operating the daemon: systemd notify/journal, the control socket, Prometheus metrics."""
