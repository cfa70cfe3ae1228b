"""Training and test data: the npz format, sources, grain pipelines, statistics, the simulated
distribution."""
