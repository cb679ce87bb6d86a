"""NVIDIA: CUDA graph rules (CudaPlatform, CudaGraphSegment) and the sm_90-tuned launch table."""
