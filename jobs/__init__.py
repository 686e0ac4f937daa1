"""PySpark jobs: pure DataFrame transforms, thin I/O, and a `main(argv)` per job."""
