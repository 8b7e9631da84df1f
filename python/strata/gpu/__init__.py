"""strata on NVIDIA GPUs: Triton kernels (placeholder, filled below)."""
