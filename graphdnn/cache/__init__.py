"""The plan cache: keys, entry files, the in-memory and on-disk tiers, export and import, warmup."""
