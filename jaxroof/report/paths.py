"""How the report names files: relative to the repository, never this machine's path."""

from __future__ import annotations

import os

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def in_repository(path: str) -> str:
  """`path` relative to the repository root, with forward slashes (e.g. `tests/data/x.csv`)."""
  return os.path.relpath(os.path.abspath(path), REPOSITORY).replace(os.sep, "/")
