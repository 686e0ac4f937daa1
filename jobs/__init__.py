"""PySpark jobs, one room each (`jobs/<job>/`: `__main__.py` with `main(argv)`, the job, its parts);
`registry.py` lists them; `common/` is what they share. Imports nothing from infra/ or lakehouse/."""
