"""AMD platform: gfx architecture and CU count, the HIP graph segment, CDNA launch settings."""
