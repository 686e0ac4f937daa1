"""Near-real-time Apache Iceberg lakehouse: the CLI, the embedded local stack, the EMR rehearsal and
packaging. (The typed config the jobs and the CLI share is `jobs.config`.)"""
