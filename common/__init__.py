"""Launch and distribution helpers shared by the entry points."""
