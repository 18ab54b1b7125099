"""Artifacts of a search, written from the final FP32 set only (DESIGN §8)."""
