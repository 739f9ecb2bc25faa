"""Core: what every layer uses and that imports nothing else of the package.

``errors`` (the error types), ``config`` (parameter files read, merged and built into typed, frozen
config sections), ``io`` (atomic writes, checksums, canonical JSON, parquet with metadata),
``provenance`` (source names and real/stand-in labels), ``figindex`` (the index of saved figures).
"""
