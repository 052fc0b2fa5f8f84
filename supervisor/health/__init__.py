"""GPU and host health: NVML monitor, host memory/disk/storage checks, the pre-launch gate."""
