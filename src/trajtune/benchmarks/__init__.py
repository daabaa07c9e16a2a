"""External benchmarks (BFCL, TextWorld): adapters from other people's tasks to trajtune's IR,
checkers and environments. Each benchmark's heavy or optional dependency is imported lazily."""
