"""NVIDIA platform: device facts, the CUDA graph segment, and Triton launch settings."""
