"""The test suite. A package, so its modules import one another as `tests.<module>` and the labs in
`bench` as `bench.<module>`: pytest puts the repo root, the package's parent, on sys.path."""
