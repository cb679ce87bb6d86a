"""AMD: HIP graph rules (HipPlatform, HipGraphSegment) and the CDNA launch table per gfx arch."""
